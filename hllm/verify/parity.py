"""Parity: compare a backend's score matrices and rankings with the PyTorch reference.

Per slate: max / mean absolute and relative difference of M over the real rows, non-finite count,
exact permutation match, Kendall tau between the two rankings (``scipy.stats.kendalltau``), top-1 and
top-10 agreement. The report is JSON-serialisable and says by how much each threshold failed
(Polygraphy-comparator style).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from hllm.errors import DecodeError
from hllm.runtime.decode import decode


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


def compare_slate(ref: np.ndarray, test: np.ndarray, slate_id: str = "") -> dict:
    """Compare one slate's score matrices ``ref``, ``test``: ``[n, K]`` float (real rows only).

    Returns a dict: slate_id, n_items, max_abs_diff, mean_abs_diff, max_rel_diff, nonfinite,
    perm_match, kendall_tau, top1_match, top10_overlap (fraction of the reference top-10 kept),
    ref_order, test_order (None when test is non-finite).
    """
    n = ref.shape[0]
    ref64, test64 = ref.astype(np.float64), test.astype(np.float64)
    finite = np.isfinite(test64)
    nonfinite = int((~finite).sum())
    diff = np.abs(ref64 - test64)
    diff_f = np.where(finite, diff, np.inf)
    rel = diff_f / np.maximum(np.abs(ref64), 1e-6)
    ref_order = decode(ref, n)
    try:
        test_order = decode(test, n)
    except DecodeError:
        test_order = None
    rec = {
        "slate_id": slate_id,
        "n_items": n,
        "max_abs_diff": float(diff_f.max()),
        "mean_abs_diff": float(diff_f.mean()),
        "max_rel_diff": float(rel.max()),
        "nonfinite": nonfinite,
        "ref_order": ref_order.tolist(),
        "test_order": None if test_order is None else test_order.tolist(),
    }
    if test_order is None:
        rec.update(perm_match=False, kendall_tau=-1.0, top1_match=False, top10_overlap=0.0)
    else:
        k = min(10, n)
        rec.update(
            perm_match=bool(np.array_equal(ref_order, test_order)),
            kendall_tau=kendall_tau(ref_order, test_order),
            top1_match=bool(ref_order[0] == test_order[0]),
            top10_overlap=len(set(ref_order[:k].tolist()) & set(test_order[:k].tolist())) / k,
        )
    return rec


def failed_checks(checks: list[tuple[str, float, float, str]]) -> list[dict]:
    """The criteria that fail, each as ``{criterion, value, limit, op, missed_by}``.

    ``checks`` holds ``(name, value, limit, op)`` with op ``"<="`` (value must not exceed limit) or
    ``">="`` (value must reach limit); comparisons allow 1e-12 of float round-off.
    """
    out = []
    for name, v, lim, op in checks:
        ok = v <= lim + 1e-12 if op == "<=" else v >= lim - 1e-12
        if not ok:
            out.append({"criterion": name, "value": v, "limit": lim, "op": op, "missed_by": abs(v - lim)})
    return out


@dataclass
class ParityReport:
    """Aggregate of :func:`compare_slate` records plus the verdict.

    Top-level keys of :meth:`to_dict`: slates, perm_match_rate, top1_agreement, top10_agreement,
    kendall_tau_mean, kendall_tau_min, max_abs_diff, mean_abs_diff, max_rel_diff, nonfinite, passed,
    failures (each failed criterion with its value, limit and margin), precision, reference, backend,
    thresholds, per_slate.
    """

    records: list[dict]
    thresholds: Thresholds
    reference: str = "torch"
    backend: str = ""
    precision: str = "fp32"
    extra: dict = field(default_factory=dict)

    def summary(self) -> dict:
        r = self.records
        if not r:
            return {"slates": 0}
        finite_max = [x["max_abs_diff"] for x in r]
        return {
            "slates": len(r),
            "perm_match_rate": float(np.mean([x["perm_match"] for x in r])),
            "top1_agreement": float(np.mean([x["top1_match"] for x in r])),
            "top10_agreement": float(np.mean([x["top10_overlap"] for x in r])),
            "kendall_tau_mean": float(np.mean([x["kendall_tau"] for x in r])),
            "kendall_tau_min": float(np.min([x["kendall_tau"] for x in r])),
            "max_abs_diff": float(np.max(finite_max)),
            "mean_abs_diff": float(np.mean([x["mean_abs_diff"] for x in r])),
            "max_rel_diff": float(np.max([x["max_rel_diff"] for x in r])),
            "nonfinite": int(np.sum([x["nonfinite"] for x in r])),
        }

    def failures(self) -> list[dict]:
        """Each failed criterion: name, value, limit, and by how much it missed."""
        s, t = self.summary(), self.thresholds
        if not s.get("slates"):
            return [{"criterion": "slates", "value": 0, "limit": 1, "missed_by": 1}]
        checks = [
            ("max_abs_diff", s["max_abs_diff"], t.atol, "<="),
            ("perm_match_rate", s["perm_match_rate"], t.min_perm_match, ">="),
            ("top1_agreement", s["top1_agreement"], t.min_top1, ">="),
            ("kendall_tau_mean", s["kendall_tau_mean"], t.min_tau, ">="),
            ("nonfinite", s["nonfinite"], t.max_nonfinite, "<="),
        ]
        return failed_checks(checks)

    @property
    def passed(self) -> bool:
        return not self.failures()

    def to_dict(self, per_slate: bool = True) -> dict:
        d = {**self.summary(), "passed": self.passed, "failures": self.failures(), "precision": self.precision,
             "reference": self.reference, "backend": self.backend, "thresholds": asdict(self.thresholds)}
        d.update(self.extra)
        if per_slate:
            d["per_slate"] = self.records
        return d


def run_parity(
    reference,
    test,
    slates: list[dict],
    thresholds: Thresholds | None = None,
    batch_size: int = 1,
    on_batch=None,
) -> ParityReport:
    """Run two engines on the same encoded slates and compare them slate by slate.

    Args:
        reference: path (checkpoint dir) or :class:`hllm.runtime.Ranker` of the reference.
        test: path (export dir, .onnx, .plan, checkpoint) or Ranker of the backend under test.
        slates: the slates; every batch is encoded ONCE with the reference's prompt builder, so both
            engines see identical inputs.
        thresholds: pass criteria (default :class:`Thresholds`).
        batch_size: slates per engine call.
        on_batch: optional callable(n_done) for progress.
    Raises:
        EngineError: the two artefacts use different prompt specs or K (parity would be meaningless).
    """
    from hllm.errors import EngineError
    from hllm.runtime.ranker import Ranker

    ref = reference if isinstance(reference, Ranker) else Ranker.from_path(reference)
    tst = test if isinstance(test, Ranker) else Ranker.from_path(test)
    if ref.builder.spec != tst.builder.spec:
        raise EngineError("reference and test were built with different prompt specs")
    if ref.engine.num_positions != tst.engine.num_positions:
        raise EngineError(f"K differs: reference {ref.engine.num_positions}, test {tst.engine.num_positions}")
    records = []
    with ref, tst:
        for i in range(0, len(slates), batch_size):
            chunk = slates[i : i + batch_size]
            batch = ref.builder.encode(chunk)
            a = ref.scores(batch)
            b = tst.scores(batch)
            for j, s in enumerate(chunk):
                n = int(batch.n_items[j])
                records.append(compare_slate(a[j, :n], b[j, :n], str(s.get("slate_id", i + j))))
            if on_batch:
                on_batch(len(chunk))
    precision = "fp32"
    meta = getattr(tst.engine, "sidecar", None) or {}
    if not meta and not isinstance(test, Ranker):
        from hllm.runtime.artefact import resolve

        meta = resolve(test).meta
    precision = meta.get("precision", precision)
    return ParityReport(records, thresholds or Thresholds(), reference=ref.engine.name, backend=tst.engine.name,
                        precision=precision)
