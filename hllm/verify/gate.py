"""The gate of a reduced-precision graph: does it rank as well as the FP32 reference? (torch-free)

Tensor closeness is the wrong test for a ranker, and so is agreement alone: a model whose FP32 top-1
margin is tiny on some slates has near-ties that any change of arithmetic breaks either way, without
changing how good the rankings are. The gate therefore judges the candidate by the task, on held-out
labelled slates, with a tolerance and an interval — the way NNCF's ``quantize_with_accuracy_control``
(``max_drop`` on a user ``validation_fn``) and Intel Neural Compressor's ``AccuracyCriterion
(tolerable_loss)`` judge quantized models — plus a fidelity floor that catches broken engines.

``mode="quality"`` (the default) passes when both hold:

(a) **quality non-inferiority**: per labelled slate, the difference candidate − FP32 of AUC, NDCG@10
    and Recall@10 (:func:`hllm.verify.metrics.paired_rows`); a paired percentile bootstrap over slates
    (:func:`hllm.verify.metrics.bootstrap_ci`, ``resamples`` draws, seeded) gives the one-sided
    ``confidence`` (95%) lower bound of each mean difference, which must be ≥ −margin (defaults:
    0.005 AUC, 0.01 NDCG@10, 0.01 Recall@10). Needs ≥ :data:`hllm.verify.metrics.MIN_PAIRED` labelled
    slates; with fewer, (a) is reported as not checked and the verdict rests on (b).
(b) **fidelity floor**: mean Kendall tau between the two rankings ≥ 0.9, the 95th percentile over
    slates of the assignment regret ≤ 1e-3, and no non-finite score. The regret of one slate
    (:func:`assignment_regret`) measures the candidate's permutation by the FP32 model's own objective,
    the assignment objective ``J(π) = Σ_i M[i, π(i)]`` that hLLM decodes by (paper §3.4, eq. 1):
    ``(J(π_fp32) − J(π_cand)) / (J(π_fp32) − E_π J(π))`` with ``M`` the FP32 score matrix of the slate,
    ``π_fp32`` its optimum and ``E_π J(π) = Σ_ij M[i, j] / n`` the mean over uniformly random
    permutations: 0 = as good as the optimum, 1 = no better than a random order.

``mode="strict"`` keeps the agreement rule: top-1 agreement ≥ 0.97, point |ΔRecall@10| ≤ 0.01, point
|ΔAUC| ≤ 0.005, no non-finite score. Whatever the mode, every criterion is computed and reported
(:meth:`GateReport.criteria_report`: value, interval, the number compared, limit, passed, ``missed_by``);
the mode decides which ones the verdict requires.

Sequential fail-fast (:func:`hopeless`, used by :func:`run_gate` with ``fail_fast``): a candidate is
scored in chunks and stopped as soon as it can no longer pass. Exact rules (whatever the slates still
to come): a non-finite score; mean tau below the floor even if every remaining slate had tau 1; p95
regret above the limit even if every remaining slate had regret 0; (strict) more top-1 misses than the
rule allows over all slates. One statistical futility rule (quality mode): at the looks after 25%, 50%
and 75% of the slates (at least 20 labelled ones), stop when the one-sided upper confidence bound of a
mean difference is already below −margin, at a per-test level of ``futility_alpha`` / (3 looks × 3
metrics) (Bonferroni), so a non-inferior candidate is stopped wrongly with probability ≤
``futility_alpha`` (1%). A stop can only fail a candidate, never pass one: passing always needs every
slate, so the 5% error of (a) is that of the fixed-sample test.

The reference's scores are computed once (:func:`reference_scores`) and may be cached
(:func:`save_reference` / :func:`load_reference`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import numpy as np

from hllm.errors import SlateError
from hllm.verify.parity import ComparisonSummary, Failure, SlateComparison, Verdict, compare_slate

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
        futility_alpha: fail-fast: max probability of stopping a candidate that would pass (a) (default 0.01).
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
    from hllm.verify.metrics import evaluate

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
    both = sorted({str(s.get("slate_id", "")) for s in eval_slates} & cal)
    if both:
        raise SlateError(
            f"{len(both)} evaluation slate(s) were used for calibration (e.g. {both[:3]}); "
            "gate on held-out slates (calibrate on the train split, gate on eval)"
        )


def cpu_ranker(path, threads: int | None = None):
    """The :class:`hllm.runtime.Ranker` the gate runs an export with: ONNX Runtime, CPU provider only
    (a quantized graph is compared on the CPU that calibrated it; FP8 graphs get ``basic`` graph
    optimizations in :func:`hllm.runtime.artefact.open_engine`). ``path``: an export path or an already
    resolved :class:`hllm.runtime.artefact.Artefact`."""
    from hllm.runtime.ranker import Ranker

    return Ranker.from_path(path, providers=["CPUExecutionProvider"], threads=threads)


def ranker_scores(ranker, slates: Sequence[dict], batch_size: int = 1, on_progress=None) -> list[np.ndarray]:
    """Per-slate score matrices ``[n_i, K]`` float32 of one :class:`hllm.runtime.Ranker` (its builder)."""
    from hllm.verify.scoring import score_slates

    with ranker:
        return score_slates([ranker.engine], ranker.builder, slates, batch_size, on_progress)[0]


def reference_scores(reference, slates: Sequence[dict], batch_size: int = 1, on_progress=None) -> list[np.ndarray]:
    """Scores of the FP32 reference (path or Ranker), computed once per gate run."""
    from hllm.runtime.ranker import Ranker

    ref = reference if isinstance(reference, Ranker) else cpu_ranker(reference)
    return ranker_scores(ref, slates, batch_size, on_progress)


#: The layout of a reference-score cache (``calibrate --reference-scores``); other files are refused.
REFERENCE_FORMAT = "hllm-reference-scores/2"


@dataclass(frozen=True)
class ReferenceKey:
    """What reference scores were computed from — a cache is used only when all of it matches.

    Attributes:
        graph_sha256: sha256 (hex) of the graph file that produced the scores (``model.onnx``; the same
            hash as the export sidecar's ``onnx_sha256``). Never empty.
        num_positions: K, the second dimension of every score matrix.
        slate_keys: per slate, the sha256 (hex) of its encoded graph inputs (:func:`input_key`): the token
            ids, readout positions, item mask (and context position) the graph reads for that slate alone.
        slate_ids: per slate, its id (:func:`hllm.runtime.slates.slate_id`), for messages only.
        n_items: per slate, its number of candidates (the first dimension of its score matrix).
    """

    graph_sha256: str
    num_positions: int
    slate_keys: tuple[str, ...]
    slate_ids: tuple[str, ...]
    n_items: tuple[int, ...]


def input_key(feeds: dict) -> str:
    """sha256 (hex) of one slate's encoded graph inputs ``{name: array}`` (name, dtype, shape and bytes of
    each, in the graph's input order): equal keys mean the graph sees the same inputs."""
    import hashlib

    h = hashlib.sha256()
    for name, a in feeds.items():
        a = np.ascontiguousarray(a)
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def reference_key(artefact, slates: Sequence[dict]) -> ReferenceKey:
    """The :class:`ReferenceKey` of ``slates`` run through the export ``artefact``
    (:class:`hllm.runtime.artefact.Artefact`): the graph file's sha256, K, and each slate encoded alone
    by the export's prompt builder and tokenizer, hashed as the graph would read it
    (:func:`hllm.formats.graph.feed_dict`).

    Raises: SlateError (a slate that does not encode), CheckpointError (tokenizer).
    """
    from hllm.files import sha256_file
    from hllm.runtime.prompt import PromptBuilder, load_tokenizer
    from hllm.runtime.slates import slate_ids

    builder = PromptBuilder(load_tokenizer(artefact.tokenizer_path), artefact.prompt, max_items=artefact.num_positions)
    keys = tuple(input_key(builder.encode([s]).inputs(artefact.graph_inputs)) for s in slates)
    return ReferenceKey(sha256_file(artefact.path), int(artefact.num_positions), keys, tuple(slate_ids(slates)),
                        tuple(len(s["candidates"]) for s in slates))


def save_reference(path, scores: Sequence[np.ndarray], key: ReferenceKey) -> None:
    """Save reference score matrices (one ``[n_i, K]`` float32 per slate of ``key``) with what they were
    computed from (:class:`ReferenceKey`: graph hash, K, each slate's input hash, its id) as an ``.npz``
    of layout :data:`REFERENCE_FORMAT`, written atomically, so later gate runs can skip the FP32 pass.

    Raises: ValueError if ``scores`` do not match ``key`` (count, shape) or hold a non-finite value (such a
        reference is never cached); OSError from writing.
    """
    from hllm.files import atomic_path

    if not key.graph_sha256:
        raise ValueError("reference scores need the graph's sha256 to be cached")
    if len(scores) != len(key.slate_keys):
        raise ValueError(f"{len(scores)} score matrices for {len(key.slate_keys)} slates")
    arrays = {}
    for i, (a, n) in enumerate(zip(scores, key.n_items)):
        a = np.asarray(a, dtype=np.float32)
        if a.shape != (n, key.num_positions) or not np.isfinite(a).all():
            raise ValueError(f"slate {key.slate_ids[i]}: scores of shape {a.shape} (expected {(n, key.num_positions)}) "
                             "or with non-finite values are not cached")
        arrays[f"scores/{i}"] = a
    arrays.update(format=np.array(REFERENCE_FORMAT), graph_sha256=np.array(key.graph_sha256),
                  num_positions=np.array(key.num_positions, dtype=np.int64),
                  slate_keys=np.array(key.slate_keys, dtype=str), slate_ids=np.array(key.slate_ids, dtype=str))
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)


