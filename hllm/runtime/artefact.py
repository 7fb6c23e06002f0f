"""Find what a path holds and open the matching engine (torch-free).

A deployable artefact is one of:

* a checkpoint directory (``hllm.json``) → PyTorch reference engine (imports torch on activate);
* an export directory (``export.json`` + ``model.onnx`` + ``tokenizer.json``) or its ``.onnx`` file
  → ONNX Runtime engine;
* a TensorRT plan (``*.plan``) with its sidecar ``*.plan.json`` → TensorRT engine.

Each carries what the runtime needs besides the graph: the prompt spec, the tokenizer and K. Which kind a
path holds is decided here, in one place (:func:`artefact_kind`, also used by ``hllm info``); the sidecars
are read by their owners (:mod:`hllm.formats.export`, :mod:`hllm.formats.plan`,
:mod:`hllm.formats.checkpoint`); this module only dispatches.

The torch-free engines (ONNX Runtime, OpenVINO, TensorRT) are imported with this module; each imports its
library only when activated. The PyTorch reference engine of a checkpoint is loaded by name through :func:`hllm.extras.require` (it needs the ``export`` extra): the lean runtime has
no import of torch code, which the ``forbidden`` contract in ``pyproject.toml`` checks.

Every file name read from a sidecar must lie in the sidecar's directory
(:func:`hllm.reading.contained_path`), and the files must be the ones recorded: the tokenizer's
fingerprint and vocabulary and the graph's / plan's size always, their sha256 with
``verify_hash=True`` (:func:`hllm.formats.export.verify_export`, :func:`hllm.formats.plan.verify_plan`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from hllm.engines.openvino import OpenVinoEngine
from hllm.engines.ort import OnnxRuntimeEngine
from hllm.engines.tensorrt.runner import TensorRTEngine
from hllm.errors import EngineError
from hllm.extras import require
from hllm.reading import contained_path
from hllm.formats.checkpoint import MANIFEST, load_manifest
from hllm.formats.export import SIDECAR, OpenVinoSettings, read_export
from hllm.formats.graph import declared_inputs, input_names, sidecar_reads_context
from hllm.formats.plan import read_plan, sidecar_path, verify_plan
from hllm.formats.precision import Precision
from hllm.formats.prompt import PromptSpec
from hllm.formats.vocabulary import ARTEFACT_ENGINES

#: File suffixes of a TensorRT plan (trtexec writes ``.engine`` as often as ``.plan``).
PLAN_SUFFIXES = (".plan", ".engine")

#: The module and class of the PyTorch reference engine (a checkpoint's engine; needs the ``export`` extra).
REFERENCE_ENGINE = ("hllm.engines.reference", "TorchEngine")


@dataclass
class Artefact:
    """A resolved deployable artefact.

    Attributes:
        kind: ``checkpoint``, ``onnx`` or ``tensorrt``.
        path: checkpoint directory, ``.onnx`` file or ``.plan`` file.
        prompt: the prompt spec the model was trained/exported with.
        tokenizer_path: its ``tokenizer.json``.
        num_positions: K.
        precision: :class:`Precision` of the graph (FP32 for a checkpoint).
        flavour: ``standard`` / ``ort-cpu`` for exports, None otherwise.
        meta: the sidecar dict as stored (``{}`` for a checkpoint).
        context: the head reads the user context (the graph has ``context_positions``).
        engine: what the sidecar's ``engine`` key names (``onnxruntime`` / ``openvino``; validated by
            :func:`hllm.formats.export.parse_export`); ``onnxruntime`` when absent or not an export.
        openvino: the sidecar's typed ``openvino`` object (:class:`hllm.formats.export.OpenVinoSettings`), or None.
    """

    kind: str
    path: Path
    prompt: PromptSpec
    tokenizer_path: Path
    num_positions: int
    precision: Precision = Precision.FP32
    flavour: str | None = None
    meta: dict = field(default_factory=dict)
    context: bool = False
    engine: str = "onnxruntime"
    openvino: object | None = None

    @property
    def graph_inputs(self) -> tuple[str, ...]:
        """The graph's input names, in order: those its sidecar declares, else (a checkpoint) the
        three base inputs plus ``context_positions`` when the head reads the user context."""
        return declared_inputs(self.meta) if isinstance(self.meta.get("inputs"), list) else input_names(self.context)


def artefact_kind(path: str | os.PathLike) -> str | None:
    """Which deployable artefact ``path`` holds, from names alone (reads no file):

    * ``"checkpoint"`` — a directory with the manifest ``hllm.json`` (:mod:`hllm.formats.checkpoint`);
    * ``"onnx"`` — a directory with ``export.json`` (:mod:`hllm.formats.export`), or an ``.onnx`` file;
    * ``"tensorrt"`` — a ``.plan`` / ``.engine`` file (its sidecar ``<plan>.json``, :mod:`hllm.formats.plan`);
    * None — not a deployable artefact.
    """
    p = Path(path)
    if p.is_dir() and (p / MANIFEST).is_file():
        return "checkpoint"
    if (p.is_dir() and (p / SIDECAR).is_file()) or p.suffix == ".onnx":
        return "onnx"
    if p.suffix in PLAN_SUFFIXES:
        return "tensorrt"
    return None


def resolve(path: str | os.PathLike, verify_hash: bool = False) -> Artefact:
    """Resolve ``path`` to an :class:`Artefact`.

    Args:
        path: checkpoint directory, export directory or its ``.onnx``, or ``.plan`` / ``.engine``.
        verify_hash: also check the graph's (plan's) sha256 against its sidecar (reads the whole file;
            a checkpoint records no hash, so it is not affected).
    Raises: EngineError (path missing, no or malformed sidecar, unknown kind, a file that is not the
        one recorded); CheckpointError for a bad checkpoint.
    """
    p = Path(path)
    if not p.exists():
        raise EngineError(f"not found: {p}")
    kind = artefact_kind(p)
    if kind == "checkpoint":
        m = load_manifest(p)
        return Artefact("checkpoint", m.root, m.prompt, m.tokenizer_path, m.num_positions, context=m.head.context)
    if kind == "onnx":
        e = read_export(p, verify_hash=verify_hash)
        return Artefact("onnx", e.onnx_path, e.prompt, e.tokenizer_path, e.num_positions, e.precision,
                        e.flavour, e.raw, sidecar_reads_context(e.raw), e.engine, e.openvino)
    if kind == "tensorrt":
        return _resolve_plan(p, verify_hash)
    raise EngineError(f"{p}: not a checkpoint directory, export directory, .onnx or .plan file")


def _resolve_plan(p: Path, verify_hash: bool) -> Artefact:
    plan = read_plan(p)
    if not plan.tokenizer_path.is_file():
        raise EngineError(f"{sidecar_path(p)}: tokenizer file {plan.tokenizer_path.name} is missing")
    verify_plan(p, plan.raw, verify_hash)
    return Artefact("tensorrt", p, plan.prompt, plan.tokenizer_path, plan.num_positions, plan.precision, None,
                    plan.raw, plan.context)


def open_engine(artefact: Artefact, **options):
    """Construct (not activate) the engine for ``artefact``.

    Options: ``engine`` (``auto`` = what the export sidecar's ``engine`` key says, else ONNX Runtime;
    ``onnxruntime``; ``openvino``), ``inference_precision`` (OpenVINO: ``f32`` / ``bf16``; default the
    sidecar's ``openvino.inference_precision``, else f32), ``threads`` (torch / ORT / OpenVINO threads), ``providers`` and
    ``graph_optimization`` (ONNX Runtime; FP8 Q/DQ graphs default to ``basic``: ORT's CPU provider has
    no FP8 kernels for the extended fusions), ``device`` (TensorRT GPU ordinal).
    Raises: EngineError for an unknown kind; MissingExtraError for a checkpoint without the ``export`` extra.
    """
    if artefact.kind == "checkpoint":
        module, name = REFERENCE_ENGINE
        return getattr(require(module), name)(artefact.path, threads=options.get("threads"))
    if artefact.kind == "onnx" and _wants_openvino(artefact, options.get("engine")):
        return _openvino_engine(artefact, options)
    if artefact.kind == "onnx":
        level = options.get("graph_optimization") or ("basic" if artefact.precision is Precision.FP8 else "all")
        return OnnxRuntimeEngine(artefact.path, artefact.num_positions, providers=options.get("providers"),
                                 intra_op_threads=options.get("threads") or 0, graph_optimization=level,
                                 precision=artefact.precision, context=artefact.context)
    if artefact.kind == "tensorrt":
        return TensorRTEngine(artefact.path, artefact.num_positions, sidecar=artefact.meta,
                              device=options.get("device") or 0)
    raise EngineError(f"unknown artefact kind {artefact.kind!r}")


#: Engines that run an export directory (``hllm rank --engine``); ``auto`` follows the sidecar.
EXPORT_ENGINES = ARTEFACT_ENGINES


def _wants_openvino(artefact: Artefact, engine: str | None) -> bool:
    engine = engine or "auto"
    if engine not in EXPORT_ENGINES:
        raise EngineError(f"unknown engine {engine!r}; one of {EXPORT_ENGINES}")
    if engine == "auto":
        return artefact.engine == "openvino"
    if engine == "onnxruntime" and artefact.engine == "openvino" and artefact.openvino is not None and artefact.openvino.ir:
        raise EngineError(f"{artefact.path.parent} is an OpenVINO IR export (its sidecar says engine: openvino); "
                          "run it with --engine openvino or auto")
    return engine == "openvino"


def _openvino_engine(artefact: Artefact, options: dict):
    ov = artefact.openvino if isinstance(artefact.openvino, OpenVinoSettings) else OpenVinoSettings()
    path = artefact.path
    if ov.ir:
        path = contained_path(artefact.path.parent, ov.ir, "export.json: openvino.ir", EngineError)
        if not path.is_file():
            raise EngineError(f"export.json: openvino.ir file {path.name} is missing")
    prec = options.get("inference_precision") or ov.inference_precision or "f32"
    return OpenVinoEngine(path, artefact.num_positions, threads=options.get("threads"), inference_precision=prec,
                          precision=artefact.precision, context=artefact.context, flavour=artefact.flavour,
                          dynamic_quantization_group_size=ov.dynamic_quantization_group_size)
