"""Machine description, library versions and the measured matrix-multiply peak (torch optional).

:func:`describe_machine` and :func:`cpu_flags` need the standard library only (no numpy), so a script
can describe the machine before the project's environment exists.

A latency figure means little without the hardware it came from and the physical limit it is
judged against; every benchmark JSON embeds :func:`describe_machine` and :func:`hllm.formats.provenance.library_versions`,
and the stage benchmark the fp32 GEMM peak measured in the same run (:func:`matmul_peak`).
"""

from __future__ import annotations

import os
import platform
import time



def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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
    try:
        import onnxruntime as ort

        if "CUDAExecutionProvider" not in ort.get_available_providers():
            return []
    except ImportError:
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
    Returns: ``{cpu, cpu_flags, logical_cpus, usable_cpus, memory_gb, gpus, os, load_avg_1m, shared, note}``.
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


def best_gflops(fn, flop: float, runs: int = 3, warmup: int = 1) -> float:
    """Best throughput of ``runs`` timed calls of ``fn()`` (after ``warmup`` untimed ones), in G(FL)OP/s for
    ``flop`` operations per call, rounded to 4 significant digits (a tiny size on a busy core stays > 0).
    The one timing loop behind every GEMM peak figure (fp32 here, int8 / bf16 in ``hllm bench frontier``)."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(f"{flop / min(ts) / 1e9:.4g}")


def matmul_peak(n: int = 2048, runs: int = 3, warmup: int = 1) -> dict:
    """Best achieved fp32 GEMM throughput on this machine, in GFLOP/s (``2·n³`` FLOP per product).

    Measures ``numpy.matmul`` (its BLAS) and, when torch is importable, ``torch.mm`` (the
    backend of the PyTorch engine); the peak is the best sample of either. Source of the FLOP count:
    an n×n by n×n product does n³ multiply-adds.

    Returns: ``{n, runs, numpy_gflops, torch_gflops (or None), peak_gflops}`` (best of ``runs``, 4 significant
    digits).
    """
    import numpy as np  # here, so the machine description needs the standard library only (scripts/demo_timings.py)

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)

    def best(fn) -> float:
        return best_gflops(fn, 2.0 * n**3, runs, warmup)

    out = {"n": n, "runs": runs, "numpy_gflops": best(lambda: a @ b), "torch_gflops": None}
    try:
        import torch

        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        out["torch_gflops"] = best(lambda: torch.mm(ta, tb))
    except ImportError:
        pass
    out["peak_gflops"] = max(v for v in (out["numpy_gflops"], out["torch_gflops"]) if v is not None)
    return out


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
