"""The ranking validation NNCF's accuracy control runs (:mod:`hllm.calibration.recipes.accuracy_control`): one slate is
one item, its value a ranking quality of that slate.

NNCF's ``quantize_with_accuracy_control`` quantizes the whole graph, then reverts groups of quantizers to
float, greedily, until a user metric has dropped by at most ``max_drop`` from the float model's value.
It ranks the groups by that same metric: its ``validation_fn(model, items)`` returns the aggregate metric
and one value per item; NNCF picks the items the quantized model lost most on (the ranking subset) and,
for each group, measures the metric on those items with that group reverted (NNCF docs, "Quantization
with accuracy control"; ``nncf.quantization.algorithms.accuracy_control``). Here an item is one slate and
the value is a ranking quality of that slate, so the groups are ranked by what they do to rankings.
"""

from __future__ import annotations

import time
from typing import Iterable, Sequence

import numpy as np

from hllm.errors import DecodeError, SlateError
from hllm.formats.graph import OUTPUT_NAME, sidecar_reads_context
from hllm.runtime.decode import decode
from hllm.runtime.prompt import PromptBuilder, load_tokenizer
from hllm.verify.gate import assignment_regret
from hllm.verify.metrics import slate_metrics
from hllm.verify.parity import kendall_tau


#: Per-slate qualities the validation function can return (:func:`slate_value`), higher = better.
VALIDATION_METRICS = ("regret", "tau", "auc", "ndcg@10")

#: ``max_drop`` per metric when the gate thresholds do not give one: the gate's default margins (regret:
#: p95 of the per-slate regret ≤ 1e-3; tau: mean Kendall tau ≥ 0.9; AUC 0.005; NDCG@10 0.01).
DEFAULT_MAX_DROP = {"regret": 1e-3, "tau": 0.1, "auc": 0.005, "ndcg@10": 0.01}

#: Regret counted for a slate whose scores are not finite (no ranking can be decoded): a random order's
#: (the gate counts +inf; NNCF needs finite values to average and subtract).
NONFINITE_REGRET = 1.0


def slate_value(metric: str, ref: np.ndarray, test: np.ndarray, labels=None) -> float:
    """One slate's ranking quality under ``metric`` (higher = better), from the FP32 and the quantized
    engine's score matrices (``[n, K]`` float each).

    ``regret``: ``1 −`` the assignment regret (:func:`hllm.verify.gate.assignment_regret`: the share of
    FP32's objective, paper eq. 1, that the quantized ranking loses) under the FP32 scores (FP32
    itself: 1, a random order: 0 on average; offset by 1 because NNCF 3.4 divides by the float model's
    metric when it computes a drop, even an absolute one). ``tau``: Kendall tau between the two rankings (:func:`hllm.verify.parity.kendall_tau`;
    FP32: 1). ``auc`` / ``ndcg@10``: the quantized ranking against the slate's 0/1 ``labels``
    (:func:`hllm.verify.metrics.slate_metrics`). Non-finite quantized scores count as a random order
    for regret (value 0), as a reversed one for tau (−1) and as 0 for the labelled metrics.

    Raises: ValueError for an unknown metric; SlateError for a labelled metric on a slate without a positive
        and a negative label; DecodeError if ``ref`` is not finite.
    """
    if metric not in VALIDATION_METRICS:
        raise ValueError(f"unknown validation metric {metric!r}; one of {VALIDATION_METRICS}")
    n = ref.shape[0]
    try:
        order = decode(np.asarray(test), n)
    except DecodeError:
        order = None
    if metric == "regret":
        return 1.0 - (NONFINITE_REGRET if order is None else assignment_regret(ref, decode(np.asarray(ref), n), order))
    if metric == "tau":
        return -1.0 if order is None else float(kendall_tau(decode(np.asarray(ref), n), order))
    m = slate_metrics(order if order is not None else np.arange(n), labels if labels is not None else [])
    if m is None:
        raise SlateError(f"the {metric} of a slate needs a positive and a negative label")
    return 0.0 if order is None else float(m[metric])


def aggregate(metric: str, values: Sequence[float]) -> float:
    """The statistic the gate applies to per-slate values of ``metric``: the 95th percentile of the regret
    (returned as ``1 − p95``, like the values :func:`slate_value` gives), the mean otherwise. Raises
    ValueError when ``values`` is empty."""
    v = np.asarray(list(values), dtype=np.float64)
    if v.size == 0:
        raise ValueError("no slates to aggregate")
    if metric == "regret":
        return 1.0 - float(np.percentile(1.0 - v, 95))
    return float(v.mean())


def max_drop_for(metric: str, thresholds=None) -> float:
    """NNCF's ``max_drop`` for ``metric``, from the gate's margin in ``thresholds`` (a
    :class:`hllm.verify.gate.GateThresholds`) where it names one, else :data:`DEFAULT_MAX_DROP`.
    Regret: the p95 regret limit; tau: ``1 − min_tau``; AUC / NDCG@10: the non-inferiority margin."""
    if metric not in VALIDATION_METRICS:
        raise ValueError(f"unknown validation metric {metric!r}; one of {VALIDATION_METRICS}")
    names = {"regret": ("max_regret_p95", "max_regret"), "tau": ("min_tau",),
             "auc": ("auc_margin", "max_auc_drop", "max_auc_delta"),
             "ndcg@10": ("ndcg10_margin", "max_ndcg10_drop", "max_ndcg10_delta")}[metric]
    for name in names:
        v = getattr(thresholds, name, None) if thresholds is not None else None
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(1.0 - v) if name == "min_tau" else float(v)
    return DEFAULT_MAX_DROP[metric]


