"""Sequential fail-fast for the gate (:mod:`hllm.verify.gate`): score a candidate in chunks and stop it as
soon as it can no longer pass.

Used by :func:`run_gate` with ``fail_fast`` (:func:`hopeless` decides): a candidate is
scored in chunks and stopped as soon as it can no longer pass. Exact rules (whatever the slates still
to come): a non-finite score; mean tau below the floor even if every remaining slate had tau 1; p95
regret above the limit even if every remaining slate had regret 0; (strict) more top-1 misses than the
rule allows over all slates. One statistical futility rule (quality mode): at the looks after 25%, 50%
and 75% of the slates (at least 20 labelled ones), stop when the one-sided upper confidence bound of a
mean difference is already below −margin, at a per-test level of ``futility_alpha`` / (3 looks × 3
metrics) (Bonferroni), so a non-inferior candidate is stopped wrongly with probability ≤
``futility_alpha`` (1%). A stop can only fail a candidate, never pass one: passing always needs every
slate, so the 5% error of the quality test ((a) in :mod:`hllm.verify.gate`) is that of the fixed-sample test.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from hllm.runtime.ranker import Ranker
from hllm.verify.gate import QUALITY_METRICS, GateReport, GateThresholds, check_disjoint, gate_scores, p95
from hllm.verify.metrics import METRIC_KEYS, bootstrap_ci
from hllm.verify.reference import cpu_ranker
from hllm.verify.scoring import score_slates


#: Fail-fast: the fractions of the planned slates after which the futility rule of (a) is evaluated.
FUTILITY_LOOKS = (0.25, 0.5, 0.75)
#: Fail-fast: the fewest labelled slates a futility look needs.
FUTILITY_MIN_SLATES = 20


def hopeless(report: GateReport, planned: int, look: bool = False) -> str | None:
    """Why the candidate behind ``report`` (its first slates of ``planned``) can no longer pass, or None.

    Exact rules (module doc): a non-finite score beyond ``max_nonfinite``; (quality) the mean tau even
    with tau 1 on every remaining slate below ``min_tau``, or the p95 regret even with regret 0 on every
    remaining slate above ``max_regret_p95``; (strict) more top-1 misses than ``(1 − min_top1) · planned``.
    With ``look`` (quality mode, ≥ :data:`FUTILITY_MIN_SLATES` labelled slates): the futility rule, the
    one-sided upper bound of a mean difference below −margin at level ``futility_alpha / (3 looks × 3
    metrics)``. Returns a one-line reason.
    """
    t, recs = report.thresholds, report.records
    k, rest = len(recs), max(0, planned - len(recs))
    nonfinite = sum(r.nonfinite for r in recs)
    if nonfinite > t.max_nonfinite:
        return f"{nonfinite} non-finite score(s) (at most {t.max_nonfinite} allowed)"
    if t.mode == "strict":
        misses = sum(not r.top1_match for r in recs)
        allowed = math.floor((1.0 - t.min_top1) * planned + 1e-9)
        if misses > allowed:
            return f"{misses} top-1 disagreements in {k} slates (at most {allowed} of {planned} allowed)"
        return None
    if t.min_tau is not None and planned:
        best = (sum(r.kendall_tau for r in recs) + rest) / planned
        if best < t.min_tau - 1e-12:
            return f"mean Kendall tau can reach at most {best:.4f} (< {t.min_tau}) even if the remaining slates agree"
    best_p95 = p95(list(report.regrets) + [0.0] * rest)
    if best_p95 > t.max_regret_p95 + 1e-12:
        return f"p95 regret is at least {best_p95:.3g} (> {t.max_regret_p95:g}) even with no regret on the remaining slates"
    d = report.deltas
    if look and d is not None and d.shape[0] >= FUTILITY_MIN_SLATES:
        alpha = t.futility_alpha / (len(FUTILITY_LOOKS) * len(QUALITY_METRICS))
        cols = [METRIC_KEYS.index(m) for m in QUALITY_METRICS]
        ci = bootstrap_ci(d[:, cols], max(t.resamples, 10_000), t.seed, level=1 - 2 * alpha)
        for m, (_, hi) in zip(QUALITY_METRICS, ci):
            if hi < -t.margin(m):
                return (f"futility: the {1 - alpha:.2%} upper bound of mean {m} change after {d.shape[0]} labelled "
                        f"slates is {hi:+.4f} < −{t.margin(m)}")
    return None


def gate_stream(ref_scores: Sequence[np.ndarray], score: Callable[[Sequence[dict]], list[np.ndarray]],
                slates: Sequence[dict], thresholds: GateThresholds | None = None, fail_fast: bool = True,
                chunk: int = 10, on_progress=None, **labels) -> GateReport:
    """Score ``slates`` ``chunk`` at a time with ``score`` (slates → their ``[n_i, K]`` matrices) and gate
    them against ``ref_scores``; with ``fail_fast``, stop as soon as :func:`hopeless` says the candidate can
    no longer pass (the report then covers the slates scored, ``planned`` = all: a failure).

    ``labels``: ``precision`` / ``reference`` / ``backend`` of the report. ``on_progress(n)``: after each chunk.
    Raises: what ``score`` raises; ValueError from :func:`gate_scores`.
    """
    th = thresholds or GateThresholds()
    n = len(slates)
    looks = sorted({max(1, math.ceil(f * n)) for f in FUTILITY_LOOKS})
    got: list[np.ndarray] = []
    for i in range(0, n, max(1, chunk)):
        part = score(slates[i:i + chunk])
        got += part
        if on_progress is not None:
            on_progress(len(part))
        if not fail_fast or len(got) >= n:
            continue
        k = len(got)
        rep = gate_scores(ref_scores[:k], got, slates[:k], th, planned=n, **labels)
        look = any(k - len(part) < x <= k for x in looks)
        why = hopeless(rep, n, look)
        if why:
            rep.stop_reason = why
            return rep
    return gate_scores(ref_scores, got, slates, th, planned=n, **labels)


def run_gate(
    ref_scores: Sequence[np.ndarray],
    test,
    slates: Sequence[dict],
    thresholds: GateThresholds | None = None,
    calibration_ids: Sequence[str] = (),
    batch_size: int = 1,
    on_progress=None,
    threads: int | None = None,
    fail_fast: bool = False,
    chunk: int = 10,
) -> GateReport:
    """Run the candidate artefact ``test`` (export dir / .onnx / Ranker) on ``slates`` and gate it
    (:func:`gate_stream`; ``fail_fast`` stops it once it can no longer pass).

    Raises:
        SlateError: an evaluation slate was used for calibration (:func:`check_disjoint`).
        EngineError: the artefact cannot be loaded or run.
    """
    check_disjoint(calibration_ids, slates)
    r = test if isinstance(test, Ranker) else cpu_ranker(test, threads)
    with r:
        return gate_stream(ref_scores, lambda part: score_slates([r.engine], r.builder, part, batch_size)[0], slates,
                           thresholds, fail_fast, chunk, on_progress, precision=str(r.engine.precision),
                           backend=r.engine.name)
