"""The measured matrix-multiply peak a throughput figure is compared with (torch optional).

The stage, scaling and frontier benchmarks report achieved FLOP/s (:func:`hllm.measure.prefill_flops` over
the measured time) next to the fp32 GEMM peak measured in the same run (:func:`matmul_peak`); the machine
itself is described by :func:`hllm.measure.describe_machine`.
"""

from __future__ import annotations

import time

import numpy as np

from hllm.extras import optional


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
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)

    def best(fn) -> float:
        return best_gflops(fn, 2.0 * n**3, runs, warmup)

    out = {"n": n, "runs": runs, "numpy_gflops": best(lambda: a @ b), "torch_gflops": None}
    torch = optional("torch")
    if torch is not None:
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        out["torch_gflops"] = best(lambda: torch.mm(ta, tb))
    out["peak_gflops"] = max(v for v in (out["numpy_gflops"], out["torch_gflops"]) if v is not None)
    return out
