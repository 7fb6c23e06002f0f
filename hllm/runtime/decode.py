"""Decode: score matrix → ranking by maximum-weight assignment (LAPJV), torch-free.

hLLM (paper §3.4) ranks by the assignment of items to rank positions that maximises the total
score ``Σ_i M[i, π(i)]``; a valid permutation by construction. A slate of N items uses only the first
N position columns of ``M [N, K]``, so the assignment is square N×N. Solved with the Jonker-Volgenant
algorithm from the ``lap`` package (``lap.lapjv``, https://github.com/gatagat/lap) on float64 costs
``-M``.

Solver choice (measured by ``hllm bench lapjv``, ``results/bench/lapjv.json``, see
``docs/benchmarks.md``): ``lap.lapjv`` on float64 costs was the fastest at N = 50 and 150 on dense
unstructured and "planted" score matrices and on the real (untrained demo) model's, ties with
scipy at N = 10, and is already the runtime's dependency (scipy is not). Its known weak case is a
near-degenerate, rank-1-like matrix (item quality × position weight), where
``scipy.optimize.linear_sum_assignment`` was 2-12× faster: re-run the benchmark on a trained
model's scores (``hllm bench lapjv --model``) before relying on the LAPJV figure. ``lap`` converts
float32 to float64 internally, so the conversion is done here once (one allocation: convert, negate
in place, scale by a power of two in place); then one max/min reduction (finiteness and scale), the
solve and an O(N) permutation check.

Behaviour that callers rely on:

* ``lap.lapjv`` silently returns a permutation for NaN/inf costs, so finiteness is checked first
  (DecodeError naming the count of non-finite values).
* Magnitude: ``lap.lapjv`` uses a fixed constant (1e6) as "infinity" inside its augmenting-path
  search, so with costs of magnitude ≥ 1e6 it returns non-optimal assignments (about a quarter of
  random matrices; ``decode([[0, 3e6], [-5e6, 2e6]])`` gave the total −2e6 instead of
  +2e6). Each slate's costs are therefore scaled by a power of two so that max |cost| lies in
  [0.5, 1) before the solve. Power-of-two scaling is exact in binary floating point (only values
  more than ~2^1000 times smaller than the largest one lose bits, and those cannot change a float64
  total), so the optimum is unchanged and the solver sees well-conditioned costs at any finite
  magnitude. ``tests/runtime/test_decode_large.py`` checks optimality against
  ``scipy.optimize.linear_sum_assignment`` for magnitudes 1e-30 … 1e300.
* Ties: one fixed solver (``lap.lapjv``) on the same float64 costs, so equal inputs always give the
  same ranking (the solver is deterministic); among exactly tied optima which one is returned is
  the solver's choice, not a documented rule.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from hllm.errors import DecodeError

#: Sinkhorn temperature and iterations of :func:`relevance_scores` (those ``hllm train`` defaults to, paper §3.3).
SINKHORN_TAU = 1.0
SINKHORN_ITERS = 20

#: The solver the runtime uses, for reports (``hllm bench`` records it with ``lap.__version__``).
SOLVER = "lap.lapjv (float64 costs scaled by a power of two, return_cost=False)"


def _check_shape(scores: np.ndarray, n_items: int | None) -> int:
    if not isinstance(scores, np.ndarray) or scores.ndim != 2:
        shape = getattr(scores, "shape", None)
        raise DecodeError(f"scores must be a 2-D array [N, K], got shape {shape}")
    n = scores.shape[0] if n_items is None else int(n_items)
    if n < 1 or n > scores.shape[0]:
        raise DecodeError(f"n_items={n} is outside 1..{scores.shape[0]}")
    if n > scores.shape[1]:
        raise DecodeError(f"{n} items but only K={scores.shape[1]} rank positions")
    return n


def _name(names: Sequence[str] | None, b: int) -> str:
    return f"slate {names[b]!s}" if names is not None else f"slate at batch position {b}"


def _neg_cost(sub: np.ndarray, names: Sequence[str] | None = None) -> np.ndarray:
    """``-sub`` scaled by a power of two per slate, as a new C-contiguous float64 array; DecodeError if
    any value is non-finite.

    Works on ``[n, n]`` or ``[B, n, n]``. Each slate's block is multiplied by ``2**-e`` with ``e`` the
    binary exponent of its largest |value| (so max |cost| is in [0.5, 1); an all-zero block is left
    as is): exact, order-preserving, and it keeps ``lap.lapjv`` away from its internal 1e6 constant
    (module doc). The finiteness check is the per-slate max/min (NaN and ±inf propagate through
    them); only if one is not finite are the elements inspected.
    """
    cost = sub.astype(np.float64, order="C")
    np.negative(cost, out=cost)
    axes = (-2, -1)
    top = np.maximum(cost.max(axis=axes), -cost.min(axis=axes))  # max |cost| per slate: [] or [B]
    if not np.isfinite(top).all():
        bad = ~np.isfinite(cost)
        where = ""
        if cost.ndim == 3:
            b = int(np.flatnonzero(bad.any(axis=axes))[0])
            where, bad = f"{_name(names, b)}: ", bad[b]
        raise DecodeError(f"{where}score matrix has {int(bad.sum())} non-finite value(s); refusing to rank")
    exponent = np.frexp(top)[1]  # top = f * 2**exponent with f in [0.5, 1); 0 for an all-zero block
    np.ldexp(cost, -exponent[..., None, None], out=cost)
    return cost


def _lapjv_columns(cost: np.ndarray) -> np.ndarray:
    """``y[j]`` = row assigned to column j of a square float64 C-contiguous cost (``lap.lapjv``)."""
    import lap  # lazily: `lap` is a runtime extra, not a core dependency (cached in sys.modules)

    return lap.lapjv(cost, extend_cost=False, return_cost=False)[1]


def decode(scores: np.ndarray, n_items: int | None = None) -> np.ndarray:
    """Ranking of one slate from its score matrix.

    Args:
        scores: ``[N_pad, K]`` float array (float32 from engines; any real dtype), rows = items,
            columns = rank positions (0 = top).
        n_items: number of real items n (rows ``0..n-1``); default all rows. Requires n ≤ K.
    Returns:
        ``[n]`` int64 array ``ranking`` with ``ranking[p]`` = index of the item placed at position p;
        it maximises ``Σ_p scores[ranking[p], p]`` over the n×n block.
    Raises:
        DecodeError: not 2-D, n > K or n outside ``1..N_pad``, or a non-finite score among the n×n used.
    """
    n = _check_shape(scores, n_items)
    cost = _neg_cost(scores[:n, :n])
    if n == 1:
        return np.zeros(1, dtype=np.int64)
    ranking = _lapjv_columns(cost).astype(np.int64, copy=False)
    check_permutation(ranking, n)
    return ranking


def decode_batch(scores: np.ndarray, n_items: Sequence[int], names: Sequence[str] | None = None) -> list[np.ndarray]:
    """Rankings of B slates: ``scores [B, N_pad, K]`` and ``n_items [B]`` → list of ``[n_b]`` int64.

    The batched path does the per-call numpy work once for the whole batch when every slate has
    the same n (the common case: one slate size per request stream): one float64 conversion and
    negation of the ``[B, n, n]`` block, one finiteness reduction, one solver call per slate on a
    contiguous view, and one vectorised permutation check of the ``[B, n]`` result. Ragged batches
    use :func:`decode` per slate. Results equal :func:`decode` per slate.

    ``names``: the slates' ids, used in error messages (default: the batch position).
    Raises: DecodeError as :func:`decode`, naming the slate.
    """
    if not isinstance(scores, np.ndarray) or scores.ndim != 3 or scores.shape[0] != len(n_items):
        raise DecodeError(f"scores must be [B, N, K] with B={len(n_items)}, got {getattr(scores, 'shape', None)}")
    ns = [int(n) for n in n_items]
    if not ns:
        return []
    if min(ns) != max(ns):
        out = []
        for b, n in enumerate(ns):
            try:
                out.append(decode(scores[b], n))
            except DecodeError as e:
                raise DecodeError(f"{_name(names, b)}: {e}") from None
        return out
    n = ns[0]
    try:  # every slate has the same [N_pad, K] and n: the first one fails if any does
        _check_shape(scores[0], n)
    except DecodeError as e:
        raise DecodeError(f"{_name(names, 0)}: {e}") from None
    cost = _neg_cost(scores[:, :n, :n], names)
    if n == 1:
        return [np.zeros(1, dtype=np.int64) for _ in ns]
    rankings = np.stack([_lapjv_columns(c) for c in cost]).astype(np.int64, copy=False)
    ok = (np.sort(rankings, axis=1) == np.arange(n)).all(axis=1)
    if not ok.all():
        b = int(np.flatnonzero(~ok)[0])
        raise DecodeError(f"{_name(names, b)}: decoder returned {rankings[b].tolist()}, not a permutation of 0..{n - 1}")
    return list(rankings)


def check_permutation(ranking: np.ndarray, n: int) -> None:
    """Raise DecodeError unless ``ranking`` is a permutation of ``0..n-1``.

    O(n) in Python sets: at n ≤ 150 this is cheaper than several numpy calls.
    """
    r = np.asarray(ranking)
    ok = r.shape == (n,)
    if ok and n:
        items = r.tolist()
        ok = all(isinstance(i, int) or float(i).is_integer() for i in items) if r.dtype.kind not in "iu" else True
        ok = ok and min(items) >= 0 and max(items) < n and len(set(items)) == n
    if not ok:
        raise DecodeError(f"decoder returned {r.tolist()}, not a permutation of 0..{n - 1}")


def assignment_scores(scores: np.ndarray, ranking: np.ndarray) -> np.ndarray:
    """Score of each item at its assigned position: ``[n]`` float64, in ranking order
    (``out[p] = scores[ranking[p], p]``)."""
    return np.asarray(scores[ranking, np.arange(len(ranking))], dtype=np.float64)


def _isotonic_decreasing(y: np.ndarray) -> np.ndarray:
    """The non-increasing sequence closest to ``y`` in least squares (pool-adjacent-violators), float64."""
    vals, counts = [], []
    for v in y.tolist():
        vals.append(v)
        counts.append(1)
        while len(vals) > 1 and vals[-2] < vals[-1]:  # a violation: pool the two blocks
            c = counts[-2] + counts[-1]
            vals[-2] = (vals[-2] * counts[-2] + vals[-1] * counts[-1]) / c
            counts[-2] = c
            vals.pop()
            counts.pop()
    return np.repeat(np.asarray(vals, dtype=np.float64), counts)


def relevance_scores(scores: np.ndarray, order, tau: float = SINKHORN_TAU, iters: int = SINKHORN_ITERS) -> np.ndarray:
    """Relevance score in [0, 1] of each rank position of the LAPJV ``order``, non-increasing by construction.

    1. Sinkhorn relaxation of the real block (paper §3.3, the operator ``hllm train`` fits; log domain as in
       :mod:`hllm.training.sinkhorn`): ``S = Sinkhorn(exp(M[:n, :n] / τ))``, ``iters`` row+column
       normalisations; ``S[i, p]`` is item i's mass at rank position p, rows and columns sum to 1.
    2. Soft rank: ``r_i = Σ_p S[i, p] · (n − 1 − p) / (n − 1)`` = ``1 − E_S[position of i] / (n − 1)``: 1 when
       all of i's mass is at the top position, 0 at the bottom one; the mean over a slate is exactly 0.5
       (the columns of S sum to 1), so 0.5 is "the middle of this list". ``n = 1`` → 1.0.
    3. Along ``order`` the values are replaced by their isotonic (non-increasing, least-squares) fit
       (pool-adjacent-violators), so the score never rises down the returned list; ties are averaged.

    Args:
        scores: the score matrix M ``[n, K]`` (real rows of the slate; float). order: the LAPJV ranking,
            ``order[p]`` = item at position p (a permutation of ``range(n)``).
        tau: Sinkhorn temperature (> 0). iters: normalisation rounds (≥ 1).
    Returns: ``[n]`` float64 scores, ``out[p]`` for item ``order[p]``.
    Raises: ValueError if ``order`` is not a permutation of the ``n`` rows or the ``[n, n]`` block it reads
        is not finite (the columns past n are not read).
    """
    m = np.asarray(scores, dtype=np.float64)
    n = m.shape[0]
    order = np.asarray(order, dtype=np.int64)
    if m.ndim != 2 or m.shape[1] < n or sorted(order.tolist()) != list(range(n)):
        raise ValueError(f"order must be a permutation of the {n} rows of a [n, K ≥ n] matrix, got shape {m.shape}")
    m = m[:, :n]
    if not np.isfinite(m).all():
        raise ValueError("scores must be finite")
    return monotone_scores(soft_rank(m, tau, iters)[order])


def monotone_scores(values) -> np.ndarray:
    """``values`` (one per rank position, best first) made non-increasing by isotonic regression and clipped to
    [0, 1]: ``[n]`` float64 (step 3 of :func:`relevance_scores`)."""
    return np.clip(_isotonic_decreasing(np.asarray(values, dtype=np.float64)), 0.0, 1.0)


def soft_rank(scores: np.ndarray, tau: float = SINKHORN_TAU, iters: int = SINKHORN_ITERS) -> np.ndarray:
    """Sinkhorn soft rank of each item of a finite score matrix ``[n, K ≥ n]``: ``[n]`` float64 in [0, 1],
    ``1 − E_S[position of i] / (n − 1)`` with ``S = Sinkhorn(exp(M[:n, :n] / τ))`` (steps 1-2 of
    :func:`relevance_scores`; paper §3.3). Item order is the rows' (not a ranking); ``n = 1`` → ``[1.0]``.
    """
    m = np.asarray(scores, dtype=np.float64)
    n = m.shape[0]
    if n == 1:
        return np.ones(1)
    x = m[:, :n] / tau
    for _ in range(iters):
        x = x - _logsumexp(x, axis=1)
        x = x - _logsumexp(x, axis=0)
    return np.exp(x) @ (np.arange(n - 1, -1, -1, dtype=np.float64) / (n - 1))


def _logsumexp(x: np.ndarray, axis: int) -> np.ndarray:
    top = x.max(axis=axis, keepdims=True)
    return top + np.log(np.exp(x - top).sum(axis=axis, keepdims=True))
