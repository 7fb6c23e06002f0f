"""Decode: score matrix → ranking by maximum-weight assignment (LAPJV), torch-free.

hLLM (paper §3.4) ranks by the assignment of items to rank positions that maximises the total
score ``Σ_i M[i, π(i)]``; a valid permutation by construction. A slate of N items uses only the first
N position columns of ``M [N, K]``, so the assignment is square N×N. Solved with the Jonker-Volgenant
algorithm from the ``lap`` package (``lap.lapjv``, https://github.com/gatagat/lap) on float64 costs
``-M``. ``lap.lapjv`` silently returns a permutation for NaN/inf costs, so finiteness is checked first.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from hllm.errors import DecodeError


def decode(scores: np.ndarray, n_items: int | None = None) -> np.ndarray:
    """Ranking of one slate from its score matrix.

    Args:
        scores: ``[N_pad, K]`` float array, rows = items, columns = rank positions (0 = top).
        n_items: number of real items n (rows ``0..n-1``); default all rows. Requires n ≤ K.
    Returns:
        ``[n]`` int64 array ``ranking`` with ``ranking[p]`` = index of the item placed at position p.
    Raises:
        DecodeError: wrong rank, n > K or n < 1, or a non-finite score among the n×n used.
    """
    if scores.ndim != 2:
        raise DecodeError(f"scores must be 2-D [N, K], got shape {scores.shape}")
    n = scores.shape[0] if n_items is None else int(n_items)
    k = scores.shape[1]
    if n < 1 or n > scores.shape[0]:
        raise DecodeError(f"n_items={n} is outside 1..{scores.shape[0]}")
    if n > k:
        raise DecodeError(f"{n} items but only K={k} rank positions")
    sub = np.asarray(scores[:n, :n], dtype=np.float64)
    if not np.isfinite(sub).all():
        bad = int((~np.isfinite(sub)).sum())
        raise DecodeError(f"score matrix has {bad} non-finite value(s); refusing to rank")
    if n == 1:
        return np.zeros(1, dtype=np.int64)
    import lap

    # cost = -scores: lapjv minimises. y[j] = row (item) assigned to column (position) j.
    _, _, y = lap.lapjv(np.ascontiguousarray(-sub), extend_cost=False)
    ranking = np.asarray(y, dtype=np.int64)
    check_permutation(ranking, n)
    return ranking


def decode_batch(scores: np.ndarray, n_items: Sequence[int]) -> list[np.ndarray]:
    """Rankings of B slates: ``scores [B, N_pad, K]`` and ``n_items [B]`` → list of ``[n_b]`` int64.

    Raises: DecodeError as :func:`decode`, naming the slate index.
    """
    if scores.ndim != 3 or scores.shape[0] != len(n_items):
        raise DecodeError(f"scores must be [B, N, K] with B={len(n_items)}, got {scores.shape}")
    out = []
    for b, n in enumerate(n_items):
        try:
            out.append(decode(scores[b], int(n)))
        except DecodeError as e:
            raise DecodeError(f"slate {b}: {e}") from None
    return out


def check_permutation(ranking: np.ndarray, n: int) -> None:
    """Raise DecodeError unless ``ranking`` is a permutation of ``0..n-1``."""
    if ranking.shape != (n,) or not np.array_equal(np.sort(ranking), np.arange(n)):
        raise DecodeError(f"decoder returned {ranking.tolist()}, not a permutation of 0..{n - 1}")


def assignment_scores(scores: np.ndarray, ranking: np.ndarray) -> np.ndarray:
    """Score of each item at its assigned position: ``[n]`` float, in ranking order."""
    return np.asarray(scores[ranking, np.arange(len(ranking))], dtype=np.float64)
