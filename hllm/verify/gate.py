"""The ranking-fidelity gate of a quantized graph (torch-free).

Tensor closeness is the wrong test for a ranker: INT8 activations flip decisions at near-ties while
max|ΔM| still looks small. The gate compares *rankings* of the quantized graph with those of the FP32
reference on held-out real slates, with the per-slate metrics of :mod:`hllm.verify.parity`
(``compare_slate``: top-1 agreement, Kendall tau, top-10 overlap, exact-permutation rate) and, when
the slates carry labels, the change in ranking quality (Recall@1, Recall@10, NDCG@10 of the
reference and of the quantized ranking against the labels).

Default verdict: top-1 agreement ≥ 0.97, |ΔRecall@10| ≤ 0.01, |ΔAUC| ≤ 0.005, no non-finite score;
optional minimum mean Kendall tau. The reference's scores are computed once (:func:`reference_scores`) so the
automatic exclusion mode re-runs only the quantized graph.

Note: Recall@K / NDCG@K are computed here with the plain definitions (a ranking's hits among the
labelled positives); if a shared ``hllm.verify.metrics`` module appears it should replace them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from hllm.errors import SlateError
from hllm.verify.parity import ComparisonSummary, SlateComparison, Verdict, compare_slate


@dataclass
class GateThresholds:
    """Pass criteria of the fidelity gate.

    Attributes:
        min_top1: min fraction of slates whose top item equals the reference's (default 0.97).
        max_recall10_delta: max |Recall@10(quantized) − Recall@10(reference)| (default 0.01); only
            checked when the slates have labels.
        max_auc_delta: max |AUC(quantized) − AUC(reference)| (default 0.005; labelled slates only).
        min_tau: min mean Kendall tau (None = not checked).
        max_nonfinite: max number of non-finite scores (default 0).
    Raises: ValueError for a limit outside its range (top-1, ΔRecall@10 and ΔAUC in [0, 1], tau in [-1, 1]).
    """

    min_top1: float = 0.97
    max_recall10_delta: float = 0.01
    min_tau: float | None = None
    max_auc_delta: float = 0.005
    max_nonfinite: int = 0

    def __post_init__(self) -> None:
        """Raise ValueError for a limit no graph could meet or that checks nothing."""
        if not 0.0 <= self.min_top1 <= 1.0:
            raise ValueError(f"min_top1 must be in [0, 1], got {self.min_top1}")
        if not 0.0 <= self.max_recall10_delta <= 1.0:
            raise ValueError(f"max_recall10_delta must be in [0, 1], got {self.max_recall10_delta}")
        if not 0.0 <= self.max_auc_delta <= 1.0:
            raise ValueError(f"max_auc_delta must be in [0, 1], got {self.max_auc_delta}")
        if self.min_tau is not None and not -1.0 <= self.min_tau <= 1.0:
            raise ValueError(f"min_tau must be in [-1, 1], got {self.min_tau}")


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


def save_reference(path, scores: Sequence[np.ndarray], slates: Sequence[dict], source_sha256: str | None) -> None:
    """Save reference score matrices (one ``[n_i, K]`` per slate) with the slate ids and the hash of the
    graph that produced them (npz, written atomically), so later gate runs can skip the FP32 pass."""
    from hllm.files import atomic_path

    arrays = {f"scores/{i}": a for i, a in enumerate(scores)}
    arrays["slate_ids"] = np.array([str(s.get("slate_id", i)) for i, s in enumerate(slates)])
    arrays["source_sha256"] = np.array(source_sha256 or "")
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)


def load_reference(path, slates: Sequence[dict], source_sha256: str | None) -> list[np.ndarray]:
    """Load the scores saved by :func:`save_reference` for ``slates`` (any subset of the saved ones, by id).

    Raises: ParityError if a slate has no saved scores, they were made by another graph, or the file is
        not a readable ``.npz`` of that layout (each array's header is checked before it is read:
        :class:`hllm.formats.npz.CheckedNpz`).
    """
    from hllm.errors import ParityError
    from hllm.formats.npz import CheckedNpz

    with CheckedNpz(path, ParityError) as z:  # headers checked before anything is decompressed
        ids = z.get("slate_ids", ndim=1)
        index = {str(x): i for i, x in enumerate(ids.tolist())}
        want = [str(s.get("slate_id", i)) for i, s in enumerate(slates)]
        missing = [w for w in want if w not in index]
        if missing:
            raise ParityError(f"{path}: no reference scores for {len(missing)} evaluation slate(s), e.g. {missing[:3]}")
        sha = z.get("source_sha256", ndim=0)
        if source_sha256 and str(sha) not in ("", source_sha256):
            raise ParityError(f"{path}: reference scores come from another graph (onnx sha256 differs)")
        out = []
        for w, s in zip(want, slates):
            n = len(s["candidates"]) if isinstance(s.get("candidates"), list) else None
            m = z.get(f"scores/{index[w]}", (n, None))
            if not np.issubdtype(m.dtype, np.floating):
                raise ParityError(f"{path}: scores/{index[w]} is {m.dtype}, not floating point")
            out.append(m)
        return out


@dataclass
class GateReport(Verdict):
    """Verdict of the fidelity gate: ``bool(report)`` = passed.

    :meth:`to_dict` keys: the :class:`hllm.verify.parity.ComparisonSummary` fields (slates,
    top1_agreement, kendall_tau_mean, ...), reference / quantized label metrics, ``recall@10_delta``
    (None without labels), passed, failures, thresholds, precision, reference, backend.
    """

    records: list[SlateComparison]
    thresholds: GateThresholds
    reference_metrics: dict | None = None
    test_metrics: dict | None = None
    precision: str = "int8"
    reference: str = "fp32"
    backend: str = "onnxruntime"
    extra: dict = field(default_factory=dict)

    @property
    def recall10_delta(self) -> float | None:
        if not self.reference_metrics or not self.test_metrics:
            return None
        return self.test_metrics["recall@10"] - self.reference_metrics["recall@10"]

    @property
    def auc_delta(self) -> float | None:
        if not self.reference_metrics or not self.test_metrics:
            return None
        return self.test_metrics["auc"] - self.reference_metrics["auc"]

    def criteria(self, s: ComparisonSummary) -> list[tuple[str, float, float, str]]:
        t = self.thresholds
        checks = [("top1_agreement", s.top1_agreement, t.min_top1, ">="),
                  ("nonfinite", s.nonfinite, t.max_nonfinite, "<=")]
        if t.min_tau is not None:
            checks.append(("kendall_tau_mean", s.kendall_tau_mean, t.min_tau, ">="))
        d = self.recall10_delta
        if d is not None:
            checks.append(("|recall@10_delta|", abs(d), t.max_recall10_delta, "<="))
        a = self.auc_delta
        if a is not None:
            checks.append(("|auc_delta|", abs(a), t.max_auc_delta, "<="))
        return checks

    def to_dict(self, per_slate: bool = False) -> dict:
        d = {**self.summary().to_dict(), "recall@10_delta": self.recall10_delta, "auc_delta": self.auc_delta,
             "reference_metrics": self.reference_metrics, "quantized_metrics": self.test_metrics,
             **self.verdict_dict()}
        if self.test_metrics and self.reference_metrics:
            for k in ("recall@1", "ndcg@10"):
                d[f"{k}_delta"] = self.test_metrics[k] - self.reference_metrics[k]
        d.update(self.extra)
        if per_slate:
            d["per_slate"] = [r.to_dict() for r in self.records]
        return _json_safe(d)


def _json_safe(x):
    """Replace non-finite floats (inf max diff of a NaN-producing graph) by None for strict JSON."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_json_safe(v) for v in x]
    return x


