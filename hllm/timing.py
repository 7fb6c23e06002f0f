"""Summary statistics of repeated timings (torch-free).

Percentiles use numpy's default linear interpolation between order statistics
(``numpy.percentile(..., method="linear")``); with few runs p90/p99 lie between the two largest
samples, which the JSON states through ``runs``.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np

from hllm.errors import HllmError


def summarize(samples: Sequence[float], digits: int = 4) -> dict:
    """``{runs, median, p90, p99, mean, min, max}`` of ``samples`` (same unit as the input).

    Raises: HllmError if ``samples`` is empty or holds a non-finite value.
    """
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
    over the candidates, so their ratios are fair even when absolute times drift.

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
