"""Sequential fail-fast for the gate (:mod:`hllm.verify.gate`): score a tested graph in chunks and stop it as
soon as it can no longer pass.

Used by :func:`run_gate` with ``fail_fast`` (:func:`hopeless` decides): a tested graph is
scored in chunks and stopped as soon as it can no longer pass. Exact rules (whatever the slates still
to come): a non-finite score; mean tau below the floor even if every remaining slate had tau 1; p95
regret above the limit even if every remaining slate had regret 0; (strict) more top-1 misses than the
rule allows over all slates. One statistical futility rule (quality mode): at the looks after 25%, 50%
and 75% of the slates (at least 20 labelled ones), stop when the one-sided upper confidence bound of a
mean difference is already below −margin, at a per-test level of ``futility_alpha`` / (3 looks × 3
metrics) (Bonferroni), so a non-inferior graph is stopped wrongly with probability ≤
``futility_alpha`` (1%). A stop can only fail a tested graph, never pass one: passing always needs every
slate, so the 5% error of the quality test ((a) in :mod:`hllm.verify.gate`) is that of the fixed-sample test.
"""

from __future__ import annotations

import math
from dataclasses import replace
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
    """Why the tested graph behind ``report`` (its first slates of ``planned``) can no longer pass, or None.

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
    them against ``ref_scores``; with ``fail_fast``, stop as soon as :func:`hopeless` says the tested graph can
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


#: Sequential gate: the fractions of the planned slates at which it looks (pass early, or stop for futility).
SEQUENTIAL_LOOKS = (0.25, 0.5, 0.75, 1.0)


def look_thresholds(thresholds: GateThresholds, looks: int) -> GateThresholds:
    """The thresholds of one look of a sequential gate with ``looks`` looks: the same margins and fidelity
    floor, the bounds of (a) at confidence ``1 − (1 − confidence) / looks`` (Bonferroni over the looks:
    the chance that some look passes a graph that is not non-inferior stays ≤ 1 − confidence)."""
    return replace(thresholds, confidence=1.0 - (1.0 - thresholds.confidence) / max(1, looks))


def clears(report: GateReport) -> bool:
    """Whether ``report`` (a look of a sequential gate, quality mode) already passes: every bound of (a)
    computed (≥ :data:`FUTILITY_MIN_SLATES` labelled slates) and within its margin, and the fidelity floor
    held on the slates scored."""
    d = report.deltas
    if report.thresholds.mode != "quality" or d is None or d.shape[0] < FUTILITY_MIN_SLATES:
        return False
    return len(report.quality()) == len(QUALITY_METRICS) and report.passed


def sequential_gate(ref_scores: Sequence[np.ndarray], score: Callable[[Sequence[dict]], list[np.ndarray]],
                    slates: Sequence[dict], thresholds: GateThresholds | None = None, block: int = 10,
                    on_progress=None, **labels) -> GateReport:
    """Gate a tested graph over up to all of ``slates`` (labelled eval slates), scored ``block`` at a time,
    deciding as early as the evidence allows (quality mode; strict mode = :func:`gate_stream` with fail-fast):

    * at each look (:data:`SEQUENTIAL_LOOKS` of the slates) the bounds of (a) are computed at the Bonferroni
      level of :func:`look_thresholds`; when every one clears its margin and the fidelity floor holds
      (:func:`clears`) the tested graph **passes** there, on the slates scored so far;
    * after every block, :func:`hopeless` stops it (**fail**) as soon as it can no longer pass (exact rules
      and the futility rule);
    * otherwise it runs to the last slate, where the verdict is the gate's at the look level.

    ``ref_scores`` are the reference's matrices of ``slates`` (compute them once per slate set:
    :func:`hllm.verify.reference.reference_scores`, cached by content with :func:`hllm.verify.reference.reference_key`).
    The report's ``sequential`` record says how many slates it needed: ``{slates_needed, slates_available,
    looks, decision: pass-early | fail-early | all-slates, confidence_per_look}``.
    Raises: what ``score`` raises; ValueError from :func:`gate_scores`.
    """
    th = thresholds or GateThresholds()
    n = len(slates)
    if th.mode != "quality":
        return gate_stream(ref_scores, score, slates, th, True, block, on_progress, **labels)
    looks = sorted({max(1, math.ceil(f * n)) for f in SEQUENTIAL_LOOKS})
    lth = look_thresholds(th, len(looks))
    got: list[np.ndarray] = []
    decision, rep = "all-slates", None
    for i in range(0, n, max(1, block)):
        part = score(slates[i:i + block])
        got += part
        if on_progress is not None:
            on_progress(len(part))
        k = len(got)
        at_look = any(k - len(part) < x <= k for x in looks)
        if k >= n:
            break
        rep = gate_scores(ref_scores[:k], got, slates[:k], lth, planned=n, **labels)
        why = hopeless(rep, n, at_look)
        if why:
            rep.stop_reason, decision = why, "fail-early"
            break
        if at_look:
            early = gate_scores(ref_scores[:k], got, slates[:k], lth, **labels)
            if clears(early):
                rep, decision = early, "pass-early"
                rep.stop_reason = f"passed at the look after {k} of {n} slates"
                break
    if decision == "all-slates":
        rep = gate_scores(ref_scores, got, slates, lth, **labels)
    rep.extra["sequential"] = {"slates_needed": len(got), "slates_available": n, "looks": looks,
                               "decision": decision, "confidence_per_look": lth.confidence}
    return rep


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
    sequential: bool = False,
) -> GateReport:
    """Run the tested artefact ``test`` (export dir / .onnx / Ranker) on ``slates`` and gate it
    (:func:`gate_stream`; ``fail_fast`` stops it once it can no longer pass; ``sequential``: the sequential
    gate of :func:`sequential_gate`, which also passes it early once every bound clears its margin).

    Raises:
        SlateError: an evaluation slate was used for calibration (:func:`check_disjoint`).
        EngineError: the artefact cannot be loaded or run.
    """
    check_disjoint(calibration_ids, slates)
    r = test if isinstance(test, Ranker) else cpu_ranker(test, threads)
    with r:
        score = lambda part: score_slates([r.engine], r.builder, part, batch_size)[0]  # noqa: E731
        labels = dict(precision=str(r.engine.precision), backend=r.engine.name)
        if sequential:
            return sequential_gate(ref_scores, score, slates, thresholds, chunk, on_progress, **labels)
        return gate_stream(ref_scores, score, slates, thresholds, fail_fast, chunk, on_progress, **labels)
