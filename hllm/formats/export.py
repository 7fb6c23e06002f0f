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
quantized export adds ``quantization``, an FP16 export ``fp16`` and ``fp32_islands``; an export that runs
on OpenVINO (``hllm calibrate``: NNCF INT8, ``--backend auto``) ``engine: openvino`` and ``openvino``
{ir, inference_precision} (:class:`OpenVinoSettings`; ``engine`` absent = onnxruntime).

:func:`read_export` validates what the runtime relies on and names the problem (EngineError): a file
name that escapes the directory, a missing file, a K or prompt of the wrong type, an unknown precision,
flavour or engine, and every optional key that anything reads of the wrong JSON type (``_FIELDS``; graph
``inputs`` / ``outputs`` by :func:`hllm.formats.graph.check_tensor_specs`); null counts as absent,
unknown keys are kept. :func:`write_export` validates the same before writing atomically.

Is it the model that was exported? :func:`read_export` also checks, when the sidecar
records them (older sidecars without the keys still load):

* the tokenizer: ``tokenizer_sha256`` must match the file, and its ids must fit the embedding
  (``backbone.vocab_size``) — :func:`hllm.formats.tokenizer.check_tokenizer`; always (a hash of a
  few MB);
* the graph's size: ``onnx_bytes`` = the bytes of ``model.onnx`` plus its external data
  (``model.onnx*``, :func:`graph_bytes`); always (one ``stat`` per file);
* the graph's hash: ``onnx_sha256`` of ``model.onnx`` only with ``verify_hash=True`` (reads the whole
  graph: seconds on a large model) — ``Ranker.from_path(path, verify_hash=True)``,
  :func:`hllm.runtime.artefact.resolve`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from hllm import __version__
from hllm.errors import EngineError, HllmError
from hllm.files import atomic_write_json
from hllm.reading import contained_path, read_json, sha256_file
from hllm.formats.graph import check_tensor_specs, describe_value, input_names
from hllm.formats.precision import Precision
from hllm.formats.prompt import PromptSpec
from hllm.formats.tokenizer import check_tokenizer
from hllm.formats.vocabulary import OPENVINO_HINTS, SIDECAR_ENGINES

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
    engine: str = "onnxruntime"
    openvino: "OpenVinoSettings | None" = None


@dataclass(frozen=True)
class OpenVinoSettings:
    """The sidecar's ``openvino`` object (written by ``hllm calibrate``: an NNCF INT8 IR, or the OpenVINO
    recipes of ``--backend auto``).

    Attributes: ir: file name of the OpenVINO IR (``.xml``) inside the export, or None (run ``model.onnx``);
        inference_precision: the CPU plugin's ``INFERENCE_PRECISION_HINT`` (``f32`` / ``bf16``;
        :func:`hllm.engines.openvino.check_inference_precision` normalises aliases), or None (f32);
        dynamic_quantization_group_size: the CPU plugin's ``DYNAMIC_QUANTIZATION_GROUP_SIZE`` (activations
        of INT8-weight MatMuls quantized per group of that many values; 0 = off), or None (the plugin's default).
    """

    ir: str | None = None
    inference_precision: str | None = None
    dynamic_quantization_group_size: int | None = None


#: OpenVINO inference precisions (and the aliases the engine accepts) a sidecar may record.
OPENVINO_PRECISIONS = OPENVINO_HINTS


@dataclass(frozen=True)
class ShapeCheck:
    """The export's self-validation at one shape: PyTorch vs ONNX Runtime, float32 (``validation.shapes[]``).

    Attributes: shape: its name (``B1_N1``, ``B3_unequal``, ``B2_NK``, ``real_slates``); batch, seq, items:
        B, S, N; max_abs_diff: max |scores_ORT − scores_torch| over the batch; nonfinite: NaN/Inf count in
        the ONNX Runtime scores.
    """

    shape: str
    batch: int
    seq: int
    items: int
    max_abs_diff: float
    nonfinite: int

    def to_dict(self) -> dict:
        """The sidecar's ``validation.shapes[]`` entry."""
        return {"shape": self.shape, "batch": self.batch, "seq": self.seq, "items": self.items,
                "max_abs_diff": self.max_abs_diff, "nonfinite": self.nonfinite}


