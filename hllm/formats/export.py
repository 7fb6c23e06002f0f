"""The export sidecar ``export.json``: its one reader and one writer (torch-free).

``hllm export`` writes an export directory::

    EXPORT/
      model.onnx            the hLLM graph (+ model.onnx.data when over 2 GB)
      tokenizer.json        the backbone's tokenizer
      export.json           this sidecar

Keys (``format: hllm-onnx``): ``onnx`` and ``tokenizer`` (file names inside the directory),
``num_positions`` (K), ``prompt`` (:class:`hllm.formats.prompt.PromptSpec`), ``precision``
(:class:`hllm.formats.precision.Precision`; absent = fp32), ``flavour`` (``standard``: only ``ai.onnx``
ops, for TensorRT and any runtime; ``ort-cpu``: ONNX Runtime contrib ops, fused for CPU; absent =
standard), ``opset``, ``head``, ``backbone`` (model_type, hidden_size, num_layers, vocab_size),
``tokenizer_sha256``, ``pad_id``, ``source_checkpoint`` {path, sha256}, ``onnx_sha256``, ``onnx_bytes``,
``validation``, ``inputs`` / ``outputs`` (:func:`hllm.formats.graph.graph_io_specs`), ``versions``; a
quantized export adds ``quantization``, an FP16 export ``fp16`` and ``fp32_islands``.

:func:`read_export` validates what the runtime relies on and names the problem (EngineError): a file
name that escapes the directory, a missing file, a K or prompt of the wrong type, an unknown precision
or flavour. :func:`write_export` validates the same before writing atomically.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from hllm.errors import EngineError, HllmError
from hllm.files import atomic_write_json, contained_path
from hllm.formats.precision import Precision
from hllm.formats.prompt import PromptSpec

SIDECAR = "export.json"
FORMAT = "hllm-onnx"
#: Graph flavours: ``standard`` = only ai.onnx ops (portable: TensorRT, OpenVINO, any ONNX runtime);
#: ``ort-cpu`` = ONNX Runtime contrib ops (fused attention / norms) for the CPU runtime.
FLAVOURS = ("standard", "ort-cpu")


@dataclass
class ExportMeta:
    """A parsed, validated ``export.json``.

    Attributes:
        root: the export directory. onnx_path / tokenizer_path: resolved files inside it.
        num_positions: K. prompt: the prompt spec. precision: :class:`Precision`. flavour: one of
        :data:`FLAVOURS`. raw: the whole dict as stored (provenance, validation, versions ...).
    """

    root: Path
    onnx_path: Path
    tokenizer_path: Path
    num_positions: int
    prompt: PromptSpec
    precision: Precision
    flavour: str
    raw: dict = field(default_factory=dict)


def parse_export(d: object, root: str | os.PathLike, where: str = SIDECAR) -> ExportMeta:
    """Validate a sidecar dict for the export directory ``root``.

    Raises: EngineError naming the field (and ``where``) for every problem listed in the module doc.
    """
    root = Path(root)
    if not isinstance(d, dict):
        raise EngineError(f"{where}: expected a JSON object, got {type(d).__name__}")
    if d.get("format", FORMAT) != FORMAT:
        raise EngineError(f"{where}: format is {d.get('format')!r}, expected {FORMAT!r}")
    onnx = contained_path(root, d.get("onnx", "model.onnx"), f"{where}: onnx", EngineError)
    tok = contained_path(root, d.get("tokenizer", "tokenizer.json"), f"{where}: tokenizer", EngineError)
    k = d.get("num_positions")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise EngineError(f"{where}: num_positions must be a positive integer, got {k!r}")
    if not isinstance(d.get("prompt"), dict):
        raise EngineError(f"{where}: prompt must be an object, got {type(d.get('prompt')).__name__}")
    try:
        prompt = PromptSpec.from_dict(d["prompt"])
        precision = Precision.parse(d.get("precision"), f"{where}: precision")
    except HllmError as e:
        raise EngineError(f"{where}: {e}") from None
    flavour = d.get("flavour", "standard")
    if flavour not in FLAVOURS:
        raise EngineError(f"{where}: flavour {flavour!r} is not one of {FLAVOURS}")
    return ExportMeta(root, onnx, tok, k, prompt, precision, flavour, d)


def read_export(path: str | os.PathLike) -> ExportMeta:
    """Read the sidecar of an export directory (or of the ``.onnx`` file inside it).

    Raises: EngineError when the sidecar is missing, unreadable, malformed (see :func:`parse_export`)
        or names files that do not exist.
    """
    p = Path(path)
    root = p if p.is_dir() else p.parent
    side = root / SIDECAR
    if not side.is_file():
        raise EngineError(f"{root} has no {SIDECAR} (export with `hllm export`)")
    try:
        d = json.loads(side.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise EngineError(f"cannot read {side}: {e}") from None
    meta = parse_export(d, root, str(side))
    for what, f in (("onnx", meta.onnx_path), ("tokenizer", meta.tokenizer_path)):
        if not f.is_file():
            raise EngineError(f"{side}: {what} file {f.name} is missing")
    if not p.is_dir() and p.resolve() != meta.onnx_path:
        raise EngineError(f"{p} is not the graph {side} describes ({meta.onnx_path.name})")
    return meta


def write_export(root: str | os.PathLike, d: dict) -> Path:
    """Validate ``d`` (:func:`parse_export`) and write it atomically as ``root/export.json``.

    ``format`` is set to ``hllm-onnx``. Returns the path. Raises: EngineError (malformed dict).
    """
    d = {"format": FORMAT, **d}
    parse_export(d, root)
    return atomic_write_json(Path(root) / SIDECAR, d)
