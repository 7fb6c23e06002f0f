"""LAP solver comparison for the decode step (paper Table 5: LAPJV 0.008 ms at N=50), torch-free.

Times each available solver on the same square N×N score matrices, interleaved (see
:func:`hllm.measure.time_interleaved`), for float32 and float64 cost arrays, and checks that
every solver reaches the same optimal objective (ties may give different permutations). Also times
the runtime's real call path, :func:`hllm.runtime.decode.decode` on a float32 ``[N, K]`` engine
output (conversion, finiteness check, solve, permutation check), and :func:`decode_batch` per slate.

Solvers (each measured only if importable):

* ``lap.lapjv`` — https://github.com/gatagat/lap (the runtime's solver; ``lapx`` installs the same
  module name with extra solvers ``lapjvc``, ``lapjvx``, ``lapjvs``, ``lapjvsa``, which are then
  measured too);
* ``scipy.optimize.linear_sum_assignment`` — shortest augmenting path (Crouse 2016);
* ``lapjv`` (src-d) — https://github.com/src-d/lapjv, AVX2 Jonker-Volgenant (sdist only).

Matrix families (the structure changes JV's work a lot, so several are reported):

* ``gaussian``: iid N(0, 1) scores — no structure (an untrained head looks like this);
* ``planted``: ``-(r_i - p)² / N + 0.5·N(0,1)`` for a hidden order r — a head that knows a ranking;
* ``rank1``: ``s_i · w_p + 0.1·N(0,1)`` with ``w`` decreasing in p — item quality × position weight,
  near-degenerate (many almost-tied optima), the hard case for JV;
* ``model``: the real score matrices of an hLLM artefact on real sub-slates
  (:func:`model_score_matrices`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from hllm.extras import optional
from hllm.measure import summarize, time_interleaved
from hllm.runtime import Ranker
from hllm.runtime.decode import decode, decode_batch
from hllm.runtime.slates import subslate
from hllm.verify.scoring import score_slates

FAMILIES = ("gaussian", "planted", "rank1")

#: Slates per decode_batch call in the batched-path measurement.
BATCH = 8


def score_matrices(family: str, n: int, count: int, seed: int = 0) -> list[np.ndarray]:
    """``count`` float32 score matrices ``[n, n]`` of a :data:`FAMILIES` family (higher = better).

    Raises: ValueError for an unknown family.
    """
    rng = np.random.default_rng(seed)
    out = []
    p = np.arange(n)
    for _ in range(count):
        if family == "gaussian":
            m = rng.standard_normal((n, n))
        elif family == "planted":
            r = rng.permutation(n)
            m = -((r[:, None] - p[None, :]) ** 2) / n + 0.5 * rng.standard_normal((n, n))
        elif family == "rank1":
            s = rng.standard_normal(n)
            w = np.linspace(1.0, -1.0, n)
            m = s[:, None] * w[None, :] + 0.1 * rng.standard_normal((n, n))
        else:
            raise ValueError(f"unknown matrix family {family!r}; one of {FAMILIES}")
        out.append(m.astype(np.float32))
    return out


def model_score_matrices(model, slates, ns, threads: int | None = None) -> dict[int, list[np.ndarray]]:
    """``{n: [n, n] float32 score blocks}`` an hLLM artefact produces on ``slates`` cut to n candidates.

    Opens the model once and scores every slate and n (batch 1, :func:`hllm.verify.scoring.score_slates`).
    Raises HllmError from loading or running the model; SlateError if a slate has fewer than n candidates.
    """
    out: dict[int, list[np.ndarray]] = {}
    with Ranker.from_path(model, threads=threads) as r:
        for n in ns:
            (scores,) = score_slates([r.engine], r.builder, [subslate(s, n) for s in slates])
            out[n] = [np.ascontiguousarray(m[:, :n], dtype=np.float32) for m in scores]
    return out


@dataclass
class Solver:
    """A LAP solver adapter.

    ``call(cost)`` is what is timed: the library call on a prepared C-contiguous cost array (to
    minimise). ``ranking(raw, n)`` turns its raw result into ``ranking[p]`` = item at position p.
    """

    name: str
    call: Callable[[np.ndarray], object]
    ranking: Callable[[object, int], np.ndarray]


def _from_row_to_col(row_to_col: np.ndarray, n: int) -> np.ndarray:
    out = np.empty(n, dtype=np.int64)
    out[np.asarray(row_to_col, dtype=np.int64)] = np.arange(n)
    return out


def _from_pairs(rows, cols, n: int) -> np.ndarray:
    out = np.empty(n, dtype=np.int64)
    out[np.asarray(cols, dtype=np.int64)] = np.asarray(rows, dtype=np.int64)
    return out


def available_solvers() -> list[Solver]:
    """The solvers importable here (see the module docstring)."""
    out: list[Solver] = []
    lap = optional("lap")
    if lap is not None:
        out.append(Solver("lap.lapjv", lambda c: lap.lapjv(c, extend_cost=False, return_cost=False),
                          lambda r, n: np.asarray(r[1], dtype=np.int64)))
        for name in ("lapjvc", "lapjvx", "lapjvs"):  # lapx only: (cost, rows, cols)
            fn = getattr(lap, name, None)
            if fn is not None:
                out.append(Solver(f"lapx.{name}", fn, lambda r, n: _from_pairs(r[1], r[2], n)))
        if hasattr(lap, "lapjvsa"):  # lapx only: (cost, [k, 2] pairs)
            out.append(Solver("lapx.lapjvsa", lap.lapjvsa, lambda r, n: _from_pairs(r[1][:, 0], r[1][:, 1], n)))
    scipy_optimize = optional("scipy.optimize")
    if scipy_optimize is not None:
        out.append(Solver("scipy.linear_sum_assignment", scipy_optimize.linear_sum_assignment,
                          lambda r, n: _from_pairs(r[0], r[1], n)))
    try:
        srcd = optional("lapjv")
    except (ImportError, AttributeError):  # a build broken against this numpy fails inside its import
        srcd = None
    if srcd is not None:
        out.append(Solver("lapjv(src-d)", srcd.lapjv, lambda r, n: _from_row_to_col(r[0], n)))
    return out


def _objective(m: np.ndarray, ranking: np.ndarray) -> float:
    return float(np.asarray(m, dtype=np.float64)[ranking, np.arange(len(ranking))].sum())


def bench_solvers(
    n: int, family: str, count: int, dtypes=("float32", "float64"), warmup: int = 5, seed: int = 0,
    solvers: list[Solver] | None = None, matrices: list[np.ndarray] | None = None,
) -> dict:
    """Time every solver × dtype on ``count`` matrices of one family and size, interleaved.

    ``matrices`` (``[n, n]`` score blocks, e.g. from :func:`model_score_matrices`) replaces the
    generated family; they are cycled to ``count + warmup`` calls.

    Returns a record: ``{n_items, family, matrices, warmup, solvers: {"name/dtype": stats µs},
    runtime_decode_us, runtime_decode_batch_us_per_slate, batch_us_per_slate (decode_batch, decode loop
    and bare lap.lapjv loop on the same :data:`BATCH` matrices per round, µs per slate), batch_size,
    correct, max_objective_gap, tie_differences}``.
    ``correct`` is True when every solver's ranking is a permutation whose objective equals the best
    objective over all solvers within ``1e-9·N`` (on the float64 scores); ``tie_differences`` counts
    matrices where solvers returned different permutations of equal objective.
    """
    solvers = solvers if solvers is not None else available_solvers()
    if matrices is not None:
        mats = [np.asarray(matrices[i % len(matrices)], dtype=np.float32) for i in range(count + warmup)]
    else:
        mats = score_matrices(family, n, count + warmup, seed)
    costs = {dt: [np.ascontiguousarray(-m, dtype=dt) for m in mats] for dt in dtypes}
    # Solver j solves matrix (i + j·stride) mod M in round i: within a round every solver gets
    # a different matrix and each sees every matrix once per cycle, so no solver profits from a
    # branch predictor / cache just trained on the same problem by the solver before it.
    n_cand = len(solvers) * len(dtypes) + 4
    stride = max(1, len(mats) // n_cand)
    ix = lambda i, j: (i + j * stride) % len(mats)  # noqa: E731
    calls = {}
    j = 0
    for s in solvers:
        for dt in dtypes:
            calls[f"{s.name}/{dt}"] = (lambda i, s=s, dt=dt, j=j: s.call(costs[dt][ix(i, j)]))
            j += 1
    calls["runtime decode()"] = lambda i, j=j: decode(mats[ix(i, j)], n)
    # batched path: BATCH consecutive matrices per call through decode_batch, through a loop of
    # decode(), and through a loop of the bare runtime solver (µs per slate)
    import lap

    stacked = np.stack(mats)
    neg64 = np.ascontiguousarray(-stacked, dtype=np.float64)
    bsz = min(BATCH, len(mats))
    sl = lambda i, j: slice(min(ix(i, j), len(mats) - bsz), min(ix(i, j), len(mats) - bsz) + bsz)  # noqa: E731
    calls["batch: decode_batch()"] = lambda i, j=j + 1: decode_batch(stacked[sl(i, j)], [n] * bsz)
    calls["batch: decode() loop"] = lambda i, j=j + 2: [decode(m, n) for m in stacked[sl(i, j)]]
    calls["batch: lap.lapjv loop"] = lambda i, j=j + 3: [
        lap.lapjv(c, extend_cost=False, return_cost=False) for c in neg64[sl(i, j)]]
    samples = time_interleaved(calls, rounds=count, warmup=warmup, unit=1e6)
    batch_us = {k.split(": ", 1)[1]: summarize([v / bsz for v in samples.pop(k)], 2)
                for k in [k for k in samples if k.startswith("batch: ")]}

    correct, gap, ties = _check_optima(mats, costs, solvers, dtypes, n, warmup)
    return {
        "n_items": n,
        "family": family,
        "matrices": count,
        "warmup": warmup,
        "solvers_us": {k: summarize(v, 2) for k, v in samples.items() if k != "runtime decode()"},
        "runtime_decode_us": summarize(samples["runtime decode()"], 2),
        "runtime_decode_batch_us_per_slate": batch_us["decode_batch()"],
        "batch_us_per_slate": batch_us,
        "batch_size": bsz,
        "correct": bool(correct),
        "max_objective_gap": float(gap),
        "tie_differences": ties,
    }


def _check_optima(mats, costs, solvers, dtypes, n: int, warmup: int) -> tuple[bool, float, int]:
    """Whether every solver (and the runtime path) reached the same optimum on every measured matrix:
    (correct, largest objective gap, matrices where solvers returned different tied permutations)."""
    gap, ties, correct = 0.0, 0, True
    for i, m in enumerate(mats[warmup:], start=warmup):
        rankings = {"runtime": decode(m, n)}
        for s in solvers:
            for dt in dtypes:
                rankings[f"{s.name}/{dt}"] = s.ranking(s.call(costs[dt][i]), n)
        objs = {}
        for k, r in rankings.items():
            if sorted(r.tolist()) != list(range(n)):
                correct = False
                continue
            objs[k] = _objective(m, r)
        best = max(objs.values())
        worst_gap = max(best - v for v in objs.values())
        gap = max(gap, worst_gap)
        if worst_gap > 1e-9 * n * max(1.0, abs(best)):
            # float32 cost arrays may pick a different optimum than float64 only through rounding
            correct = correct and worst_gap <= 1e-5 * n * max(1.0, abs(best))
        if len({tuple(r.tolist()) for r in rankings.values()}) > 1:
            ties += 1
    return correct, gap, ties


def fastest(record: dict, dtype: str | None = None) -> tuple[str, float]:
    """``(solver/dtype, median µs)`` of the fastest solver in a :func:`bench_solvers` record."""
    items = [(k, v["median"]) for k, v in record["solvers_us"].items() if dtype is None or k.endswith(dtype)]
    return min(items, key=lambda kv: kv[1])
