"""The metadata sidecar of a TensorRT plan (``<name>.plan.json``) and its compatibility check (TRT-free).

A serialized TensorRT engine runs only with the TensorRT version that built it (unless built
version-compatible) and only on GPUs of the architecture it was built on (unless built with a
hardware-compatibility level) — TensorRT developer guide, "Engine Compatibility". The plan file does
not say which, in a form a loader can check cheaply, so ``hllm build`` writes a sidecar beside it and
:func:`check_compatible` refuses, with a message, a plan that would fail or misbehave.

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
import re
from dataclasses import dataclass
from pathlib import Path

from hllm.errors import EngineError
from hllm.files import atomic_write_json, read_json
from hllm.formats.precision import Precision
from hllm.formats.profiles import Profile
from hllm.formats.prompt import PromptSpec

FORMAT = "hllm-tensorrt-plan"
FORMAT_VERSION = 1
HARDWARE_COMPAT = ("none", "ampere_plus", "same_compute_capability")
REQUIRED = ("tensorrt_version", "compute_capability", "gpu_name", "profiles", "precision", "num_positions",
            "prompt", "tokenizer", "onnx_sha256")


@dataclass(frozen=True)
class Target:
    """A deployment GPU: what ``hllm build --target NAME`` and ``hllm calibrate --target`` imply.

    Attributes:
        name: short name (``a100``). compute_capability: (major, minor). precisions: the precisions its
        tensor cores run: FP16/INT8 everywhere here, BF16 from sm_80 (Ampere), FP8 from sm_89 (Ada, Hopper).
    """

    name: str
    compute_capability: tuple[int, int]

    @property
    def precisions(self) -> tuple[Precision, ...]:
        cc = self.compute_capability
        return ((Precision.FP32, Precision.FP16, Precision.INT8) + ((Precision.BF16,) if cc >= (8, 0) else ())
                + ((Precision.FP8,) if cc >= (8, 9) else ()))


#: Compute capability of named GPUs (NVIDIA, "CUDA GPUs", https://developer.nvidia.com/cuda-gpus).
#: The one GPU-target table of hllm (plan building and quantization both read it).
TARGETS = {name: Target(name, cc) for name, cc in {
    "t4": (7, 5), "a100": (8, 0), "a30": (8, 0), "a10": (8, 6), "a10g": (8, 6), "a40": (8, 6), "rtx3090": (8, 6),
    "l4": (8, 9), "l40": (8, 9), "l40s": (8, 9), "rtx4090": (8, 9), "h100": (9, 0), "h200": (9, 0),
    "gh200": (9, 0), "b200": (10, 0),
}.items()}


def compute_capability(target: str) -> tuple[int, int] | None:
    """Compute capability of ``target``: a name of :data:`TARGETS` (``a100`` → (8, 0)), ``sm89`` /
    ``sm_89`` or ``8.9``; None for ``cpu``.

    Raises: EngineError for anything else, listing the known names.
    """
    t = str(target).strip().lower()
    if t == "cpu":
        return None
    if t in TARGETS:
        return TARGETS[t].compute_capability
    m = re.fullmatch(r"sm_?(\d)(\d+)", t) or re.fullmatch(r"(\d+)\.(\d+)", t)
    if m:
        return int(m.group(1)), int(m.group(2))
    raise EngineError(f"unknown target {target!r}: use cpu, a GPU name ({', '.join(sorted(TARGETS))}) "
                      "or a compute capability such as 8.0")


@dataclass(frozen=True)
class DeviceInfo:
    """The GPU and CUDA a plan is built or loaded on."""

    gpu_name: str
    compute_capability: tuple[int, int]
    cuda_runtime_version: str = ""
    cuda_driver_version: str = ""

    @property
    def cc(self) -> str:
        return f"{self.compute_capability[0]}.{self.compute_capability[1]}"


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
    from hllm.errors import HllmError
    from hllm.files import contained_path
    from hllm.formats.graph import sidecar_reads_context

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
        from hllm.files import sha256_file

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
    from hllm.formats.graph import check_tensor_specs

    for key in ("inputs", "outputs"):  # copied from the export's sidecar; the runtime and Triton read them
        if meta.get(key) is not None:
            check_tensor_specs(meta[key], str(where), key, EngineError)


def profiles(meta: dict) -> list[Profile]:
    """The plan's optimization profiles, in engine order."""
    ps = [Profile.from_dict(p) for p in meta.get("profiles", [])]
    if not ps:
        raise EngineError("plan sidecar lists no optimization profile")
    return ps


