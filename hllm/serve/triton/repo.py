"""``hllm triton-repo``: write an NVIDIA Triton Inference Server model repository for an hLLM engine.

Layout (``tritonserver --model-repository OUT/models``)::

    OUT/models/hllm_engine/config.pbtxt      ONNX Runtime (``onnxruntime_onnx``) or TensorRT (``tensorrt_plan``)
    OUT/models/hllm_engine/1/model.onnx|model.plan
    OUT/models/hllm_decode/config.pbtxt      Python backend, CPU instances
    OUT/models/hllm_decode/1/model.py        imports hllm.serve.triton.decode_model (the runtime's LAPJV decode)
    OUT/models/hllm_ranker/config.pbtxt      ensemble: engine → decode
    OUT/models/hllm_ranker/1/                (empty; ensembles need a version directory)
    OUT/client/{tokenizer.json, hllm_client.json, rank.py}   client side: prompt building + request

Design: an **ensemble** (engine step → Python decode step) rather than a BLS Python model in front of
the engine, so Triton's dynamic batcher and instance groups schedule the engine model on its own
(GPU instances, ``max_queue_delay_microseconds``) while the decode runs on CPU instances, and no Python
sits on the engine's path. The Python backend does not batch for a model: ``execute`` gets a list of
requests and decodes each (LAPJV is per slate). Prompt building (tokenization) stays on the client with
the runtime's :class:`PromptBuilder` and the exported tokenizer/prompt spec. Triton's dynamic batcher
merges only requests with equal shapes, so the client pads ``N`` to ``K`` and ``S`` to a multiple of
``seq_bucket`` (right padding does not change the scores; see :mod:`hllm.runtime.prompt`).

Config fields follow ``model_config.proto``
(https://github.com/triton-inference-server/common/blob/main/protobuf/model_config.proto).
"""

from __future__ import annotations

import json
import os
import shutil

from hllm.formats.graph import OUTPUT_NAME, graph_io_specs
from hllm.errors import EngineError
from hllm.files import atomic_dir
from hllm.runtime.artefact import resolve
from hllm.serve.triton.decode_model import ITEM_MASK, RANKING, SCORES

ENGINE, DECODE, ENSEMBLE = "hllm_engine", "hllm_decode", "hllm_ranker"
TRITON_TYPES = {"int64": "TYPE_INT64", "int32": "TYPE_INT32", "bool": "TYPE_BOOL", "float32": "TYPE_FP32", "float16": "TYPE_FP16", "bfloat16": "TYPE_BF16"}

MODEL_PY = '''"""Triton Python-backend model of hllm's LAPJV decode.

Needs the hllm package (numpy + lap; no torch) in the Python backend's environment:
    pip install "hllm[runtime]"    # or: pip install lap numpy && pip install --no-deps hllm
The decode is hllm.runtime.decode (imported via hllm.serve.triton.decode_model), not a copy.
"""

from hllm.serve.triton.decode_model import TritonPythonModel  # noqa: F401
'''

RANK_PY = '''"""Send slates to Triton's hllm_ranker ensemble and print the rankings (KServe v2 HTTP/JSON).

    python rank.py --url http://127.0.0.1:8000 --slates slates.jsonl.gz --limit 2
"""

import sys

from hllm.serve.triton.client import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], client_dir=Path(__file__).resolve().parent))
'''


def _dims(shape) -> list[int]:
    """Triton dims of a graph tensor: the batch dim dropped, dynamic dims → -1."""
    return [d if isinstance(d, int) else -1 for d in list(shape)[1:]]


def _tensor(name: str, dtype: str, dims: list[int]) -> str:
    if dtype not in TRITON_TYPES:
        raise EngineError(f"tensor {name!r}: dtype {dtype!r} has no Triton type")
    return f'  {{\n    name: "{name}"\n    data_type: {TRITON_TYPES[dtype]}\n    dims: [ {", ".join(map(str, dims))} ]\n  }}'


def _io(key: str, tensors: list[tuple[str, str, list[int]]]) -> str:
    return f"{key} [\n" + ",\n".join(_tensor(*t) for t in tensors) + "\n]\n"


def graph_io(artifact) -> tuple[list[dict], list[dict]]:
    """The engine graph's inputs and outputs as ``{name, dtype, shape}`` dicts (from its sidecar)."""
    ins, outs = graph_io_specs(artifact.num_positions)
    inputs = artifact.meta.get("inputs") or [t.to_dict() for t in ins]
    outputs = artifact.meta.get("outputs") or [t.to_dict() for t in outs]
    return inputs, outputs


def engine_config(artifact, max_batch_size: int, max_queue_delay_us: int, instances: int, kind: str) -> str:
    """``config.pbtxt`` of the engine model (ONNX Runtime or TensorRT backend, dynamic batching)."""
    inputs, outputs = graph_io(artifact)
    if artifact.kind == "onnx":
        head = f'name: "{ENGINE}"\nplatform: "onnxruntime_onnx"\nbackend: "onnxruntime"\ndefault_model_filename: "model.onnx"\n'
    elif artifact.kind == "tensorrt":
        head = f'name: "{ENGINE}"\nplatform: "tensorrt_plan"\ndefault_model_filename: "model.plan"\n'
    else:
        raise EngineError(f"Triton serves an ONNX export or a TensorRT plan, not a {artifact.kind} (run `hllm export` first)")
    return (
        head
        + f"max_batch_size: {max_batch_size}\n"
        + _io("input", [(t["name"], t["dtype"], _dims(t["shape"])) for t in inputs])
        + _io("output", [(t["name"], t["dtype"], _dims(t["shape"])) for t in outputs])
        + f"dynamic_batching {{\n  max_queue_delay_microseconds: {max_queue_delay_us}\n}}\n"
        + f"instance_group [\n  {{\n    count: {instances}\n    kind: KIND_{kind.upper()}\n  }}\n]\n"
    )