def load_reference(path, key: ReferenceKey) -> list[np.ndarray]:
    """The cached reference scores of the slates of ``key``, found by the hash of each slate's inputs (any
    subset of the saved slates, in ``key``'s order), after proving the cache holds what is asked for.

    Returns: one ``[n_i, K]`` float32 matrix per slate of ``key``.
    Raises: ParityError naming the cache file (never the export) when it is not a readable ``.npz`` of
        layout :data:`REFERENCE_FORMAT` (each member's header is checked before it is read:
        :class:`hllm.formats.npz.CheckedNpz`), records no or another graph hash, another K, has no scores
        for some slate's inputs (other slates, the same ids with other candidates, another prompt or
        tokenizer, a cache cut short), a matrix of another shape, or a non-finite score.
    """
    from hllm.errors import ParityError
    from hllm.formats.npz import CheckedNpz

    fix = "delete it to recompute the reference, or pass another --reference-scores file"
    where = f"reference-score cache {path}"
    with CheckedNpz(path, ParityError) as z:  # headers checked before anything is decompressed
        fmt = str(z.get("format", ndim=0)) if "format" in z else None
        if fmt != REFERENCE_FORMAT:
            raise ParityError(f"{where}: not a reference-score cache of layout {REFERENCE_FORMAT!r} (format "
                              f"{fmt!r}: written by an older hllm, or another file); {fix}")
        k = z.get("num_positions", ndim=0)
        if k.dtype.kind not in "iu" or int(k) != key.num_positions:
            raise ParityError(f"{where}: holds scores for K={k.item()!r}, the export ranks K={key.num_positions}; {fix}")
        sha = str(z.get("graph_sha256", ndim=0))
        if not sha:
            raise ParityError(f"{where}: records no graph hash, so it cannot prove which graph made it; {fix}")
        if sha != key.graph_sha256:
            raise ParityError(f"{where}: comes from another graph (sha256 {sha[:12]}…, the export's graph is "
                              f"{key.graph_sha256[:12]}…); {fix}")
        saved = z.get("slate_keys", ndim=1)
        if saved.dtype.kind != "U":
            raise ParityError(f"{where}: slate_keys is {saved.dtype}, not text; {fix}")
        index = {str(x): i for i, x in enumerate(saved.tolist())}
        missing = [sid for sid, h in zip(key.slate_ids, key.slate_keys) if h not in index]
        if missing:
            raise ParityError(f"{where}: holds no scores for the inputs of {len(missing)} of the {len(key.slate_keys)} "
                              f"evaluation slates (first: slate {missing[0]}): it was computed for other slates, "
                              f"other candidates, another prompt or tokenizer, or is cut short; {fix}")
        out = []
        for sid, h, n in zip(key.slate_ids, key.slate_keys, key.n_items):
            m = z.get(f"scores/{index[h]}", (n, key.num_positions))
            if not np.issubdtype(m.dtype, np.floating):
                raise ParityError(f"{where}: scores/{index[h]} is {m.dtype}, not floating point; {fix}")
            if not np.isfinite(m).all():
                raise ParityError(f"{where}: the scores of slate {sid} hold {int((~np.isfinite(m)).sum())} non-finite "
                                  f"value(s) (a reference never caches them); {fix}")
            out.append(m.astype(np.float32, copy=False))
        return out