def check_compatible(meta: dict, tensorrt_version: str, device: DeviceInfo) -> None:
    """Refuse a plan that this TensorRT / GPU cannot run.

    Rules (TensorRT "Engine Compatibility"): the TensorRT version must equal the builder's
    (``major.minor.patch``; with ``version_compatible`` any later version of the same major). The GPU:
    ``hardware_compatibility`` ``none`` → same compute capability as the build GPU;
    ``same_compute_capability`` → same; ``ampere_plus`` → compute capability ≥ 8.0.
    Raises: EngineError saying what was built for what, and what to do.
    """
    built = str(meta["tensorrt_version"])
    if not _trt_versions_match(built, tensorrt_version, bool(meta.get("version_compatible"))):
        raise EngineError(
            f"plan was built with TensorRT {built} but this is TensorRT {tensorrt_version}: a plan only loads in "
            f"the TensorRT version that built it; rebuild it here with `hllm build`")
    want = parse_cc(meta["compute_capability"])
    hc = meta.get("hardware_compatibility", "none")
    have = tuple(device.compute_capability)
    ok = have >= (8, 0) if hc == "ampere_plus" else have == want
    if not ok:
        need = "compute capability ≥ 8.0 (Ampere or newer)" if hc == "ampere_plus" else f"compute capability {want[0]}.{want[1]}"
        raise EngineError(
            f"plan was built for {meta.get('gpu_name', '?')} (sm_{want[0]}{want[1]}, hardware compatibility {hc}) "
            f"and needs {need}; this GPU is {device.gpu_name} (sm_{have[0]}{have[1]}): rebuild on this GPU or "
            f"build with --hardware-compat ampere_plus")


def _trt_versions_match(built: str, running: str, version_compatible: bool) -> bool:
    b = [int(x) for x in built.split(".")[:3] if x.isdigit()]
    r = [int(x) for x in running.split(".")[:3] if x.isdigit()]
    if version_compatible:
        return bool(b) and bool(r) and r[0] == b[0] and r >= b
    return b == r


def target_settings(target: str | None, device: DeviceInfo | None, hardware_compat: str | None,
                    precision: str) -> dict:
    """What ``--target`` implies, checked against the build GPU and the graph's precision.

    Returns ``{"target", "hardware_compatibility"}``. With ``target="a100"``: the graph's precision
    must run on sm_80 (FP8 refused); building on an sm_80 GPU keeps ``hardware_compatibility`` as
    given (default ``none``); building on a newer GPU sets ``ampere_plus`` (else the plan would not
    load on an A100); building on an older GPU is refused.
    Raises: EngineError.
    """
    hc = hardware_compat or "none"
    if hc not in HARDWARE_COMPAT:
        raise EngineError(f"--hardware-compat must be one of {HARDWARE_COMPAT}, got {hc!r}")
    if target is None:
        return {"target": None, "hardware_compatibility": hc}
    t = TARGETS.get(target.lower())
    if t is None:
        raise EngineError(f"unknown target {target!r}; known: {sorted(TARGETS)}")
    if precision not in t.precisions:
        raise EngineError(f"{t.name} (sm_{t.compute_capability[0]}{t.compute_capability[1]}) has no {precision} tensor cores; "
                          f"export with --precision fp16")
    if device is not None:
        have = tuple(device.compute_capability)
        if have < t.compute_capability:
            raise EngineError(f"cannot build for {t.name} on {device.gpu_name} (sm_{have[0]}{have[1]}): "
                              f"TensorRT builds only for the build GPU's architecture or newer")
        if have != t.compute_capability:
            if hardware_compat not in (None, "ampere_plus"):
                raise EngineError(f"a plan built on {device.gpu_name} (sm_{have[0]}{have[1]}) with hardware "
                                  f"compatibility {hc!r} will not load on {t.name}; use --hardware-compat ampere_plus")
            hc = "ampere_plus"
    return {"target": t.name, "hardware_compatibility": hc}
