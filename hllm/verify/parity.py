"""Parity: compare a backend's score matrices and rankings with the PyTorch reference (torch-free).

Per slate (:func:`compare_slate` → :class:`SlateComparison`): max / mean absolute and relative
difference of M over the real rows, non-finite count, exact permutation match, Kendall tau between
the two rankings (``scipy.stats.kendalltau``), top-1 and top-10 agreement. Reports are typed and
JSON-serialisable and say by how much each threshold failed (Polygraphy-comparator style):
``bool(report)`` is the verdict, :meth:`ParityReport.failures` the :class:`Failure` list.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np

from hllm.errors import DecodeError, EngineError
from hllm.runtime.decode import decode
from hllm.runtime.ranker import Ranker
from hllm.verify.scoring import score_slates


@dataclass
class Thresholds:
    """Pass criteria. Defaults suit float32 vs float32 (exact rankings, |ΔM| ≤ 1e-4).

    Attributes:
        atol: max allowed max|ΔM| over all slates.
        min_perm_match: min fraction of slates whose full ranking is identical.
        min_top1: min fraction of slates with the same top item.
        min_tau: min mean Kendall tau.
        max_nonfinite: max number of non-finite test scores.
    """

    atol: float = 1e-4
    min_perm_match: float = 1.0
    min_top1: float = 1.0
    min_tau: float = 1.0
    max_nonfinite: int = 0


@dataclass
class Failure:
    """One failed criterion: its value, the limit, the comparison (``<=`` / ``>=``) and the margin."""

    criterion: str
    value: float
    limit: float
    op: str
    missed_by: float

    def to_dict(self) -> dict:
        return asdict(self)

    def __getitem__(self, key: str):  # reports printed as dicts keep working
        return getattr(self, key)


def check(checks: Sequence[tuple[str, float, float, str]]) -> list[Failure]:
    """The criteria that fail. ``checks`` holds ``(name, value, limit, op)`` with op ``"<="`` (value
    must not exceed limit) or ``">="`` (value must reach limit); 1e-12 of float round-off is allowed."""
    out = []
    for name, v, lim, op in checks:
        ok = v <= lim + 1e-12 if op == "<=" else v >= lim - 1e-12
        if not ok:
            out.append(Failure(name, v, lim, op, abs(v - lim)))
    return out


def kendall_tau(order_a: np.ndarray, order_b: np.ndarray) -> float:
    """Kendall tau between two rankings of the same n items (1.0 identical, -1.0 reversed).

    ``order[p]`` = item at position p. For n = 1 returns 1.0.
    """
    n = len(order_a)
    if n < 2:
        return 1.0
    from scipy.stats import kendalltau

    rank_a = np.empty(n, dtype=np.int64)
    rank_b = np.empty(n, dtype=np.int64)
    rank_a[order_a] = np.arange(n)
    rank_b[order_b] = np.arange(n)
    return float(kendalltau(rank_a, rank_b).statistic)


@dataclass
class SlateComparison:
    """Reference vs test on one slate. ``test_order`` is None when the test scores are non-finite."""

    slate_id: str
    n_items: int
    max_abs_diff: float
    mean_abs_diff: float
    max_rel_diff: float
    nonfinite: int
    ref_order: list[int]
    test_order: list[int] | None
    perm_match: bool
    kendall_tau: float
    top1_match: bool
    top10_overlap: float

    def to_dict(self) -> dict:
        return asdict(self)

    def __getitem__(self, key: str):
        return getattr(self, key)


def compare_slate(ref: np.ndarray, test: np.ndarray, slate_id: str = "") -> SlateComparison:
    """Compare one slate's score matrices ``ref``, ``test``: ``[n, K]`` float (real rows only).

    ``top10_overlap`` is the fraction of the reference top-10 kept. A non-finite test matrix cannot be
    decoded: it counts as no match, tau -1. Raises: DecodeError if ``ref`` itself is not finite.
    """
    n = ref.shape[0]
    ref64, test64 = ref.astype(np.float64), test.astype(np.float64)
    finite = np.isfinite(test64)
    diff_f = np.where(finite, np.abs(ref64 - test64), np.inf)
    rel = diff_f / np.maximum(np.abs(ref64), 1e-6)
    ref_order = decode(ref, n)
    try:
        test_order = decode(test, n)
    except DecodeError:
        test_order = None
    common = dict(slate_id=slate_id, n_items=n, max_abs_diff=float(diff_f.max()),
                  mean_abs_diff=float(diff_f.mean()), max_rel_diff=float(rel.max()),
                  nonfinite=int((~finite).sum()), ref_order=ref_order.tolist())
    if test_order is None:
        return SlateComparison(**common, test_order=None, perm_match=False, kendall_tau=-1.0, top1_match=False,
                               top10_overlap=0.0)
    k = min(10, n)
    return SlateComparison(
        **common, test_order=test_order.tolist(), perm_match=bool(np.array_equal(ref_order, test_order)),
        kendall_tau=kendall_tau(ref_order, test_order), top1_match=bool(ref_order[0] == test_order[0]),
        top10_overlap=len(set(ref_order[:k].tolist()) & set(test_order[:k].tolist())) / k)


@dataclass
class ComparisonSummary:
    """Aggregates of :class:`SlateComparison` records (means over slates; maxima of the diffs)."""

    slates: int
    perm_match_rate: float
    top1_agreement: float
    top10_agreement: float
    kendall_tau_mean: float
    kendall_tau_min: float
    max_abs_diff: float
    mean_abs_diff: float
    max_rel_diff: float
    nonfinite: int

    @classmethod
    def of(cls, records: Sequence[SlateComparison]) -> "ComparisonSummary":
        """Summary of ``records``; all-zero (slates 0) for none."""
        if not records:
            return cls(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0)
        mean = lambda key: float(np.mean([getattr(r, key) for r in records]))  # noqa: E731
        return cls(
            slates=len(records), perm_match_rate=mean("perm_match"), top1_agreement=mean("top1_match"),
            top10_agreement=mean("top10_overlap"), kendall_tau_mean=mean("kendall_tau"),
            kendall_tau_min=float(min(r.kendall_tau for r in records)),
            max_abs_diff=float(max(r.max_abs_diff for r in records)), mean_abs_diff=mean("mean_abs_diff"),
            max_rel_diff=float(max(r.max_rel_diff for r in records)),
            nonfinite=int(sum(r.nonfinite for r in records)))

    def to_dict(self) -> dict:
        return asdict(self)


class Verdict:
    """What :class:`ParityReport` and :class:`hllm.verify.gate.GateReport` share: a verdict over
    ``self.records`` (:class:`SlateComparison`) against ``self.thresholds``.

    A subclass names its criteria (:meth:`criteria`); no slates at all is a failure of its own.
    ``bool(report)`` = :attr:`passed`.
    """

    records: list[SlateComparison]

    def summary(self) -> ComparisonSummary:
        return ComparisonSummary.of(self.records)

    def criteria(self, s: ComparisonSummary) -> list[tuple[str, float, float, str]]:
        """``(name, value, limit, op)`` of each criterion (see :func:`check`) for summary ``s``."""
        raise NotImplementedError

    def failures(self) -> list[Failure]:
        """Each failed criterion: name, value, limit, and by how much it missed."""
        s = self.summary()
        if not s.slates:
            return [Failure("slates", 0, 1, ">=", 1)]
        return check(self.criteria(s))

    @property
    def passed(self) -> bool:
        return not self.failures()

    def __bool__(self) -> bool:
        return self.passed

    def verdict_dict(self) -> dict:
        """passed, failures, thresholds, precision, reference, backend (the keys every report has)."""
        return {"passed": self.passed, "failures": [f.to_dict() for f in self.failures()],
                "thresholds": asdict(self.thresholds), "precision": str(self.precision),
                "reference": self.reference, "backend": self.backend}


@dataclass
class ParityReport(Verdict):
    """Verdict of a parity run: ``bool(report)`` = passed.

    Top-level keys of :meth:`to_dict`: the :class:`ComparisonSummary` fields, passed, failures (each
    failed criterion with its value, limit and margin), precision, reference, backend, thresholds,
    per_slate (optional).
    """

    records: list[SlateComparison]
    thresholds: Thresholds
    reference: str = "torch"
    backend: str = ""
    precision: str = "fp32"
    extra: dict = field(default_factory=dict)

    def criteria(self, s: ComparisonSummary) -> list[tuple[str, float, float, str]]:
        t = self.thresholds
        return [
            ("max_abs_diff", s.max_abs_diff, t.atol, "<="),
            ("perm_match_rate", s.perm_match_rate, t.min_perm_match, ">="),
            ("top1_agreement", s.top1_agreement, t.min_top1, ">="),
            ("kendall_tau_mean", s.kendall_tau_mean, t.min_tau, ">="),
            ("nonfinite", s.nonfinite, t.max_nonfinite, "<="),
        ]

    def to_dict(self, per_slate: bool = True) -> dict:
        d = {**self.summary().to_dict(), **self.verdict_dict(), **self.extra}
        if per_slate:
            d["per_slate"] = [r.to_dict() for r in self.records]
        return d


def run_parity(reference, test, slates: list[dict], thresholds: Thresholds | None = None, batch_size: int = 1,
               on_progress=None, **engine_options) -> ParityReport:
    """Run two artefacts on the same encoded slates and compare them slate by slate.

    Args:
        reference: path (checkpoint dir) or :class:`hllm.runtime.Ranker` of the reference.
        test: path (export dir, .onnx, .plan, checkpoint) or Ranker of the backend under test.
        slates: every batch is encoded ONCE with the reference's prompt builder
            (:func:`hllm.verify.scoring.score_slates`), so both engines see identical inputs.
        thresholds: pass criteria (default :class:`Thresholds`). batch_size: slates per engine call.
        on_progress: called with the number of slates after each batch.
        engine_options: passed to :func:`hllm.runtime.artefact.open_engine` (``threads``...).
    Raises:
        EngineError: the two artefacts use different prompt specs or K (parity would be meaningless).
    """
    ref = reference if isinstance(reference, Ranker) else Ranker.from_path(reference, **engine_options)
    tst = test if isinstance(test, Ranker) else Ranker.from_path(test, **engine_options)
    if ref.builder.spec != tst.builder.spec:
        raise EngineError("reference and test were built with different prompt specs")
    if ref.engine.num_positions != tst.engine.num_positions:
        raise EngineError(f"K differs: reference {ref.engine.num_positions}, test {tst.engine.num_positions}")
    with ref, tst:
        a, b = score_slates([ref.engine, tst.engine], ref.builder, slates, batch_size, on_progress)
    records = [compare_slate(x, y, str(s.get("slate_id", i))) for i, (x, y, s) in enumerate(zip(a, b, slates))]
    return ParityReport(records, thresholds or Thresholds(), reference=ref.engine.name, backend=tst.engine.name,
                        precision=str(tst.engine.precision))