class SearchBudgetExceeded(RuntimeError):
    """Raised by :class:`RankingValidation` (``stop="raise"``) past its deadline, to end NNCF's search."""


class RankingValidation:
    """NNCF ``validation_fn`` that judges a model by the rankings it gives on labelled slates.

    Called as ``fn(compiled_model, items)`` with an ``openvino.CompiledModel`` and an iterable of slate
    indices (the items of the validation ``nncf.Dataset``, ``range(len(feeds))``); runs the model on each
    slate, decodes the ranking and returns ``(aggregate, per_slate)``: the per-slate values of
    :func:`slate_value` (``per_item`` for NNCF's ranking of quantizer groups) and their :func:`aggregate`
    (the figure NNCF compares with ``max_drop``).

    Args:
        feeds: one feed dict per slate (``{input name: array}``, batch 1). n_items: candidates per slate.
        reference: FP32 score matrices, one ``[n_i, K]`` per slate; None = each slate's first scores are its
            reference (NNCF runs the float model before any quantized one, ``Evaluator.collect_metric_results``
            of the initial model, so no separate FP32 pass is needed). labels: per slate its 0/1 labels
            (needed for ``auc`` / ``ndcg@10``). metric: one of :data:`VALIDATION_METRICS`.
        deadline: a ``time.monotonic()`` value; once it has passed, every call returns the float model's
            aggregate (the first full validation's) without running anything, so NNCF sees no drop and stops
            with the model as it stands (its last reverted group then chosen on those values); None = no limit.
        stop: what the deadline does: ``return`` (above) or ``raise`` (:class:`SearchBudgetExceeded`, which
            ends NNCF at once: the graph reverts and compiles of a ranking pass under way do not run either).
    Attributes: ``slates_run`` (slates scored so far), ``trace`` (the aggregate of every call that scored
        all slates, in call order; calls after the deadline are not in it), ``out_of_time`` (the deadline
        cut the search short).
    Raises: ValueError (lengths differ, unknown metric), SlateError (labelled metric without labels).
    """

    def __init__(self, feeds: Sequence[dict], n_items: Sequence[int], reference: Sequence[np.ndarray] | None = None,
                 labels: Sequence[Sequence[int]] | None = None, metric: str = "regret",
                 deadline: float | None = None, stop: str = "return"):
        if metric not in VALIDATION_METRICS:
            raise ValueError(f"unknown validation metric {metric!r}; one of {VALIDATION_METRICS}")
        if reference is None:
            reference = [None] * len(feeds)
        if not (len(feeds) == len(n_items) == len(reference)) or not feeds:
            raise ValueError(f"{len(feeds)} slates, {len(n_items)} item counts, {len(reference)} reference matrices")
        if metric in ("auc", "ndcg@10"):
            bad = [i for i, y in enumerate(labels or [None] * len(feeds)) if not y or all(y) or not any(y)]
            if bad:
                raise SlateError(f"validation metric {metric} needs labelled slates (a positive and a negative); "
                                 f"{len(bad)} of {len(feeds)} have none (first: slate #{bad[0]})")
        self.feeds, self.n_items, self.reference = list(feeds), [int(n) for n in n_items], list(reference)
        self.labels, self.metric = labels, metric
        self.slates_run = 0
        self.trace: list[float] = []
        if stop not in ("return", "raise"):
            raise ValueError(f"stop must be 'return' or 'raise', got {stop!r}")
        self.deadline, self.out_of_time, self.stop = deadline, False, stop

    def scores(self, compiled, i: int) -> np.ndarray:
        """Score matrix ``[n_i, K]`` float32 of slate ``i`` from an ``openvino.CompiledModel``."""
        res = compiled(self.feeds[i])
        port = compiled.output(OUTPUT_NAME) if OUTPUT_NAME in compiled.output(0).get_names() else compiled.output(0)
        self.slates_run += 1
        return np.asarray(res[port], dtype=np.float32)[0, : self.n_items[i]]

    def values(self, compiled, items: Iterable[int]) -> list[float]:
        """Per-slate values of the slates ``items`` (indices). A slate without reference scores takes this
        model's as its reference (module note: NNCF validates the float model first)."""
        out = []
        for i in map(int, items):
            got = self.scores(compiled, i)
            if self.reference[i] is None:
                self.reference[i] = got
            out.append(slate_value(self.metric, self.reference[i], got, self.labels[i] if self.labels else None))
        return out

    def __call__(self, compiled, items: Iterable[int]) -> tuple[float, list[float]]:
        items = list(items)
        if self.deadline is not None and len(self.trace) >= 2 and time.monotonic() > self.deadline:
            self.out_of_time = True
            if self.stop == "raise":
                raise SearchBudgetExceeded(f"accuracy-control search past its deadline after {self.slates_run} slates")
            return self.trace[0], [self.trace[0]] * len(items)  # "no drop": NNCF returns the model as it stands
        vals = self.values(compiled, items)
        agg = aggregate(self.metric, vals)
        if len(vals) == len(self.feeds):
            self.trace.append(agg)
        return agg, vals


def encode_slates(meta, slates: Sequence[dict]) -> tuple[list[dict], list[int]]:
    """Each slate encoded alone by the export's prompt builder and tokenizer: ``(feeds, n_items)``.
    Raises: SlateError (a slate that does not encode), CheckpointError (tokenizer)."""
    builder = PromptBuilder(load_tokenizer(meta.tokenizer_path), meta.prompt, max_items=meta.num_positions)
    ctx = sidecar_reads_context(meta.raw)
    feeds, n = [], []
    for s in slates:
        b = builder.encode([s])
        feeds.append(b.inputs(ctx))
        n.append(int(b.n_items[0]))
    return feeds, n
