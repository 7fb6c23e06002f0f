"""Ranking quality on labelled slates (paper §4, Table 1 metrics), torch-free.

For one slate with 0/1 labels and a ranking ``order`` (0-based candidate indices, best first):

* AUC: the fraction of (positive, negative) pairs in which the positive is ranked above the
  negative (probability that a positive is ranked above a negative).
* Recall@k: positives in the top k / all positives.
* NDCG@k: DCG@k / IDCG@k with binary gains, ``DCG@k = Σ_{p<k} rel_p / log2(p + 2)`` (p 0-based).

Reported values are means over slates that have at least one positive and one negative (the
others are counted in ``skipped``), each with a 95% percentile-bootstrap interval over slates
(``ci95``: 1,000 resamples of the slates with replacement, seeded; Efron & Tibshirani 1993, ch. 13), so
"ranker A beats ranker B" can be read off non-overlapping intervals. Two rankers on the same slates are
compared more sharply by :func:`paired_difference`: the per-slate difference B − A, its mean and a
bootstrap interval that resamples slates jointly (the slate-to-slate variance both share cancels).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from hllm.errors import SlateError

METRIC_KEYS = ("auc", "recall@1", "recall@10", "ndcg@1", "ndcg@10")


def _check(order: Sequence[int], labels: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    o = np.asarray(order, dtype=np.int64)
    y = np.asarray(labels, dtype=np.float64)
    if o.ndim != 1 or y.ndim != 1 or sorted(o.tolist()) != list(range(y.size)):
        raise SlateError(f"ranking is not a permutation of the {y.size} labelled candidates")
    return o, y


def slate_metrics(order: Sequence[int], labels: Sequence[int]) -> dict[str, float] | None:
    """AUC, Recall@1/10 and NDCG@1/10 of one ranking; None if the slate has no positive or no negative.

    Args:
        order: permutation of ``range(n)``, best first.
        labels: n values, 1 = positive (clicked/bought), 0 = negative.
    Raises: SlateError if ``order`` is not a permutation of the candidates.
    """
    o, y = _check(order, labels)
    rel = y[o] > 0  # relevance by rank position
    n_pos = int(rel.sum())
    n_neg = rel.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return None
    negs_below = np.cumsum(~rel[::-1])[::-1]  # negatives at this position or lower
    auc = float(negs_below[rel].sum()) / (n_pos * n_neg)
    out = {"auc": auc}
    discounts = 1.0 / np.log2(np.arange(rel.size) + 2.0)
    for k in (1, 10):
        out[f"recall@{k}"] = float(rel[:k].sum()) / n_pos
        idcg = float(discounts[: min(k, n_pos)].sum())
        out[f"ndcg@{k}"] = float((rel[:k] * discounts[:k]).sum()) / idcg
    return {k: out[k] for k in METRIC_KEYS}


@dataclass
class QualityReport:
    """Mean metrics over slates. ``slates`` = slates scored; ``skipped`` = without positive/negative;
    ``ci95[k]`` = (low, high) 95% bootstrap interval of the mean of metric k (None without slates)."""

    values: dict[str, float]
    slates: int
    skipped: int
    ci95: dict[str, tuple[float, float]] | None = None

    def to_dict(self) -> dict:
        d = {k: round(self.values[k], 6) if not math.isnan(self.values[k]) else None for k in METRIC_KEYS}
        d["slates"] = self.slates
        d["skipped"] = self.skipped
        d["ci95"] = None if self.ci95 is None else {k: [round(lo, 6), round(hi, 6)] for k, (lo, hi) in self.ci95.items()}
        return d


def bootstrap_ci(values: np.ndarray, resamples: int = 1000, seed: int = 0, level: float = 0.95) -> list[tuple[float, float]]:
    """Percentile-bootstrap intervals of the column means of ``values [n_slates, n_metrics]``.

    Returns one ``(low, high)`` per column. Raises: SlateError for an empty input.
    """
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 2 or v.shape[0] == 0:
        raise SlateError("bootstrap needs at least one slate")
    idx = np.random.default_rng(seed).integers(0, v.shape[0], size=(resamples, v.shape[0]))
    means = v[idx].mean(axis=1)  # [resamples, n_metrics]
    a = (1 - level) / 2 * 100
    lo, hi = np.percentile(means, [a, 100 - a], axis=0)
    return [(float(x), float(y)) for x, y in zip(lo, hi)]


def evaluate(orders: Iterable[Sequence[int]], labels: Iterable[Sequence[int]], resamples: int = 1000,
             seed: int = 0) -> QualityReport:
    """Mean of :func:`slate_metrics` over paired rankings and label lists (NaN when no slate counts),
    with :func:`bootstrap_ci` intervals (``resamples`` = 0 skips them)."""
    rows, skipped = [], 0
    for o, y in zip(orders, labels, strict=True):
        m = slate_metrics(o, y)
        if m is None:
            skipped += 1
        else:
            rows.append(m)
    values = {k: float(np.mean([r[k] for r in rows])) if rows else float("nan") for k in METRIC_KEYS}
    ci = None
    if rows and resamples:
        table = np.array([[r[k] for k in METRIC_KEYS] for r in rows])
        ci = dict(zip(METRIC_KEYS, bootstrap_ci(table, resamples, seed)))
    return QualityReport(values, len(rows), skipped, ci)


MIN_PAIRED = 10  # fewer slates: no paired interval (a bootstrap of 1-9 slates is degenerate or too coarse)


@dataclass
class PairedDifference:
    """Per-metric mean of ``metric(B) − metric(A)`` over the slates both rankers can be scored on, with a
    95% paired bootstrap interval (``ci95``; None below ``MIN_PAIRED`` slates). ``slates`` = slates compared."""

    delta: dict[str, float]
    slates: int
    ci95: dict[str, tuple[float, float]] | None = None

    def to_dict(self) -> dict:
        return {"delta": {k: None if math.isnan(v) else round(v, 6) for k, v in self.delta.items()}, "slates": self.slates,
                "ci95": None if self.ci95 is None else {k: [round(lo, 6), round(hi, 6)] for k, (lo, hi) in self.ci95.items()}}


def paired_difference(orders_a: Sequence[Sequence[int]], orders_b: Sequence[Sequence[int]],
                      labels: Sequence[Sequence[int]], resamples: int = 1000, seed: int = 0) -> PairedDifference:
    """Ranker B minus ranker A on the same labelled slates, slate by slate (a paired comparison).

    Args:
        orders_a, orders_b: per slate, a permutation of its candidates (best first), same slate order.
        labels: per slate, 0/1 labels. Slates without a positive or without a negative are left out.
        resamples: bootstrap resamples of the slates (0 skips the interval); seed fixes them. With fewer
            than ``MIN_PAIRED`` (10) comparable slates there is no interval.
    Returns: :class:`PairedDifference`; B is better on a metric when its whole ``ci95`` is above 0.
    Raises: SlateError when the three lists differ in length or an order is not a permutation.
    """
    d = paired_rows(orders_a, orders_b, labels)
    rows = d.tolist()
    if not rows:
        return PairedDifference({k: float("nan") for k in METRIC_KEYS}, 0, None)
    ci = dict(zip(METRIC_KEYS, bootstrap_ci(d, resamples, seed))) if resamples and len(rows) >= MIN_PAIRED else None
    return PairedDifference(dict(zip(METRIC_KEYS, d.mean(axis=0).tolist())), len(rows), ci)


def paired_rows(orders_a: Sequence[Sequence[int]], orders_b: Sequence[Sequence[int]],
                labels: Sequence[Sequence[int]]) -> np.ndarray:
    """Per-slate differences ``metric(B) − metric(A)`` of two rankers on the same labelled slates.

    Args: as :func:`paired_difference`. Slates without a positive or without a negative are left out.
    Returns: float64 ``[n_slates_compared, len(METRIC_KEYS)]``, columns in :data:`METRIC_KEYS` order
        (``[0, 5]`` when no slate can be compared).
    Raises: SlateError when the three lists differ in length or an order is not a permutation.
    """
    if not len(orders_a) == len(orders_b) == len(labels):
        raise SlateError(f"paired comparison needs the same slates: {len(orders_a)}, {len(orders_b)} orders, "
                         f"{len(labels)} label lists")
    rows = []
    for a, b, y in zip(orders_a, orders_b, labels):
        ma, mb = slate_metrics(a, y), slate_metrics(b, y)
        if ma is not None and mb is not None:
            rows.append([mb[k] - ma[k] for k in METRIC_KEYS])
    return np.array(rows, dtype=np.float64).reshape(len(rows), len(METRIC_KEYS))


def order_from_scores(scores: Sequence[float]) -> list[int]:
    """Best-first order of per-candidate scores; ties keep the original candidate order (stable)."""
    s = np.asarray(scores, dtype=np.float64)
    return np.argsort(-s, kind="stable").tolist()
