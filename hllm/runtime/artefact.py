"""Find what a path holds and open the matching engine (torch-free).

A deployable artefact is one of:

* a checkpoint directory (``hllm.json``) → PyTorch reference engine (imports torch on activate);
* an export directory (``export.json`` + ``model.onnx`` + ``tokenizer.json``) or its ``.onnx`` file
  → ONNX Runtime engine;
* a TensorRT plan (``*.plan``) with its sidecar ``*.plan.json`` → TensorRT engine.

Each carries what the runtime needs besides the graph: the prompt spec, the tokenizer and K.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from hllm.errors import EngineError
from hllm.formats.prompt import PromptSpec

EXPORT_SIDECAR = "export.json"


@dataclass
class Artifact:
    """A resolved deployable artefact.

    Attributes:
        kind: ``checkpoint``, ``onnx`` or ``tensorrt``.
        path: checkpoint directory, ``.onnx`` file or ``.plan`` file.
        prompt: the prompt spec the model was trained/exported with.
        tokenizer_path: its ``tokenizer.json``.
        num_positions: K.
        meta: the sidecar / manifest dict.
    """

    kind: str
    path: Path
    prompt: PromptSpec
    tokenizer_path: Path
    num_positions: int
    meta: dict = field(default_factory=dict)


def _read_json(p: Path) -> dict:
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise EngineError(f"cannot read {p}: {e}") from None


def resolve(path: str | os.PathLike) -> Artifact:
    """Resolve ``path`` to an :class:`Artifact`.

    Raises: EngineError (path missing, no sidecar, unknown kind); CheckpointError for a bad checkpoint.
    """
    p = Path(path)
    if not p.exists():
        raise EngineError(f"not found: {p}")
    if p.is_dir() and (p / "hllm.json").is_file():
        from hllm.formats.checkpoint import load_manifest

        m = load_manifest(p)
        return Artifact("checkpoint", m.root, m.prompt, m.tokenizer_path, m.num_positions, {"manifest": str(m.root)})
    if p.is_dir() and (p / EXPORT_SIDECAR).is_file():
        meta = _read_json(p / EXPORT_SIDECAR)
        p = p / meta.get("onnx", "model.onnx")
    if p.suffix == ".onnx":
        side = p.parent / EXPORT_SIDECAR
        if not side.is_file():
            raise EngineError(f"{p} has no {EXPORT_SIDECAR} beside it (export with `hllm export`)")
        meta = _read_json(side)
        return _from_meta("onnx", p, meta, side.parent)
    if p.suffix in (".plan", ".engine"):
        side = p.with_name(p.name + ".json")
        if not side.is_file():
            raise EngineError(f"{p} has no sidecar {side.name} (build with `hllm build`)")
        meta = _read_json(side)
        return _from_meta("tensorrt", p, meta, side.parent)
    raise EngineError(f"{p}: not a checkpoint directory, export directory, .onnx or .plan file")


def _from_meta(kind: str, path: Path, meta: dict, base: Path) -> Artifact:
    try:
        prompt = PromptSpec.from_dict(meta["prompt"])
        tok = base / meta.get("tokenizer", "tokenizer.json")
        k = int(meta["num_positions"])
    except KeyError as e:
        raise EngineError(f"sidecar of {path} lacks {e.args[0]!r}") from None
    return Artifact(kind, path, prompt, tok, k, meta)


def open_engine(artifact: Artifact, **options):
    """Construct (not activate) the engine for ``artifact``.

    Options are passed to the engine: ``threads`` (torch), ``providers`` / ``intra_op_threads``
    (onnxruntime), ``device`` (tensorrt).
    """
    if artifact.kind == "checkpoint":
        from hllm.engines.reference import TorchEngine

        return TorchEngine(artifact.path, threads=options.get("threads"))
    if artifact.kind == "onnx":
        from hllm.engines.ort import OnnxRuntimeEngine

        return OnnxRuntimeEngine(
            artifact.path,
            artifact.num_positions,
            providers=options.get("providers"),
            intra_op_threads=options.get("threads") or 0,
        )
    if artifact.kind == "tensorrt":
        from hllm.engines.tensorrt import TensorRTEngine

        return TensorRTEngine(artifact.path, artifact.num_positions, sidecar=artifact.meta)
    raise EngineError(f"unknown artefact kind {artifact.kind!r}")