def assignment_regret(ref: np.ndarray, ref_order: Sequence[int], test_order: Sequence[int] | None) -> float:
    """Assignment regret of a candidate's ranking of one slate, judged by the reference's scores.

    With ``M = ref[:n, :n]`` (float64; rows = items, columns = rank positions) and the objective
    ``J(π) = Σ_p M[π_p, p]`` that hLLM maximises (paper §3.4, eq. 1; ``π_p`` = item at position p):
    ``regret = (J(ref_order) − J(test_order)) / (J(ref_order) − Σ_ij M[i, j] / n)``, the objective the
    candidate's permutation loses, relative to the distance of the optimum from the mean over uniformly
    random permutations. 0 = optimal, 1 = no better than a random order.

    Args:
        ref: ``[n_pad, K]`` float reference scores of the slate. ref_order: the reference's optimal
            permutation (length n). test_order: the candidate's permutation, or None when the candidate's
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


def _p95(values: Sequence[float]) -> float:
    """95th percentile (numpy's linear interpolation) of values that may hold +inf (then inf, never NaN)."""
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
        return _json_safe(d)


@dataclass
class GateReport(Verdict):
    """Verdict of the gate: ``bool(report)`` = passed (module doc: criteria and modes).

    Attributes: ``records`` (one :class:`hllm.verify.parity.SlateComparison` per slate scored),
    ``thresholds``, the label metrics of the reference and the candidate rankings (means over labelled
    slates, :func:`label_metrics`), ``regrets`` (per slate, :func:`assignment_regret`), ``deltas``
    (per labelled slate, candidate − reference of :data:`hllm.verify.metrics.METRIC_KEYS`,
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
        """Mean Recall@10 of the candidate − the reference's over labelled slates (None without labels)."""
        return self._point("recall@10")

    @property
    def auc_delta(self) -> float | None:
        """Mean AUC of the candidate − the reference's over labelled slates (None without labels)."""
        return self._point("auc")

    def quality(self) -> dict[str, dict]:
        """Per metric of :data:`QUALITY_METRICS`: ``{delta, interval, lower_bound, slates}`` of the paired
        bootstrap (module doc, (a)); empty when fewer than ``MIN_PAIRED`` labelled slates compare.
        Computed once per report (the bootstrap is seeded, so the figures are reproducible)."""
        from hllm.verify.metrics import METRIC_KEYS, MIN_PAIRED, bootstrap_ci

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
        from hllm.verify.metrics import MIN_PAIRED

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
        p95 = _p95(self.regrets)
        out.append(Criterion("regret_p95", "fidelity", p95, p95 if self.regrets else None, t.max_regret_p95, "<=", quality))
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
             "fidelity": {"kendall_tau_mean": self.summary().kendall_tau_mean, "regret_p95": _p95(self.regrets),
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
        return _json_safe(d)


def _json_safe(x):
    """Replace non-finite floats (inf max diff of a NaN-producing graph) by None for strict JSON."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if isinstance(x, np.floating):
        return _json_safe(float(x))
    return x


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
    """Gate per-slate score matrices of a candidate graph against the reference's (module doc).

    Args:
        ref_scores, test_scores: one ``[n_i, K]`` float array per slate, same order as ``slates``.
        slates: the evaluation slates (for ids and labels).
        thresholds: the criteria (default :class:`GateThresholds`: quality mode).
        planned: slates the run was to score (a report over fewer is a failure: fail-fast stopped it);
            None = these are all. stop_reason: why it stopped.
    Raises: ValueError if the lists differ in length or a slate's shapes differ.
    """
    from hllm.verify.metrics import paired_rows

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
    from hllm.verify.metrics import METRIC_KEYS, bootstrap_ci

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
    best_p95 = _p95(list(report.regrets) + [0.0] * rest)
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
    from hllm.runtime.ranker import Ranker
    from hllm.verify.scoring import score_slates

    check_disjoint(calibration_ids, slates)
    r = test if isinstance(test, Ranker) else cpu_ranker(test, threads)
    with r:
        return gate_stream(ref_scores, lambda part: score_slates([r.engine], r.builder, part, batch_size)[0], slates,
                           thresholds, fail_fast, chunk, on_progress, precision=str(r.engine.precision),
                           backend=r.engine.name)