@dataclass(frozen=True)
class Fp16Check:
    """An FP16 export's record (sidecar ``fp16``): the float32 islands kept, the converter's counts, the
    CPU emulation written beside it, and the emulation's ranking check (``validation``: ``min_kendall_tau``,
    ``kendall_tau_mean``, ``nonfinite``, ``max_abs_diff``, ``rows``)."""

    islands: tuple[str, ...]
    conversion: dict
    cpu_emulation: dict
    validation: dict

    def to_dict(self) -> dict:
        return {"islands": list(self.islands), "conversion": self.conversion, "cpu_emulation": self.cpu_emulation,
                "validation": self.validation}


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
    if not isinstance(flavour, str) or flavour not in FLAVOURS:
        raise EngineError(f"{where}: flavour {flavour!r} is not one of {FLAVOURS}")
    _check_types(d, where)
    engine = d.get("engine")
    if engine is not None and (not isinstance(engine, str) or engine not in SIDECAR_ENGINES):
        raise EngineError(f"{where}: engine must be one of {SIDECAR_ENGINES} (absent = onnxruntime), got {describe_value(engine)}")
    ov = d.get("openvino")
    settings = None if ov is None else OpenVinoSettings(ov.get("ir"), ov.get("inference_precision"),
                                                        ov.get("dynamic_quantization_group_size"))
    return ExportMeta(root, onnx, tok, k, prompt, precision, flavour, d, engine or "onnxruntime", settings)


def _positive_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _text(v: object) -> bool:
    return isinstance(v, str) and bool(v)


def _strings(v: object) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


#: Every optional key something reads (the runtime, ``info``, ``calibrate``, ``bench``, ``debug``, the
#: TensorRT builder): ``key → (test, what it must be)``, checked when present and not null. Nested keys
#: are ``a.b``; a nested key is checked only when its parent is an object.
_FIELDS = {
    "tokenizer_sha256": (_text, "a non-empty string"),
    "onnx_sha256": (_text, "a non-empty string"),
    "onnx_bytes": (_positive_int, "a positive integer"),
    "opset": (_positive_int, "a positive integer"),
    "pad_id": (_count, "a non-negative integer"),
    "head": (_text, "a non-empty string"),
    "backbone": (lambda v: isinstance(v, dict), "an object"),
    "backbone.model_type": (_text, "a non-empty string"),
    "backbone.hidden_size": (_positive_int, "a positive integer"),
    "backbone.num_layers": (_positive_int, "a positive integer"),
    "backbone.vocab_size": (_positive_int, "a positive integer"),
    "source_checkpoint": (lambda v: isinstance(v, dict), "an object"),
    "source_checkpoint.path": (lambda v: isinstance(v, str), "a string"),
    "source_checkpoint.sha256": (lambda v: isinstance(v, str), "a string"),
    "validation": (lambda v: isinstance(v, dict), "an object"),
    "validation.shapes": (lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v), "a list of objects"),
    "quantization": (lambda v: isinstance(v, dict), "an object"),
    "fusion": (lambda v: isinstance(v, dict), "an object"),
    "versions": (lambda v: isinstance(v, dict), "an object"),
    "fp32_islands": (_strings, "a list of strings"),
    "fp16": (lambda v: isinstance(v, dict), "an object"),
    "fp16.islands": (_strings, "a list of strings"),
    "fp16.cpu_emulation": (lambda v: isinstance(v, dict), "an object"),
    "fp16.cpu_emulation.onnx": (_text, "a file name (a non-empty string)"),
    "openvino": (lambda v: isinstance(v, dict), "an object"),
    "openvino.ir": (_text, "a file name (a non-empty string)"),
    "openvino.inference_precision": (lambda v: isinstance(v, str) and v.lower() in OPENVINO_PRECISIONS,
                                     f"one of {OPENVINO_PRECISIONS[:2]}"),
    "openvino.dynamic_quantization_group_size": (_count, "a non-negative integer"),
}