def gate_scores(
    ref_scores: Sequence[np.ndarray],
    test_scores: Sequence[np.ndarray],
    slates: Sequence[dict],
    thresholds: GateThresholds | None = None,
    precision: str = "int8",
    reference: str = "fp32",
    backend: str = "onnxruntime",
) -> GateReport:
    """Gate per-slate score matrices of a quantized graph against the reference's.

    Args:
        ref_scores, test_scores: one ``[n_i, K]`` float array per slate, same order as ``slates``.
        slates: the evaluation slates (for ids and labels).
    Raises: ValueError if the lists differ in length or a slate's shapes differ.
    """
    if not (len(ref_scores) == len(test_scores) == len(slates)):
        raise ValueError(f"{len(ref_scores)} reference, {len(test_scores)} test score sets for {len(slates)} slates")
    records = []
    for i, (a, b, s) in enumerate(zip(ref_scores, test_scores, slates)):
        if a.shape != b.shape:
            raise ValueError(f"slate {i}: reference scores {a.shape} vs test {b.shape}")
        records.append(compare_slate(a, b, str(s.get("slate_id", i))))
    ref_m = label_metrics([r.ref_order for r in records], slates)
    test_orders = [r.test_order if r.test_order is not None else list(range(r.n_items)) for r in records]
    test_m = label_metrics(test_orders, slates)
    return GateReport(records, thresholds or GateThresholds(), ref_m, test_m, str(precision), reference, backend)


def run_gate(
    ref_scores: Sequence[np.ndarray],
    test,
    slates: Sequence[dict],
    thresholds: GateThresholds | None = None,
    calibration_ids: Sequence[str] = (),
    batch_size: int = 1,
    on_progress=None,
    threads: int | None = None,
) -> GateReport:
    """Run the quantized artefact ``test`` (export dir / .onnx / Ranker) on ``slates`` and gate it.

    Raises:
        SlateError: an evaluation slate was used for calibration (:func:`check_disjoint`).
        EngineError: the artefact cannot be loaded or run.
    """
    from hllm.runtime.ranker import Ranker

    check_disjoint(calibration_ids, slates)
    r = test if isinstance(test, Ranker) else cpu_ranker(test, threads)
    t_scores = ranker_scores(r, slates, batch_size, on_progress)
    return gate_scores(ref_scores, t_scores, slates, thresholds, precision=str(r.engine.precision),
                       backend=r.engine.name)
