"""The metadata sidecar of a TensorRT plan (``<name>.plan.json``): its reader and writer (TRT-free).

A serialized TensorRT engine runs only with the TensorRT version that built it (unless built
version-compatible) and only on GPUs of the architecture it was built on (unless built with a
hardware-compatibility level) — TensorRT developer guide, "Engine Compatibility". The plan file does
not say which, in a form a loader can check cheaply, so ``hllm build`` writes a sidecar beside it and
:func:`hllm.engines.tensorrt.targets.check_compatible` refuses, with a message, a plan that would fail or
misbehave. This module is the file format only; the GPU targets and the compatibility policy live in
:mod:`hllm.engines.tensorrt.targets`.

Sidecar keys (``format: hllm-tensorrt-plan``, ``format_version: 1``):
    tensorrt_version, cuda_runtime_version, cuda_driver_version, gpu_name, compute_capability
    ("8.0"), hardware_compatibility ("none" | "ampere_plus" | "same_compute_capability"),
    version_compatible (bool), builder_optimization_level, target, profiles [Profile.to_dict()],
    precision, fp32_islands, onnx, onnx_sha256, source_checkpoint {path, sha256}, num_positions,
    prompt, tokenizer (file beside the plan), head, build_seconds, timing_cache, plan_sha256, plan_bytes.
The runtime keys ``prompt``, ``tokenizer`` and ``num_positions`` are those of ``export.json``, so
:func:`hllm.runtime.artefact.resolve` treats a plan like an export.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from hllm.errors import EngineError, HllmError
from hllm.files import atomic_write_json
from hllm.reading import contained_path, read_json, sha256_file
from hllm.formats.graph import check_tensor_specs, sidecar_reads_context
from hllm.formats.precision import Precision
from hllm.formats.profiles import Profile
from hllm.formats.prompt import PromptSpec

FORMAT = "hllm-tensorrt-plan"
FORMAT_VERSION = 1
HARDWARE_COMPAT = ("none", "ampere_plus", "same_compute_capability")
REQUIRED = ("tensorrt_version", "compute_capability", "gpu_name", "profiles", "precision", "num_positions",
            "prompt", "tokenizer", "onnx_sha256")


def sidecar_path(plan: str | os.PathLike) -> Path:
    """``model.plan`` → ``model.plan.json`` (the name :mod:`hllm.runtime.artefact` looks for)."""
    p = Path(plan)
    return p.with_name(p.name + ".json")


def parse_cc(text: str) -> tuple[int, int]:
    """``"8.0"`` → (8, 0). Raises EngineError."""
    try:
        major, minor = str(text).split(".")
        return int(major), int(minor)
    except ValueError:
        raise EngineError(f"compute capability {text!r} is not MAJOR.MINOR") from None


def write_sidecar(plan: str | os.PathLike, meta: dict) -> Path:
    """Validate and write ``meta`` atomically as the plan's sidecar; returns its path.

    Raises: EngineError if a required key is missing or a profile is malformed.
    """
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, **meta}
    _check_keys(meta, sidecar_path(plan))
    out = sidecar_path(plan)
    atomic_write_json(out, meta)
    return out


def read_sidecar(plan: str | os.PathLike) -> dict:
    """Read and validate the sidecar of ``plan``. Raises EngineError (missing, unreadable, malformed)."""
    side = sidecar_path(plan)
    if not side.is_file():
        raise EngineError(f"{plan} has no sidecar {side.name} (build with `hllm build`)")
    meta = read_json(side, EngineError)
    _check_keys(meta, side)
    return meta


@dataclass(frozen=True)
class PlanMeta:
    """A validated plan sidecar, typed (like :class:`hllm.formats.export.ExportMeta` for exports).

    Attributes:
        plan: the plan file. tokenizer_path: its ``tokenizer.json``, inside the sidecar's directory.
        num_positions: K. prompt: the :class:`PromptSpec`. precision: the plan's :class:`Precision`.
        context: the graph reads the user context (``context_positions`` among its inputs).
        compute_capability: (major, minor) it was built for. tensorrt_version: the builder's TensorRT.
        hardware_compatibility: one of :data:`HARDWARE_COMPAT`. version_compatible: built version-compatible.
        profiles: its optimization profiles, in engine order. raw: the sidecar dict as stored.
    """

    plan: Path
    tokenizer_path: Path
    num_positions: int
    prompt: PromptSpec
    precision: Precision
    context: bool
    compute_capability: tuple[int, int]
    tensorrt_version: str
    hardware_compatibility: str
    version_compatible: bool
    profiles: tuple[Profile, ...]
    raw: dict


def read_plan(plan: str | os.PathLike) -> PlanMeta:
    """Read, validate and type the sidecar of ``plan`` (:func:`read_sidecar`, then the fields the runtime uses).

    Raises: EngineError naming the sidecar and the field (missing, malformed, a tokenizer outside its
        directory, an unknown precision or prompt field).
    """
    meta = read_sidecar(plan)
    side = sidecar_path(plan)
    tok = contained_path(side.parent, meta["tokenizer"], f"{side}: tokenizer", EngineError)
    try:
        prompt = PromptSpec.from_dict(meta["prompt"])
        precision = Precision.parse(meta.get("precision"), f"{side}: precision")
    except HllmError as e:
        raise EngineError(f"{side}: {e}") from None
    return PlanMeta(Path(plan), tok, meta["num_positions"], prompt, precision, sidecar_reads_context(meta),
                    parse_cc(meta["compute_capability"]), meta["tensorrt_version"],
                    meta.get("hardware_compatibility", "none"), bool(meta.get("version_compatible", False)),
                    tuple(profiles(meta)), meta)


def verify_plan(plan: str | os.PathLike, meta: dict, verify_hash: bool = False) -> None:
    """The plan file is the one built: its size equals ``plan_bytes`` (always) and, with
    ``verify_hash``, its sha256 equals ``plan_sha256`` (keys absent from older sidecars: not checked).

    Raises: EngineError naming the recorded and the found value.
    """
    p = Path(plan)
    want = meta.get("plan_bytes")
    if want is not None and p.stat().st_size != want:
        raise EngineError(f"{p} is {p.stat().st_size} bytes but its sidecar records {want}: the plan was replaced "
                          "or truncated; rebuild it with `hllm build`")
    if verify_hash and meta.get("plan_sha256") is not None:
        got = sha256_file(p)
        if got != meta["plan_sha256"]:
            raise EngineError(f"{p} has sha256 {got[:12]}…, its sidecar records {meta['plan_sha256'][:12]}…: "
                              "the plan was replaced; rebuild it with `hllm build`")


def _check_keys(meta: dict, where) -> None:
    if not isinstance(meta, dict):
        raise EngineError(f"{where}: expected a JSON object, got {type(meta).__name__}")
    if meta.get("format") != FORMAT:
        raise EngineError(f"{where}: format is {meta.get('format')!r}, expected {FORMAT!r}")
    version = meta.get("format_version", 0)
    if isinstance(version, bool) or not isinstance(version, int):
        raise EngineError(f"{where}: format_version must be an integer, got {version!r}")
    if version > FORMAT_VERSION:
        raise EngineError(f"{where}: format_version {version} is newer than this hllm reads ({FORMAT_VERSION})")
    missing = [k for k in REQUIRED if k not in meta]
    if missing:
        raise EngineError(f"{where} lacks {missing}")
    k = meta["num_positions"]
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise EngineError(f"{where}: num_positions must be a positive integer, got {k!r}")
    for key, kind in (("prompt", dict), ("profiles", list), ("tokenizer", str), ("compute_capability", str),
                      ("tensorrt_version", str), ("plan_bytes", int), ("plan_sha256", str)):
        v = meta.get(key)
        if (key in REQUIRED or v is not None) and (not isinstance(v, kind) or isinstance(v, bool)):
            raise EngineError(f"{where}: {key} must be {'an object' if kind is dict else 'a list' if kind is list else 'an integer' if kind is int else 'a string'}, "
                              f"got {type(v).__name__}")
    hc = meta.get("hardware_compatibility", "none")
    if hc not in HARDWARE_COMPAT:
        raise EngineError(f"{where}: hardware_compatibility {hc!r} not one of {HARDWARE_COMPAT}")
    parse_cc(meta["compute_capability"])
    profiles(meta)
    for key in ("inputs", "outputs"):  # copied from the export's sidecar; the runtime and Triton read them
        if meta.get(key) is not None:
            check_tensor_specs(meta[key], str(where), key, EngineError)


def profiles(meta: dict) -> list[Profile]:
    """The plan's optimization profiles, in engine order."""
    ps = [Profile.from_dict(p) for p in meta.get("profiles", [])]
    if not ps:
        raise EngineError("plan sidecar lists no optimization profile")
    return ps