def _check_types(d: dict, where: str) -> None:
    """Check every key of :data:`_FIELDS` present in ``d`` and the ``inputs`` / ``outputs`` lists
    (:func:`hllm.formats.graph.check_tensor_specs`). Raises: EngineError naming the key and what it held."""
    for key, (ok, what) in _FIELDS.items():
        *parents, leaf = key.split(".")
        node: object = d
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or node.get(leaf) is None:
            continue
        v = node[leaf]
        if not ok(v):
            raise EngineError(f"{where}: {key} must be {what}, got {describe_value(v)}")
    for key in ("inputs", "outputs"):
        if d.get(key) is not None:
            check_tensor_specs(d[key], where, key, EngineError)


def graph_bytes(onnx_path: str | os.PathLike) -> int:
    """Bytes of the graph file and its external data (every regular ``<name>*`` beside it, e.g.
    ``model.onnx`` + ``model.onnx.data``): what ``onnx_bytes`` records."""
    p = Path(onnx_path)
    return sum(q.stat().st_size for q in p.parent.glob(f"{p.name}*") if q.is_file())


def verify_export(meta: ExportMeta, verify_hash: bool = False) -> None:
    """The checks of the module doc: tokenizer fingerprint and vocabulary, graph size, and with
    ``verify_hash`` the graph's sha256. Keys the sidecar lacks are not checked.

    Raises: EngineError naming the file, the recorded and the found value.
    """
    d, where = meta.raw, str(meta.root / SIDECAR)
    check_tokenizer(meta.tokenizer_path, (d.get("backbone") or {}).get("vocab_size"), d.get("tokenizer_sha256"),
                    where, EngineError)
    want = d.get("onnx_bytes")
    if want is not None:
        got = graph_bytes(meta.onnx_path)
        if got != want:
            raise EngineError(f"{where}: {meta.onnx_path.name} (with its external data) is {got} bytes but the export "
                              f"recorded {want}: the graph was replaced or truncated; re-export it")
    if verify_hash and d.get("onnx_sha256") is not None:
        got = sha256_file(meta.onnx_path)
        if got != d["onnx_sha256"]:
            raise EngineError(f"{where}: {meta.onnx_path.name} has sha256 {got[:12]}…, the export recorded "
                              f"{d['onnx_sha256'][:12]}…: the graph was replaced; re-export it")


def read_export(path: str | os.PathLike, verify_hash: bool = False) -> ExportMeta:
    """Read the sidecar of an export directory (or of the ``.onnx`` file inside it) and check that the
    files are the ones exported (:func:`verify_export`; the graph's sha256 only with ``verify_hash``).
    ``path`` may also be the CPU-emulated twin an FP16 export records (``fp16.cpu_emulation.onnx``):
    the returned meta then has ``onnx_path`` = the twin (what CPU parity runs).

    Raises: EngineError when the sidecar is missing, unreadable, malformed (see :func:`parse_export`),
        names files that do not exist, or a file is not the one recorded.
    """
    p = Path(path)
    root = p if p.is_dir() else p.parent
    side = root / SIDECAR
    if not side.is_file():
        raise EngineError(f"{root} has no {SIDECAR} (export with `hllm export`)")
    meta = parse_export(read_json(side, EngineError), root, str(side))
    for what, f in (("onnx", meta.onnx_path), ("tokenizer", meta.tokenizer_path)):
        if not f.is_file():
            raise EngineError(f"{side}: {what} file {f.name} is missing")
    twin = ((meta.raw.get("fp16") or {}).get("cpu_emulation") or {}).get("onnx")
    twin_path = contained_path(root, twin, f"{side}: fp16.cpu_emulation.onnx", EngineError) if twin else None
    if not p.is_dir() and p.resolve() not in (meta.onnx_path, twin_path):
        raise EngineError(f"{p} is not the graph {side} describes ({meta.onnx_path.name})")
    verify_export(meta, verify_hash)
    if not p.is_dir() and p.resolve() == twin_path:  # the FP16 export's CPU-emulated twin (parity on CPU)
        return replace(meta, onnx_path=twin_path)
    return meta


def write_export(root: str | os.PathLike, d: dict) -> Path:
    """Validate ``d`` (:func:`parse_export`) and write it atomically as ``root/export.json``: the only
    function that writes the file. ``hllm export`` writes a fresh sidecar with it; everything derived from
    an export (quantized, fused, another engine) goes through the typed :func:`derive_export`.

    ``format`` is set to ``hllm-onnx``. Returns the path. Raises: EngineError (malformed dict).
    """
    d = {"format": FORMAT, **d}
    parse_export(d, root)
    return atomic_write_json(Path(root) / SIDECAR, d)


