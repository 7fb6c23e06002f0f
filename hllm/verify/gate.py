"""The gate of a reduced-precision graph: does it rank as well as the FP32 reference? (torch-free)

Tensor closeness is the wrong test for a ranker, and so is agreement alone: a model whose FP32 top-1
margin is tiny on some slates has near-ties that any change of arithmetic breaks either way, without
changing how good the rankings are. The gate therefore judges the tested graph by the task, on held-out
labelled slates, with a tolerance and an interval — the way NNCF's ``quantize_with_accuracy_control``
(``max_drop`` on a user ``validation_fn``) and Intel Neural Compressor's ``AccuracyCriterion
(tolerable_loss)`` judge quantized models — plus a fidelity floor that catches broken engines.

``mode="quality"`` (the default) passes when both hold:

(a) **quality non-inferiority**: per labelled slate, the difference tested − FP32 of AUC, NDCG@10
    and Recall@10 (:func:`hllm.verify.metrics.paired_rows`); a paired percentile bootstrap over slates
    (:func:`hllm.verify.metrics.bootstrap_ci`, ``resamples`` draws, seeded) gives the one-sided
    ``confidence`` (95%) lower bound of each mean difference, which must be ≥ −margin (defaults:
    0.005 AUC, 0.01 NDCG@10, 0.01 Recall@10). Needs ≥ :data:`hllm.verify.metrics.MIN_PAIRED` labelled
    slates; with fewer, (a) is reported as not checked and the verdict rests on (b).
(b) **fidelity floor**: mean Kendall tau between the two rankings ≥ 0.9, the 95th percentile over
    slates of the assignment regret ≤ 1e-3, and no non-finite score. The regret of one slate
    (:func:`assignment_regret`) measures the tested graph's permutation by the FP32 model's own objective,
    the assignment objective ``J(π) = Σ_i M[i, π(i)]`` that hLLM decodes by (paper §3.4, eq. 1):
    ``(J(π_fp32) − J(π_cand)) / (J(π_fp32) − E_π J(π))`` with ``M`` the FP32 score matrix of the slate,
    ``π_fp32`` its optimum and ``E_π J(π) = Σ_ij M[i, j] / n`` the mean over uniformly random
    permutations: 0 = as good as the optimum, 1 = no better than a random order.

``mode="strict"`` keeps the agreement rule: top-1 agreement ≥ 0.97, point |ΔRecall@10| ≤ 0.01, point
|ΔAUC| ≤ 0.005, no non-finite score. Whatever the mode, every criterion is computed and reported
(:meth:`GateReport.criteria_report`: value, interval, the number compared, limit, passed, ``missed_by``);
the mode decides which ones the verdict requires.

Sequential fail-fast, stopping a tested graph once it can no longer pass: :mod:`hllm.verify.sequential`
(:func:`~hllm.verify.sequential.run_gate` scores an artefact and gates it). The reference's scores are computed
once and may be cached: :mod:`hllm.verify.reference`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np

from hllm.errors import SlateError
from hllm.files import json_safe
from hllm.verify.metrics import METRIC_KEYS, MIN_PAIRED, bootstrap_ci, evaluate, paired_rows
from hllm.verify.parity import ComparisonSummary, Failure, SlateComparison, Verdict, compare_slate
from hllm.runtime.slates import slate_ids

#: The gate's modes (``--gate``): ``quality`` = (a) + (b) of the module doc; ``strict`` = agreement rule.
GATE_MODES = ("quality", "strict")
#: The quality metrics of (a), as :data:`hllm.verify.metrics.METRIC_KEYS` names them.
QUALITY_METRICS = ("auc", "ndcg@10", "recall@10")


@dataclass
class GateThresholds:
    """Pass criteria of the gate (module doc: what each mode requires and why).

    Attributes:
        mode: ``quality`` (default; (a) + (b)) or ``strict`` (the agreement rule).
        auc_margin, ndcg10_margin, recall10_margin: non-inferiority margins of (a), in the metric's units
            (fractions in [0, 1]): the one-sided lower bound of mean Δ must be ≥ −margin (defaults
            0.005, 0.01, 0.01).
        confidence: one-sided confidence of the bounds of (a) (default 0.95).
        resamples: bootstrap resamples of (a) (default 2000); seed: their seed (default 0).
        min_tau: fidelity floor (b): min mean Kendall tau (default 0.9; None = not checked).
        max_regret_p95: fidelity floor (b): max 95th percentile over slates of the assignment regret
            (:func:`assignment_regret`, dimensionless; default 1e-3).
        max_nonfinite: max number of non-finite scores (default 0; both modes).
        min_top1: strict: min fraction of slates whose top item is the reference's (default 0.97).
        max_recall10_delta: strict: max |mean Recall@10 change| (default 0.01; labelled slates only).
        max_auc_delta: strict: max |mean AUC change| (default 0.005; labelled slates only).
        futility_alpha: fail-fast: max probability of stopping a tested graph that would pass (a) (default 0.01).
    Raises: ValueError for an unknown mode or a limit outside its range (fractions and margins in [0, 1],
        tau in [-1, 1], confidence in (0.5, 1), futility_alpha in (0, 0.5), resamples ≥ 100).
    """

    mode: str = "quality"
    auc_margin: float = 0.005
    ndcg10_margin: float = 0.01
    recall10_margin: float = 0.01
    confidence: float = 0.95
    resamples: int = 2000
    seed: int = 0
    min_tau: float | None = 0.9
    max_regret_p95: float = 1e-3
    max_nonfinite: int = 0
    min_top1: float = 0.97
    max_recall10_delta: float = 0.01
    max_auc_delta: float = 0.005
    futility_alpha: float = 0.01

    def __post_init__(self) -> None:
        """Raise ValueError for a limit no graph could meet or that checks nothing."""
        if self.mode not in GATE_MODES:
            raise ValueError(f"gate mode must be one of {', '.join(GATE_MODES)}, got {self.mode!r}")
        for name in ("min_top1", "max_recall10_delta", "max_auc_delta", "auc_margin", "ndcg10_margin",
                     "recall10_margin", "max_regret_p95"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {v}")
        if self.min_tau is not None and not -1.0 <= self.min_tau <= 1.0:
            raise ValueError(f"min_tau must be in [-1, 1], got {self.min_tau}")
        if not 0.5 < self.confidence < 1.0:
            raise ValueError(f"confidence must be in (0.5, 1), got {self.confidence}")
        if not 0.0 < self.futility_alpha < 0.5:
            raise ValueError(f"futility_alpha must be in (0, 0.5), got {self.futility_alpha}")
        if self.resamples < 100:
            raise ValueError(f"resamples must be ≥ 100, got {self.resamples}")
        if self.max_nonfinite < 0:
            raise ValueError(f"max_nonfinite must be ≥ 0, got {self.max_nonfinite}")

    def margin(self, metric: str) -> float:
        """The non-inferiority margin of a metric of :data:`QUALITY_METRICS`."""
        return {"auc": self.auc_margin, "ndcg@10": self.ndcg10_margin, "recall@10": self.recall10_margin}[metric]

    def to_dict(self) -> dict:
        return asdict(self)


def label_metrics(orders: Sequence[Sequence[int]], slates: Sequence[dict]) -> dict | None:
    """Mean Recall@1, Recall@10, NDCG@10 (and AUC, NDCG@1) of rankings against the slates' ``labels``,
    computed by :func:`hllm.verify.metrics.evaluate`; None if no slate has a positive and a negative label."""
    rows = [(o, s["labels"]) for o, s in zip(orders, slates) if s.get("labels") and any(s["labels"])]
    if not rows:
        return None
    rep = evaluate([o for o, _ in rows], [y for _, y in rows])
    if not rep.slates:
        return None
    return {**rep.values, "labelled_slates": rep.slates}


def check_disjoint(calibration_ids: Sequence[str], eval_slates: Sequence[dict]) -> None:
    """Refuse to gate on slates that were used for calibration.

    Raises:
        SlateError: naming how many evaluation slate ids are also calibration slate ids (and a few).
    """
    cal = set(map(str, calibration_ids))
    both = sorted(set(slate_ids(eval_slates)) & cal)  # id-less slates: their index (the one id rule)
    if both:
        raise SlateError(
            f"{len(both)} evaluation slate(s) were used for calibration (e.g. {both[:3]}); "
            "gate on held-out slates (calibrate on the train split, gate on eval)"
        )


def assignment_regret(ref: np.ndarray, ref_order: Sequence[int], test_order: Sequence[int] | None) -> float:
    """Assignment regret of a tested ranking of one slate, judged by the reference's scores.

    With ``M = ref[:n, :n]`` (float64; rows = items, columns = rank positions) and the objective
    ``J(π) = Σ_p M[π_p, p]`` that hLLM maximises (paper §3.4, eq. 1; ``π_p`` = item at position p):
    ``regret = (J(ref_order) − J(test_order)) / (J(ref_order) − Σ_ij M[i, j] / n)``, the objective the
    tested permutation loses, relative to the distance of the optimum from the mean over uniformly
    random permutations. 0 = optimal, 1 = no better than a random order.

    Args:
        ref: ``[n_pad, K]`` float reference scores of the slate. ref_order: the reference's optimal
            permutation (length n). test_order: the tested permutation, or None when the tested
            scores could not be decoded (non-finite): then the regret is +inf.
    Returns: the regret, ≥ 0 (float round-off below 0 is clipped); 0 when every permutation has the same
        objective (``n = 1`` or a constant matrix).
    """
    if test_order is None:
        return math.inf
    n = len(ref_order)
    m = np.asarray(ref, dtype=np.float64)[:n, :n]
    pos = np.arange(n)
    best = float(m[np.asarray(ref_order), pos].sum())
    got = float(m[np.asarray(test_order), pos].sum())
    span = best - float(m.sum()) / n
    if not span > 0.0:
        return 0.0
    return max(0.0, (best - got) / span)


def p95(values: Sequence[float]) -> float:
    """95th percentile (numpy's linear interpolation) of values that may hold +inf (then inf, never NaN); NaN
    for no values."""
    if not len(values):
        return float("nan")
    big = np.finfo(np.float64).max
    v = float(np.percentile(np.minimum(np.asarray(values, dtype=np.float64), big), 95))
    return math.inf if v >= big else v


@dataclass
class Criterion:
    """One criterion of the gate, as the report shows it.

    Attributes:
        name: e.g. ``auc_delta``, ``kendall_tau_mean``, ``regret_p95``, ``top1_agreement``.
        group: ``quality`` (a), ``fidelity`` (b), ``strict`` (c) or ``run`` (all slates scored).
        value: the point estimate (a mean difference, a mean, a percentile, a count); None = not computable.
        interval: for (a), the two-sided ``2·confidence − 1`` bootstrap interval of the mean (its lower end
            is the one-sided ``confidence`` lower bound); None otherwise.
        tested: the number compared with ``limit`` (the lower bound for (a), the value otherwise).
        limit, op: the pass condition ``tested op limit`` (``>=`` / ``<=``).
        required: whether the verdict of the gate's mode depends on it.
        passed: the outcome; None = not checked (``note`` says why).
        missed_by: how far ``tested`` is on the wrong side of ``limit`` (None when it passed).
    """

    name: str
    group: str
    value: float | None
    tested: float | None
    limit: float
    op: str
    required: bool
    interval: tuple[float, float] | None = None
    passed: bool | None = None
    missed_by: float | None = None
    note: str = ""

    def __post_init__(self) -> None:
        if self.passed is None and self.tested is not None:
            t = self.tested
            ok = t <= self.limit + 1e-12 if self.op == "<=" else t >= self.limit - 1e-12
            self.passed = bool(ok)
            self.missed_by = None if ok else (math.inf if not math.isfinite(t) else abs(t - self.limit))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["interval"] = None if self.interval is None else list(self.interval)
        return json_safe(d)


@dataclass
class GateReport(Verdict):
    """Verdict of the gate: ``bool(report)`` = passed (module doc: criteria and modes).

    Attributes: ``records`` (one :class:`hllm.verify.parity.SlateComparison` per slate scored),
    ``thresholds``, the label metrics of the reference and the tested rankings (means over labelled
    slates, :func:`label_metrics`), ``regrets`` (per slate, :func:`assignment_regret`), ``deltas``
    (per labelled slate, tested − reference of :data:`hllm.verify.metrics.METRIC_KEYS`,
    ``[n, 5]`` float64), ``planned`` (slates the run was to score; fewer = stopped early, a failure),
    ``stop_reason``.

    :meth:`to_dict` keys: the :class:`hllm.verify.parity.ComparisonSummary` fields (slates,
    top1_agreement, kendall_tau_mean, ...), ``gate`` (the mode), ``criteria`` (every criterion with value,
    interval, limit, passed, missed_by), ``quality`` (mean Δ, interval, lower bound per metric),
    ``fidelity`` (tau, regret p95 / mean / max), ``strict_passed``, ``recall@10_delta`` / ``auc_delta`` /
    ``ndcg@10_delta`` / ``recall@1_delta`` (point, None without labels), reference / quantized label
    metrics, passed, failures, thresholds, precision, reference, backend, and ``stopped_after`` /
    ``stop_reason`` when fail-fast stopped it.
    """

    records: list[SlateComparison]
    thresholds: GateThresholds
    reference_metrics: dict | None = None
    test_metrics: dict | None = None
    precision: str = "int8"
    reference: str = "fp32"
    backend: str = "onnxruntime"
    extra: dict = field(default_factory=dict)
    regrets: list[float] = field(default_factory=list)
    deltas: np.ndarray | None = None
    planned: int | None = None
    stop_reason: str | None = None

    def _point(self, k: str) -> float | None:
        if not self.reference_metrics or not self.test_metrics:
            return None
        return self.test_metrics[k] - self.reference_metrics[k]

    @property
    def recall10_delta(self) -> float | None:
        """Mean Recall@10 of the tested graph − the reference's over labelled slates (None without labels)."""
        return self._point("recall@10")

    @property
    def auc_delta(self) -> float | None:
        """Mean AUC of the tested graph − the reference's over labelled slates (None without labels)."""
        return self._point("auc")

    def quality(self) -> dict[str, dict]:
        """Per metric of :data:`QUALITY_METRICS`: ``{delta, interval, lower_bound, slates}`` of the paired
        bootstrap (module doc, (a)); empty when fewer than ``MIN_PAIRED`` labelled slates compare.
        Computed once per report (the bootstrap is seeded, so the figures are reproducible)."""
        cached = self.__dict__.get("_quality")
        if cached is not None:
            return cached
        d, out = self.deltas, {}
        if d is not None and d.shape[0] >= MIN_PAIRED:
            t = self.thresholds
            cols = [METRIC_KEYS.index(m) for m in QUALITY_METRICS]
            ci = bootstrap_ci(d[:, cols], t.resamples, t.seed, level=2 * t.confidence - 1)
            out = {m: {"delta": float(d[:, c].mean()), "interval": ci[i], "lower_bound": ci[i][0],
                       "slates": int(d.shape[0])} for i, (m, c) in enumerate(zip(QUALITY_METRICS, cols))}
        self.__dict__["_quality"] = out
        return out

    def criteria_report(self) -> list[Criterion]:
        """Every criterion of (a), (b), (c) with its figures, ``required`` by the mode (module doc)."""
        t, s = self.thresholds, self.summary()
        quality, strict = t.mode == "quality", t.mode == "strict"
        out = []
        q = self.quality()
        n_lab = 0 if self.deltas is None else int(self.deltas.shape[0])
        for m in QUALITY_METRICS:
            name = f"{m}_delta"
            if m in q:
                r = q[m]
                out.append(Criterion(name, "quality", r["delta"], r["lower_bound"], -t.margin(m), ">=", quality,
                                     tuple(r["interval"]),
                                     note=f"one-sided {t.confidence:.0%} lower bound of the mean over {r['slates']} slates"))
            else:
                out.append(Criterion(name, "quality", self._point(m), None, -t.margin(m), ">=", False,
                                     note=f"not checked: {n_lab} labelled slate(s) compare, the bootstrap needs {MIN_PAIRED}"))
        if t.min_tau is not None:
            out.append(Criterion("kendall_tau_mean", "fidelity", s.kendall_tau_mean, s.kendall_tau_mean, t.min_tau, ">=",
                                 quality))
        r95 = p95(self.regrets)
        out.append(Criterion("regret_p95", "fidelity", r95, r95 if self.regrets else None, t.max_regret_p95, "<=", quality))
        out.append(Criterion("nonfinite", "fidelity", s.nonfinite, s.nonfinite, t.max_nonfinite, "<=", True))
        out.append(Criterion("top1_agreement", "strict", s.top1_agreement, s.top1_agreement, t.min_top1, ">=", strict))
        for name, v, lim in (("|recall@10_delta|", self.recall10_delta, t.max_recall10_delta),
                             ("|auc_delta|", self.auc_delta, t.max_auc_delta)):
            a = None if v is None else abs(v)
            out.append(Criterion(name, "strict", a, a, lim, "<=", strict and a is not None,
                                 note="" if a is not None else "not checked: no labelled slate"))
        if self.planned is not None:
            k = len(self.records)
            out.append(Criterion("slates_scored", "run", k, k, self.planned, ">=", True,
                                 note=self.stop_reason or ""))
        return out

    def criteria(self, s: ComparisonSummary) -> list[tuple[str, float, float, str]]:
        """``(name, tested, limit, op)`` of the criteria the mode requires (:class:`Verdict` protocol)."""
        return [(c.name, c.tested, c.limit, c.op) for c in self.criteria_report() if c.required and c.tested is not None]

    def failures(self) -> list[Failure]:
        """Each required criterion that failed: name, the number compared, the limit, ``missed_by``."""
        if not self.records:
            return [Failure("slates", 0, 1, ">=", 1)]
        return [Failure(c.name, c.tested, c.limit, c.op, c.missed_by) for c in self.criteria_report()
                if c.required and c.passed is False]

    def strict_passed(self) -> bool:
        """Whether the strict rule (c) holds, whatever the mode (always reported)."""
        return bool(self.records) and all(c.passed is not False for c in self.criteria_report()
                                          if c.group == "strict" or c.name in ("nonfinite", "slates_scored"))

    def to_dict(self, per_slate: bool = False) -> dict:
        crit = self.criteria_report()
        regrets = np.minimum(np.asarray(self.regrets, dtype=np.float64), np.finfo(np.float64).max)
        d = {**self.summary().to_dict(), "gate": self.thresholds.mode,
             "criteria": [c.to_dict() for c in crit],
             "quality": {m: {**r, "interval": list(r["interval"])} for m, r in self.quality().items()},
             "fidelity": {"kendall_tau_mean": self.summary().kendall_tau_mean, "regret_p95": p95(self.regrets),
                          "regret_mean": float(regrets.mean()) if self.regrets else None,
                          "regret_max": float(regrets.max()) if self.regrets else None},
             "strict_passed": self.strict_passed(),
             "recall@10_delta": self.recall10_delta, "auc_delta": self.auc_delta,
             "reference_metrics": self.reference_metrics, "quantized_metrics": self.test_metrics,
             **self.verdict_dict(), "thresholds": self.thresholds.to_dict()}
        if self.test_metrics and self.reference_metrics:
            for k in ("recall@1", "ndcg@10"):
                d[f"{k}_delta"] = self.test_metrics[k] - self.reference_metrics[k]
        if self.planned is not None and len(self.records) < self.planned:
            d.update(stopped_after=len(self.records), stop_reason=self.stop_reason)
        d.update(self.extra)
        if per_slate:
            d["per_slate"] = [{**r.to_dict(), "regret": g} for r, g in zip(self.records, self.regrets)]
        return json_safe(d)


def gate_scores(
    ref_scores: Sequence[np.ndarray],
    test_scores: Sequence[np.ndarray],
    slates: Sequence[dict],
    thresholds: GateThresholds | None = None,
    precision: str = "int8",
    reference: str = "fp32",
    backend: str = "onnxruntime",
    planned: int | None = None,
    stop_reason: str | None = None,
) -> GateReport:
    """Gate per-slate score matrices of a tested graph against the reference's (module doc).

    Args:
        ref_scores, test_scores: one ``[n_i, K]`` float array per slate, same order as ``slates``.
        slates: the evaluation slates (for ids and labels).
        thresholds: the criteria (default :class:`GateThresholds`: quality mode).
        planned: slates the run was to score (a report over fewer is a failure: fail-fast stopped it);
            None = these are all. stop_reason: why it stopped.
    Raises: ValueError if the lists differ in length or a slate's shapes differ.
    """
    if not (len(ref_scores) == len(test_scores) == len(slates)):
        raise ValueError(f"{len(ref_scores)} reference, {len(test_scores)} test score sets for {len(slates)} slates")
    records, regrets = [], []
    for i, (a, b, s) in enumerate(zip(ref_scores, test_scores, slates)):
        if a.shape != b.shape:
            raise ValueError(f"slate {i}: reference scores {a.shape} vs test {b.shape}")
        r = compare_slate(a, b, str(s.get("slate_id", i)))
        records.append(r)
        regrets.append(assignment_regret(a, r.ref_order, r.test_order))
    ref_m = label_metrics([r.ref_order for r in records], slates)
    test_orders = [r.test_order if r.test_order is not None else list(range(r.n_items)) for r in records]
    test_m = label_metrics(test_orders, slates)
    lab = [i for i, s in enumerate(slates) if s.get("labels")]
    deltas = paired_rows([records[i].ref_order for i in lab], [test_orders[i] for i in lab],
                         [slates[i]["labels"] for i in lab])
    return GateReport(records, thresholds or GateThresholds(), ref_m, test_m, str(precision), reference, backend,
                      regrets=regrets, deltas=deltas, planned=planned, stop_reason=stop_reason)
