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