def decode_config(k: int, max_batch_size: int, instances: int) -> str:
    """``config.pbtxt`` of the Python-backend decode model (CPU instances)."""
    return (
        f'name: "{DECODE}"\nbackend: "python"\nmax_batch_size: {max_batch_size}\n'
        + _io("input", [(SCORES, "float32", [-1, k]), (ITEM_MASK, "bool", [-1])])
        + _io("output", [(RANKING, "int64", [-1])])
        + "dynamic_batching {\n}\n"
        + f"instance_group [\n  {{\n    count: {instances}\n    kind: KIND_CPU\n  }}\n]\n"
    )


def ensemble_config(artifact, max_batch_size: int) -> str:
    """``config.pbtxt`` of the ensemble: graph inputs → engine → (scores, item_mask) → decode → ranking."""
    inputs, outputs = graph_io(artifact)
    k = artifact.num_positions

    def maps(kind: str, names) -> str:
        return "".join(f'      {kind} {{\n        key: "{n}"\n        value: "{n}"\n      }}\n' for n in names)

    return (
        f'name: "{ENSEMBLE}"\nplatform: "ensemble"\nmax_batch_size: {max_batch_size}\n'
        + _io("input", [(t["name"], t["dtype"], _dims(t["shape"])) for t in inputs])
        + _io("output", [(RANKING, "int64", [-1]), (OUTPUT_NAME, "float32", [-1, k])])
        + "ensemble_scheduling {\n  step [\n"
        + f'    {{\n      model_name: "{ENGINE}"\n      model_version: -1\n'
        + maps("input_map", [t["name"] for t in inputs])
        + maps("output_map", [t["name"] for t in outputs])
        + "    },\n"
        + f'    {{\n      model_name: "{DECODE}"\n      model_version: -1\n'
        + maps("input_map", [SCORES, ITEM_MASK])
        + maps("output_map", [RANKING])
        + "    }\n  ]\n}\n"
    )


def write_repository(
    model: str | os.PathLike,
    out_dir: str | os.PathLike,
    max_batch_size: int = 8,
    max_queue_delay_us: int = 2000,
    instances: int = 1,
    kind: str = "gpu",
    decode_instances: int = 2,
    seq_bucket: int = 64,
    overwrite: bool = False,
) -> dict:
    """Write the Triton repository for ``model`` (export dir / ``.onnx`` / ``.plan``) to ``out_dir`` atomically.

    Returns ``{"models": [...], "num_positions": K, "engine": kind}``.
    Raises: EngineError (not an ONNX export or plan, bad option, unknown dtype), FileExistsError.
    """
    if kind.lower() not in ("gpu", "cpu"):
        raise EngineError(f"instance kind must be gpu or cpu, got {kind!r}")
    if max_batch_size < 1 or instances < 1 or decode_instances < 1 or max_queue_delay_us < 0 or seq_bucket < 1:
        raise EngineError("max_batch_size, instances, decode_instances, seq_bucket must be ≥ 1 and max_queue_delay_us ≥ 0")
    art = resolve(model)
    if art.kind not in ("onnx", "tensorrt"):
        raise EngineError(f"{model}: Triton serves an ONNX export or a TensorRT plan, not a {art.kind} (run `hllm export` first)")
    k = art.num_positions
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        models = tmp / "models"
        eng = models / ENGINE / "1"
        eng.mkdir(parents=True)
        target = "model.onnx" if art.kind == "onnx" else "model.plan"
        shutil.copy2(art.path, eng / target)
        for extra in art.path.parent.glob(art.path.name + ".data"):  # ONNX external weights, if any
            shutil.copy2(extra, eng / extra.name)
        (models / ENGINE / "config.pbtxt").write_text(engine_config(art, max_batch_size, max_queue_delay_us, instances, kind))
        dec = models / DECODE / "1"
        dec.mkdir(parents=True)
        (dec / "model.py").write_text(MODEL_PY)
        (models / DECODE / "config.pbtxt").write_text(decode_config(k, max_batch_size, decode_instances))
        (models / ENSEMBLE / "1").mkdir(parents=True)
        (models / ENSEMBLE / "config.pbtxt").write_text(ensemble_config(art, max_batch_size))
        client = tmp / "client"
        client.mkdir()
        shutil.copy2(art.tokenizer_path, client / "tokenizer.json")
        (client / "hllm_client.json").write_text(json.dumps({
            "model": ENSEMBLE,
            "num_positions": k,
            "max_batch_size": max_batch_size,
            "seq_bucket": seq_bucket,
            "prompt": art.prompt.to_dict(),
            "source": str(art.path),
        }, indent=2) + "\n")
        (client / "rank.py").write_text(RANK_PY)
    return {"models": [ENGINE, DECODE, ENSEMBLE], "num_positions": k, "engine": art.kind}
