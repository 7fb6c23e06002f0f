"""Measurement facts, in one place: the machine a figure came from and the statistics of repeated timings.

* :func:`describe_machine`, :func:`cpu_flags`, :func:`bf16_support`, :func:`int8_dot_support` — the hardware
  and OS (standard library only, no numpy: a script can describe the machine before the project's
  environment exists);
* :func:`summarize` and :func:`time_interleaved` — statistics of repeated timings;
* :func:`prefill_flops` — the FLOP count a throughput figure is judged by.

A latency figure means little without the hardware it came from and the physical limit it is judged
against; every benchmark JSON embeds :func:`describe_machine` and :func:`hllm.formats.provenance.library_versions`.
The measured GEMM peak (it times torch when installed) belongs to the benchmarks: :mod:`hllm.bench.peak`.

Percentiles use numpy's default linear interpolation between order statistics
(``numpy.percentile(..., method="linear")``); with few runs p90/p99 lie between the two largest
samples, which the JSON states through ``runs``.
"""

from __future__ import annotations

import os
import platform
import time
from typing import Callable, Sequence

from hllm.errors import HllmError
from hllm.extras import optional


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_id(cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """The x86 ``cpu family`` and ``model`` numbers of ``/proc/cpuinfo`` (decimal), e.g. ``"family 25 model 17"``:
    what tells CPUs of one marketing name apart (an "AMD EPYC" of family 25 is Zen 3 / Zen 4, of family 26 Zen 5;
    AMD's and Intel's processor programming references). None where the file or the fields are absent."""
    fam = model = None
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "cpu family" and fam is None:
                    fam = value.strip()
                elif key == "model" and model is None:
                    model = value.strip()
                elif not line.strip() and fam is not None:
                    break  # the first processor's block is enough
    except OSError:
        return None
    return f"family {fam} model {model}" if fam and model else None


#: The CPU features that decide which GEMM kernels run (fp32 AVX2/AVX-512, int8 VNNI, bf16).
CPU_FEATURES = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile",
                "amx_bf16", "amx_int8")


def cpu_flags() -> list[str]:
    """The :data:`CPU_FEATURES` this CPU has (from /proc/cpuinfo; empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return [w for w in CPU_FEATURES if w in flags]
    except OSError:
        pass
    return []


def bf16_support() -> tuple[bool, str]:
    """Whether this CPU has bfloat16 matrix instructions (AVX512_BF16 or AMX-BF16), and a sentence
    saying which it has (for messages and benchmark JSON)."""
    have = cpu_flags()
    ok = "avx512_bf16" in have or "amx_bf16" in have
    return ok, (f"bf16 GEMM instructions: {'yes' if ok else 'none'} (CPU features: {', '.join(have) or 'unknown'})")


def int8_dot_support() -> tuple[bool, str]:
    """Whether this CPU has int8 dot-product instructions (AVX512-VNNI, AVX-VNNI or AMX-INT8); without
    them ONNX Runtime's int8 GEMMs widen to int16 and gain little over fp32."""
    have = cpu_flags()
    ok = any(f in have for f in ("avx512_vnni", "avx_vnni", "amx_int8"))
    return ok, f"int8 dot-product instructions: {'yes' if ok else 'none'} (CPU features: {', '.join(have) or 'unknown'})"


def _memory_gb() -> float | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _gpus() -> list[str]:
    ort = optional("onnxruntime")
    if ort is None or "CUDAExecutionProvider" not in ort.get_available_providers():
        return []
    try:
        import subprocess

        r = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=10)
        return [x.strip() for x in r.stdout.splitlines() if x.strip()]
    except (OSError, subprocess.SubprocessError):
        return []


def describe_machine(shared: bool | None = None, note: str | None = None) -> dict:
    """Hardware and OS of this machine.

    Args:
        shared: whether other work ran on the same cores during the measurement (stated by the
            caller: ``hllm bench --shared``); None = unknown.
        note: free text stored with the figures.
    Returns: ``{cpu, cpu_id, cpu_flags, logical_cpus, usable_cpus, memory_gb, gpus, os, load_avg_1m, shared, note}``
        (``cpu_id``: :func:`cpu_id`).
    """
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    try:
        load = round(os.getloadavg()[0], 2)
    except OSError:
        load = None
    return {
        "cpu": _cpu_model(),
        "cpu_id": cpu_id(),
        "cpu_flags": cpu_flags(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": usable,
        "memory_gb": _memory_gb(),
        "gpus": _gpus(),
        "os": f"{platform.system()} {platform.release()}",
        "load_avg_1m": load,
        "shared": shared,
        "note": note,
    }


def prefill_flops(dims, seq_len: int) -> float:
    """FLOPs of one causal prefill of ``seq_len`` tokens through the decoder layers (no LM head).

    ``2 · P_linear · S`` for the linear projections (:meth:`BackboneDims.non_embedding_params`)
    plus ``2 · L · S² · H · d_head`` for the causal attention scores and weighted sum
    (QKᵀ and AV, each ``S²/2 · H · d_head`` multiply-adds with the causal mask). Norms, rotary
    and the scoring head (< 0.1% here) are not counted.
    """
    s = int(seq_len)
    linear = 2.0 * dims.non_embedding_params() * s
    attention = 2.0 * dims.num_layers * s * s * dims.num_heads * dims.head_dim
    return linear + attention


def summarize(samples: Sequence[float], digits: int = 4) -> dict:
    """``{runs, median, p90, p99, mean, min, max}`` of ``samples`` (same unit as the input).

    Raises: HllmError if ``samples`` is empty or holds a non-finite value.
    """
    import numpy as np  # here: the machine description above needs the standard library only

    a = np.asarray(samples, dtype=np.float64)
    if a.size == 0:
        raise HllmError("no timing samples to summarize")
    if not np.isfinite(a).all():
        raise HllmError("timing samples contain a non-finite value")
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    r = lambda v: round(float(v), digits)  # noqa: E731
    return {
        "runs": int(a.size),
        "median": r(p50),
        "p90": r(p90),
        "p99": r(p99),
        "mean": r(a.mean()),
        "min": r(a.min()),
        "max": r(a.max()),
    }


def time_interleaved(
    calls: dict[str, Callable[[int], object]], rounds: int, warmup: int = 1, unit: float = 1e3
) -> dict[str, list[float]]:
    """Time several callables interleaved: round r calls each ``fn(r)`` once, rotating the order.

    Interleaving spreads machine noise (other processes on shared cores, frequency changes) evenly
    over the contenders, so their ratios are fair even when absolute times drift.

    Args:
        calls: ``{name: fn}``; ``fn(i)`` receives the round index (to pick the i-th input).
        rounds: measured rounds; ``warmup`` more rounds run first and are discarded.
        unit: multiplier from seconds (1e3 → milliseconds, 1e6 → microseconds).
    Returns: ``{name: [sample per measured round]}``.
    """
    names = list(calls)
    out: dict[str, list[float]] = {k: [] for k in names}
    for r in range(warmup + rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            t0 = time.perf_counter()
            calls[name](r)
            dt = time.perf_counter() - t0
            if r >= warmup:
                out[name].append(dt * unit)
    return out