@dataclass(frozen=True)
class ExportChange:
    """What an export derived from another changes in its sidecar (None = kept from the source).

    Attributes:
        precision: the dtype of its matrix products. engine: one of :data:`SIDECAR_ENGINES`.
        flavour: one of :data:`FLAVOURS`. openvino: the OpenVINO settings (ir, inference precision).
        quantization / fusion: the record of what was done (``hllm info``).
        graph: the new graph file's name inside the derived directory: sets ``onnx``, ``onnx_sha256``
            and ``onnx_bytes`` from the file. drop: keys removed (e.g. a fused graph's stale ``inputs``).
        extra: other keys set (recipe records such as ``bf16_islands``).
    """

    precision: Precision | str | None = None
    engine: str | None = None
    flavour: str | None = None
    openvino: OpenVinoSettings | None = None
    quantization: dict | None = None
    fusion: dict | None = None
    graph: str | None = None
    drop: tuple[str, ...] = ()
    extra: dict = field(default_factory=dict)


def derive_export(src: ExportMeta, dst: str | os.PathLike, change: ExportChange) -> ExportMeta:
    """Write the sidecar of an export derived from ``src`` into the directory ``dst`` (its graph and
    tokenizer already there): ``src``'s sidecar with ``change`` applied, validated and written by
    :func:`write_export`. Returns the derived :class:`ExportMeta` (parsed, not re-verified).

    Raises: EngineError for a change the sidecar rules refuse (unknown engine, precision ...).
    """
    d = {k: v for k, v in src.raw.items() if k not in change.drop}
    if change.precision is not None:
        d["precision"] = str(Precision.parse(change.precision, "derived export: precision"))
    for key in ("engine", "flavour", "quantization", "fusion"):
        if getattr(change, key) is not None:
            d[key] = getattr(change, key)
    if change.openvino is not None:
        ov = {"ir": change.openvino.ir, "inference_precision": change.openvino.inference_precision,
              "dynamic_quantization_group_size": change.openvino.dynamic_quantization_group_size}
        d["openvino"] = {k: v for k, v in ov.items() if v is not None}
    if change.graph is not None:
        g = Path(dst) / change.graph
        d.update(onnx=change.graph, onnx_sha256=sha256_file(g), onnx_bytes=graph_bytes(g))
    d.update(change.extra)
    write_export(dst, d)
    return parse_export({"format": FORMAT, **d}, dst, str(Path(dst) / SIDECAR))


#: Keys of the ONNX ``metadata_props`` that ``hllm export`` writes (:func:`onnx_metadata_props`).
METADATA_KEYS = ("hllm.format", "hllm.num_positions", "hllm.flavour", "hllm.context", "hllm.inputs", "hllm.pad_id",
                 "hllm.prompt", "hllm.prompt_format", "hllm.version")


def onnx_metadata_props(num_positions: int, flavour: str, prompt: dict, context: bool, pad_id: int) -> dict[str, str]:
    """The ONNX model-level ``metadata_props`` of an hllm export, so the graph alone says how to feed it
    (Netron, ``polygraphy inspect model``, ``onnx.load(...).metadata_props``): format, K, flavour, whether it
    reads the user context, its input names, the pad token id, the prompt spec (JSON) and where the encoding
    is specified (docs/prompt-format.md). Values are strings (ONNX ``StringStringEntryProto``)."""
    return {
        "hllm.format": FORMAT,
        "hllm.num_positions": str(int(num_positions)),
        "hllm.flavour": flavour,
        "hllm.context": "true" if context else "false",
        "hllm.inputs": ",".join(input_names(context)),
        "hllm.pad_id": str(int(pad_id)),
        "hllm.prompt": json.dumps(prompt, sort_keys=True, ensure_ascii=False),
        "hllm.prompt_format": "docs/prompt-format.md (hllm): segments tokenized separately, concatenated, right-padded",
        "hllm.version": __version__,
    }
