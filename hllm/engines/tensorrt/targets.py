"""Deployment GPU targets and the plan-compatibility policy of TensorRT (TRT-free).

* :data:`TARGETS` / :func:`compute_capability` — the one GPU-target table of hllm (``hllm build --target`` and
  ``hllm calibrate --target`` both read it);
* :func:`target_settings` — what ``--target`` implies for a build, checked against the build GPU and precision;
* :func:`check_compatible` — refuse a plan this TensorRT / GPU cannot run.

Rules: TensorRT developer guide, "Engine Compatibility" (a serialized engine runs only with the TensorRT
version that built it unless built version-compatible, and only on the build GPU's architecture unless built
with a hardware-compatibility level). The sidecar these read and the plan's fields: :mod:`hllm.formats.plan`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hllm.errors import EngineError
from hllm.formats.plan import HARDWARE_COMPAT, parse_cc
from hllm.formats.precision import Precision


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
