"""INT8 for the OpenVINO engine: NNCF post-training quantization of a ``standard`` export, with SmoothQuant.

NNCF (``nncf.quantize`` with ``model_type=ModelType.TRANSFORMER``) inserts FakeQuantize nodes on the
MatMul inputs and weights (8-bit, per-channel weights, per-tensor activations) from ranges measured on
calibration inputs, and for transformer models first applies SmoothQuant (Xiao et al. 2023, "SmoothQuant:
Accurate and Efficient Post-Training Quantization for Large Language Models", §4): activation outlier
channels are divided by ``s_j = max|X_j|^α / max|W_j|^(1-α)`` and the following weights multiplied by it,
which is exact in real arithmetic and moves the quantization difficulty from activations to weights.
Parts named in ``keep_float`` (module paths or parts as :func:`hllm.calibration.quantize.nodes_in_part`
resolves them, e.g. ``backbone.layers.11.mlp.down_proj``, ``block:11``, ``head``) go to NNCF's
``IgnoredScope`` and stay fp32.

The output is an export directory that ``hllm rank`` / :func:`hllm.runtime.artefact.open_engine` open with
the OpenVINO engine: the FP32 export's files plus ``model_int8.xml`` / ``.bin`` (OpenVINO IR, weights
kept uncompressed), and ``export.json`` with ``precision: int8``, ``engine: openvino``,
``openvino: {ir, inference_precision}`` and ``quantization`` (what was done, for ``hllm info``).

Sources: NNCF post-training quantization, https://docs.openvino.ai/2026/openvino-workflow/model-optimization-guide/quantizing-models-post-training/basic-quantization-flow.html ;
``nncf.IgnoredScope``, ``nncf.AdvancedSmoothQuantParameters`` (NNCF API reference).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from hllm.errors import EngineError

IR_NAME = "model_int8.xml"


@contextlib.contextmanager
def nncf_output_to_stderr() -> Iterator[None]:
    """Within the block, NNCF's output goes to stderr, not stdout: its progress bars (``rich`` consoles that
    write to whatever ``sys.stdout`` is when they print, ``nncf.common.logging.track_progress``) and its log
    records (the ``nncf`` logger's console handler holds the ``sys.stdout`` of import time,
    ``nncf.common.logging.logger``). stdout stays free for the data a command prints (``--json``, ``-o -``).
    Restores both on exit; a file handler added to the ``nncf`` logger is left alone.
    """
    with contextlib.redirect_stdout(sys.stderr):
        import nncf  # noqa: F401 - what it prints while importing goes to stderr too; its logger exists from here on

        moved = [h for h in logging.getLogger("nncf").handlers  # console handlers, not a user's log file
                 if type(h) is logging.StreamHandler and h.stream not in (sys.stderr, sys.__stderr__)]
        old = [h.setStream(sys.stderr) for h in moved]
        try:
            yield
        finally:
            for h, stream in zip(moved, old):
                h.setStream(stream)

def _nncf_input(export_dir, out_dir):
    """The export NNCF quantizes and the new output directory: ``(ExportMeta, Path)``.

    Raises: EngineError for an export that is not fp32 of flavour ``standard``, or an existing ``out_dir``.
    """
    from hllm.formats.export import read_export

    meta = read_export(export_dir)
    out = Path(out_dir)
    if meta.flavour != "standard" or meta.precision.value != "fp32":
        raise EngineError(f"{meta.root}: NNCF INT8 needs an fp32 export of flavour standard, got "
                          f"{meta.precision.value} {meta.flavour} (export with --flavour standard)")
    if out.exists():
        raise EngineError(f"{out} exists; choose a new directory")
    return meta, out



def ignored_node_names(onnx_path: Path, keep_float: Sequence[str]) -> list[str]:
    """ONNX node names of the parts to keep in fp32 (OpenVINO's ONNX frontend keeps them as op names).

    Raises: EngineError for a part that matches no node (:func:`hllm.calibration.quantize.nodes_in_part`).
    """
    if not keep_float:
        return []
    import onnx

    from hllm.calibration.quantize import nodes_in_part

    model = onnx.load(str(onnx_path), load_external_data=False)
    names: list[str] = []
    for part in keep_float:
        names += [n for n in nodes_in_part(model, part) if n not in names]
    return names


def calibration_feeds(slates: Sequence[dict], builder, count: int, seed: int = 0, context: bool = False,
                      exclude_ids: Sequence[str] = ()) -> list[dict]:
    """``count`` slates drawn reproducibly (:func:`hllm.calibration.data.choose_slates`) and encoded one per feed
    with the export's prompt builder, with ``context_positions`` when the graph reads the user context.

    Raises: SlateError (too few eligible slates, encoding).
    """
    from hllm.calibration.data import choose_slates

    return [builder.encode([s]).inputs(context) for s in choose_slates(slates, count, seed, exclude_ids)]


def quantize_openvino(export_dir: str | os.PathLike, out_dir: str | os.PathLike, calibration: Iterable[dict],
                      keep_float: Sequence[str] = (), smooth_quant_alpha: float | None = None,
                      subset_size: int | None = None) -> dict:
    """Quantize the FP32 ``standard`` export in ``export_dir`` to INT8 with NNCF; write ``out_dir``.

    Args:
        export_dir: an FP32 export of flavour ``standard`` (OpenVINO cannot read the fused one).
        out_dir: the new export directory (must not exist; never inside ``export_dir``).
        calibration: feed dicts ``{input name: array}`` — e.g. a :class:`hllm.formats.calibration_set.CalibrationSet`
            of real slates encoded with the export's prompt builder.
        keep_float: parts kept in fp32 (module doc). smooth_quant_alpha: SmoothQuant α for MatMuls
            (None = NNCF's default for transformers; a negative value disables smoothing).
        subset_size: calibration inputs NNCF reads (default: all).
    Returns: the ``quantization`` record written into the sidecar.
    Raises: EngineError (wrong flavour / precision, out_dir exists, a part that matches nothing,
        NNCF failure).
    """
    with nncf_output_to_stderr():
        import nncf
    import openvino as ov

    meta, out = _nncf_input(export_dir, out_dir)
    feeds = list(calibration)
    if not feeds:
        raise EngineError("NNCF INT8 needs at least one calibration input")
    from hllm.formats.graph import input_names, sidecar_reads_context

    want = set(input_names(sidecar_reads_context(meta.raw)))
    if set(feeds[0]) != want:
        raise EngineError(f"calibration inputs {sorted(feeds[0])} do not match the graph's {sorted(want)} "
                          "(encode them with calibration_feeds(..., context=...))")
    ignored = ignored_node_names(meta.onnx_path, keep_float)
    advanced = None
    if smooth_quant_alpha is not None:
        advanced = nncf.AdvancedQuantizationParameters(
            smooth_quant_alphas=nncf.AdvancedSmoothQuantParameters(matmul=float(smooth_quant_alpha)))
    t0 = time.perf_counter()
    model = ov.Core().read_model(str(meta.onnx_path))
    try:
        with nncf_output_to_stderr():
            q = nncf.quantize(model, nncf.Dataset(feeds), model_type=nncf.ModelType.TRANSFORMER,
                              subset_size=subset_size or len(feeds),
                              ignored_scope=nncf.IgnoredScope(names=ignored, validate=False) if ignored else None,
                              advanced_parameters=advanced)
    except Exception as e:
        raise EngineError(f"NNCF quantization failed: {e}") from None
    seconds = time.perf_counter() - t0
    record = {"backend": "nncf", "precision": "int8", "nncf": nncf.__version__, "openvino": ov.__version__,
              "model_type": "transformer", "smooth_quant_alpha": smooth_quant_alpha,
              "calibration_inputs": subset_size or len(feeds), "keep_float": list(keep_float),
              "ignored_nodes": len(ignored), "fake_quantize_nodes": fake_quantize_count(q), "seconds": round(seconds, 1)}
    write_int8_export(meta, q, out, record)
    return record


def fake_quantize_count(model) -> int:
    """Number of ``FakeQuantize`` nodes of an OpenVINO model (the quantizers NNCF inserted and kept)."""
    return sum(op.get_type_name() == "FakeQuantize" for op in model.get_ops())


def write_int8_export(meta, model, out: Path, record: dict, inference_precision: str = "f32") -> None:
    """Write the quantized OpenVINO ``model`` as the new export directory ``out``: the FP32 export's files,
    ``model_int8.xml`` / ``.bin`` (weights uncompressed) and a sidecar with ``precision: int8``,
    ``engine: openvino``, ``openvino: {ir, inference_precision}`` and ``quantization: record``. Written
    to a staging directory beside ``out`` and renamed, so a failure leaves no half export.

    Args:
        meta: the FP32 export's :class:`hllm.formats.export.ExportMeta`. model: an ``openvino.Model``.
        out: the new directory (must not exist). record: what was done (for ``hllm info``).
        inference_precision: the CPU plugin's hint for the ops left in float: ``f32`` or ``bf16``
            (:func:`hllm.engines.openvino.check_inference_precision`).
    Raises: EngineError if ``out`` exists; OSError from writing.
    """
    import openvino as ov

    from hllm.files import copy_files
    from hllm.formats.export import write_export

    if out.exists():
        raise EngineError(f"{out} exists; choose a new directory")
    staging = out.with_name(f".{out.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        ov.save_model(model, str(staging / IR_NAME), compress_to_fp16=False)
        copy_files(meta.root, staging, skip=("export.json",))
        raw = {**meta.raw, "precision": "int8", "engine": "openvino", "quantization": record,
               "openvino": {"ir": IR_NAME, "inference_precision": inference_precision}}
        write_export(staging, raw)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


# --- INT8 with accuracy control -------------------------------------------------------------------------
#
# NNCF's ``quantize_with_accuracy_control`` quantizes the whole graph, then reverts groups of quantizers to
# float, greedily, until a user metric has dropped by at most ``max_drop`` from the float model's value.
# It ranks the groups by that same metric: its ``validation_fn(model, items)`` returns the aggregate metric
# and one value per item; NNCF picks the items the quantized model lost most on (the ranking subset) and,
# for each group, measures the metric on those items with that group reverted (NNCF docs, "Quantization
# with accuracy control"; ``nncf.quantization.algorithms.accuracy_control``). Here an item is one slate and
# the value is a ranking quality of that slate, so the groups are ranked by what they do to rankings.

#: Per-slate qualities the validation function can return (:func:`slate_value`), higher = better.
VALIDATION_METRICS = ("regret", "tau", "auc", "ndcg@10")

#: ``max_drop`` per metric when the gate thresholds do not give one: the gate's default margins (regret:
#: p95 of the per-slate regret ≤ 1e-3; tau: mean Kendall tau ≥ 0.9; AUC 0.005; NDCG@10 0.01).
DEFAULT_MAX_DROP = {"regret": 1e-3, "tau": 0.1, "auc": 0.005, "ndcg@10": 0.01}

#: Regret counted for a slate whose scores are not finite (no ranking can be decoded): a random order's
#: (the gate counts +inf; NNCF needs finite values to average and subtract).
NONFINITE_REGRET = 1.0


def slate_value(metric: str, ref: np.ndarray, test: np.ndarray, labels=None) -> float:
    """One slate's ranking quality under ``metric`` (higher = better), from the FP32 and the candidate
    engine's score matrices (``[n, K]`` float each).

    ``regret``: ``1 −`` the assignment regret (:func:`hllm.verify.gate.assignment_regret`: the share of
    FP32's objective, paper eq. 1, that the candidate's ranking loses) under the FP32 scores (FP32
    itself: 1, a random order: 0 on average; offset by 1 because NNCF 3.4 divides by the float model's
    metric when it computes a drop, even an absolute one). ``tau``: Kendall tau between the two rankings (:func:`hllm.verify.parity.kendall_tau`;
    FP32: 1). ``auc`` / ``ndcg@10``: the candidate's ranking against the slate's 0/1 ``labels``
    (:func:`hllm.verify.metrics.slate_metrics`). Non-finite candidate scores count as a random order
    for regret (value 0), as a reversed one for tau (−1) and as 0 for the labelled metrics.

    Raises: ValueError for an unknown metric; SlateError for a labelled metric on a slate without a positive
        and a negative label; DecodeError if ``ref`` is not finite.
    """
    from hllm.errors import DecodeError, SlateError
    from hllm.runtime.decode import decode
    from hllm.verify.gate import assignment_regret
    from hllm.verify.metrics import slate_metrics
    from hllm.verify.parity import kendall_tau

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
        from hllm.errors import SlateError

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
        from hllm.formats.graph import OUTPUT_NAME

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


@contextlib.contextmanager
def _restorer_report() -> Iterator[dict]:
    """Within the block, record what NNCF's accuracy restorer did: ``groups`` (quantizer groups it could
    revert), ``report`` (its ``QuantizationAccuracyRestorerReport``: reverted groups and operations,
    whether the drop was reached). NNCF logs this only as text; the two methods that see it are wrapped
    and restored on exit. If NNCF's internals differ (another version), nothing is recorded."""
    got: dict = {}
    try:
        from nncf.quantization.algorithms.accuracy_control.algorithm import QuantizationAccuracyRestorer
        from nncf.quantization.algorithms.accuracy_control.ranker import Ranker
        orig_report = QuantizationAccuracyRestorer.__dict__["_print_report"]
        orig_find = Ranker.find_groups_of_quantizers_to_rank
    except (ImportError, KeyError, AttributeError):
        yield got
        return

    def find(self, graph):
        groups = orig_find(self, graph)
        got.setdefault("groups", len(groups))
        return groups

    def report(rep, max_iterations):
        got["report"] = rep
        return orig_report.__func__(rep, max_iterations)

    Ranker.find_groups_of_quantizers_to_rank = find
    QuantizationAccuracyRestorer._print_report = staticmethod(report)
    try:
        yield got
    finally:
        Ranker.find_groups_of_quantizers_to_rank = orig_find
        QuantizationAccuracyRestorer._print_report = orig_report


def encode_slates(meta, slates: Sequence[dict]) -> tuple[list[dict], list[int]]:
    """Each slate encoded alone by the export's prompt builder and tokenizer: ``(feeds, n_items)``.
    Raises: SlateError (a slate that does not encode), CheckpointError (tokenizer)."""
    from hllm.formats.graph import sidecar_reads_context
    from hllm.runtime.prompt import PromptBuilder, load_tokenizer

    builder = PromptBuilder(load_tokenizer(meta.tokenizer_path), meta.prompt, max_items=meta.num_positions)
    ctx = sidecar_reads_context(meta.raw)
    feeds, n = [], []
    for s in slates:
        b = builder.encode([s])
        feeds.append(b.inputs(ctx))
        n.append(int(b.n_items[0]))
    return feeds, n


def _search_record(fn: "RankingValidation", probe: dict) -> dict:
    """What NNCF's search did, from the validation function (``fn``: its full validations, slates run, the
    deadline) and the restorer's report (``probe`` of :func:`_restorer_report`): the float / fully quantized
    aggregates and the trace, groups found and reverted, reverted operations and quantizers, iterations."""
    rep = probe.get("report")
    trace = [round(x, 6) for x in fn.trace]
    return {"float_metric": trace[0] if trace else None, "quantized_metric": trace[1] if len(trace) > 1 else None,
            "trace": trace, "groups": probe.get("groups"),
            "reverted_groups": len(rep.removed_groups) if rep is not None else (0 if len(trace) <= 2 else None),
            "reverted_operations": [n.node_name for n in rep.reverted_operations] if rep is not None else [],
            "reverted_quantizers": [n.node_name for n in rep.removed_quantizers] if rep is not None else [],
            "quantized_operations": rep.num_quantized_operations if rep is not None else None,
            "reached_max_drop": (bool(rep.reached_required_drop) if rep is not None else len(trace) <= 2)
            and not fn.out_of_time,
            "iterations": rep.num_iterations + 1 if rep is not None and rep.num_iterations is not None else 0,
            "slates_run": fn.slates_run, "out_of_time": fn.out_of_time}


def _nncf_parameters(smooth_quant_alpha: float | None, ranking_subset: int, max_reverted: int | None):
    """NNCF's advanced quantization parameters (SmoothQuant α for MatMuls, None = NNCF's default) and
    accuracy-restorer parameters (ranking subset, one ranking worker, the most groups reverted)."""
    import nncf

    advanced = None
    if smooth_quant_alpha is not None:
        advanced = nncf.AdvancedQuantizationParameters(
            smooth_quant_alphas=nncf.AdvancedSmoothQuantParameters(matmul=float(smooth_quant_alpha)))
    restorer = nncf.AdvancedAccuracyRestorerParameters(
        ranking_subset_size=int(ranking_subset), num_ranking_workers=1,
        **({"max_num_iterations": int(max_reverted)} if max_reverted else {}))
    return advanced, restorer


def quantize_with_accuracy_control(
    export_dir: str | os.PathLike, out_dir: str | os.PathLike, calibration: Iterable[dict],
    validation: Sequence[dict], *, metric: str = "regret", max_drop: float | None = None, thresholds=None,
    reference: Sequence[np.ndarray] | None = None, ranking_subset: int = 8, max_reverted: int | None = None,
    inference_precision: str = "f32", keep_float: Sequence[str] = (), smooth_quant_alpha: float | None = None,
    budget_s: float | None = None, on_budget: str = "return", say=lambda m: None,
) -> dict:
    """INT8 of the FP32 ``standard`` export with NNCF's accuracy control, judged by rankings; writes ``out_dir``.

    ``nncf.quantize_with_accuracy_control`` (transformer model type, SmoothQuant as in
    :func:`quantize_openvino`) quantizes every MatMul, then reverts quantizer groups to float one at a
    time, most harmful first, until the :class:`RankingValidation` aggregate of ``metric`` on the
    ``validation`` slates is within ``max_drop`` (absolute) of the float model's, or ``max_reverted``
    groups are reverted, or none is left. NNCF validates in f32 (its own compile); ``inference_precision``
    ``bf16`` only sets the hint the written export runs with (the ops left in float then run in bf16).

    Args:
        export_dir: an FP32 export of flavour ``standard``. out_dir: the new export (must not exist).
        calibration: feed dicts (:func:`calibration_feeds`) for the activation ranges.
        validation: slates NNCF validates on (labelled for ``auc`` / ``ndcg@10``); keep them apart from the
            slates that judge the result and from the calibration slates.
        metric: the per-slate quality (:data:`VALIDATION_METRICS`). max_drop: absolute drop allowed
            (default :func:`max_drop_for` of ``thresholds``). reference: FP32 scores of the validation slates
            (default: the float model's scores in NNCF's first validation, OpenVINO f32). ranking_subset: slates NNCF ranks groups on.
        max_reverted: most groups reverted (None = no limit). inference_precision: ``f32`` or ``bf16``.
        budget_s: seconds the search may take from the start (None = no limit); past it NNCF is stopped with
            the model as it stands (:class:`RankingValidation` ``deadline``; ``out_of_time`` in the record), or,
            with ``on_budget="raise"``, raises EngineError at once (no INT8 export is written).
        keep_float / smooth_quant_alpha: as :func:`quantize_openvino`. say: progress messages.
    Returns: the ``quantization`` record written into the sidecar, with ``accuracy_control``: metric,
        max_drop, validation slates, the float / fully quantized / final aggregates (``trace``: every full
        validation in order), quantizer groups found and reverted, the reverted operations and quantizers
        (NNCF node names; a group may hold quantizers only), FakeQuantize counts,
        slates run and seconds.
    Raises: EngineError (wrong flavour / precision, out_dir exists, bad inputs, NNCF failure), SlateError
        (a validation slate that does not encode, or lacks labels for a labelled metric).
    """
    with nncf_output_to_stderr():
        import nncf
    import openvino as ov

    from hllm.engines.openvino import check_inference_precision
    from hllm.formats.graph import input_names, sidecar_reads_context

    meta, out = _nncf_input(export_dir, out_dir)
    hint = check_inference_precision(inference_precision)
    if metric not in VALIDATION_METRICS:
        raise EngineError(f"unknown validation metric {metric!r}; one of {VALIDATION_METRICS}")
    drop = max_drop_for(metric, thresholds) if max_drop is None else float(max_drop)
    if not (drop >= 0 and np.isfinite(drop)):
        raise EngineError(f"max_drop must be a finite value ≥ 0, got {max_drop}")
    if ranking_subset < 1 or (max_reverted is not None and max_reverted < 1):
        raise EngineError(f"ranking_subset and max_reverted must be ≥ 1, got {ranking_subset}, {max_reverted}")
    feeds = list(calibration)
    if not feeds:
        raise EngineError("NNCF INT8 needs at least one calibration input")
    want = set(input_names(sidecar_reads_context(meta.raw)))
    if set(feeds[0]) != want:
        raise EngineError(f"calibration inputs {sorted(feeds[0])} do not match the graph's {sorted(want)} "
                          "(encode them with calibration_feeds(..., context=...))")
    if not validation:
        raise EngineError("accuracy control needs validation slates")
    vfeeds, n_items = encode_slates(meta, validation)
    t0 = time.perf_counter()
    model = ov.Core().read_model(str(meta.onnx_path))
    if reference is not None and len(reference) != len(vfeeds):
        raise EngineError(f"{len(reference)} reference score matrices for {len(vfeeds)} validation slates")
    labels = [s.get("labels") for s in validation]
    try:
        fn = RankingValidation(vfeeds, n_items, reference, labels, metric,
                               deadline=None if budget_s is None else time.monotonic() + float(budget_s),
                               stop=on_budget)
    except (ValueError,) as e:
        raise EngineError(str(e)) from None
    ignored = ignored_node_names(meta.onnx_path, keep_float)
    advanced, restorer = _nncf_parameters(smooth_quant_alpha, ranking_subset, max_reverted)
    say(f"NNCF accuracy control: {metric}, max drop {drop:g}, {len(feeds)} calibration inputs, "
        f"{len(vfeeds)} validation slates, ranking subset {ranking_subset}")
    try:
        with nncf_output_to_stderr(), _restorer_report() as probe_rep:
            q = nncf.quantize_with_accuracy_control(
                model, nncf.Dataset(feeds), nncf.Dataset(list(range(len(vfeeds)))), fn,
                max_drop=drop, drop_type=nncf.DropType.ABSOLUTE, subset_size=len(feeds),
                model_type=nncf.ModelType.TRANSFORMER,
                ignored_scope=nncf.IgnoredScope(names=ignored, validate=False) if ignored else None,
                advanced_quantization_parameters=advanced, advanced_accuracy_restorer_parameters=restorer)
    except SearchBudgetExceeded:
        raise EngineError(f"NNCF accuracy control stopped at its {budget_s:g} s budget ({fn.slates_run} slates run; "
                          f"full validations so far: {[round(x, 4) for x in fn.trace]}); no INT8 export written") from None
    except Exception as e:
        raise EngineError(f"NNCF quantization with accuracy control failed: {type(e).__name__}: {e}") from None
    seconds = time.perf_counter() - t0
    ac = {"metric": metric, "aggregate": "p95" if metric == "regret" else "mean", "max_drop": drop,
          "drop_type": "absolute", "validation_slates": len(vfeeds), "ranking_subset": int(ranking_subset),
          "max_reverted": max_reverted, **_search_record(fn, probe_rep), "budget_s": budget_s}
    trace = ac["trace"]
    record = {"backend": "nncf-accuracy-control", "precision": "int8", "nncf": nncf.__version__,
              "openvino": ov.__version__, "model_type": "transformer", "smooth_quant_alpha": smooth_quant_alpha,
              "calibration_inputs": len(feeds), "keep_float": list(keep_float), "ignored_nodes": len(ignored),
              "fake_quantize_nodes": fake_quantize_count(q), "inference_precision": hint,
              "accuracy_control": ac, "seconds": round(seconds, 1)}
    write_int8_export(meta, q, out, record, hint)
    say(f"reverted {ac['reverted_groups']} of {ac['groups']} quantizer groups in {seconds:.0f} s "
        f"({fn.slates_run} slates run); trace {trace}")
    return record


#: Settings of the accuracy-controlled INT8 candidate of ``hllm calibrate --backend auto``
#: (:func:`build_candidate`): NNCF validates on the first ``validation_slates`` gate slates cut to their
#: first ``max_candidates`` candidates, ranks groups on ``ranking_subset`` of them, reverts at most
#: ``max_reverted`` groups, and gives up after ``budget_s`` seconds (``on_budget="raise"``: the candidate is
#: then recorded with that error, not gated: a search cut short does not pass, and ranking one pass of 164
#: groups of the 135M model alone took 24 min on 2 shared cores).
CANDIDATE_SETTINGS = {"metric": "regret", "validation_slates": 24, "max_candidates": 20, "ranking_subset": 3,
                      "max_reverted": 10, "budget_s": 900.0, "on_budget": "raise"}


def cut_slate(slate: dict, n: int | None) -> dict:
    """The slate with only its first ``n`` candidates (and their labels); the slate itself when it has no
    more than ``n`` (or ``n`` is None). A copy: the input slate is never changed."""
    if not n or len(slate["candidates"]) <= n:
        return slate
    out = {**slate, "candidates": list(slate["candidates"][:n])}
    if isinstance(slate.get("labels"), list):
        out["labels"] = list(slate["labels"][:n])
    return out


def build_candidate(export_dir, dst, calibration, validation: Sequence[dict], thresholds=None,
                    inference_precision: str = "f32", settings: dict | None = None, say=lambda m: None) -> dict:
    """The ``openvino-int8`` / ``openvino-int8-bf16`` candidate of ``calibrate --backend auto``:
    :func:`quantize_with_accuracy_control` with :data:`CANDIDATE_SETTINGS` (overridden by ``settings``),
    ``max_drop`` from the gate ``thresholds`` (:func:`max_drop_for`), NNCF's validation on the first gate
    slates cut short (:func:`cut_slate`; their FP32 reference is NNCF's own float pass). When ``dst``'s
    sibling ``openvino-int8`` already holds the f32 candidate, the bf16 one reuses its IR with the bf16
    hint instead of searching again (the search runs in f32 either way).

    Returns: the ``quantization`` record. Raises: EngineError / SlateError as :func:`quantize_with_accuracy_control`.
    """
    from hllm.formats.export import read_export

    dst = Path(dst)
    done = dst.parent / "openvino-int8"
    if inference_precision != "f32" and dst.name != done.name and (done / "export.json").is_file():
        from hllm.engines.openvino import check_inference_precision

        meta = read_export(done)
        hint = check_inference_precision(inference_precision)
        import openvino as ov

        record = {**meta.raw["quantization"], "inference_precision": hint, "reused_from": done.name}
        write_int8_export(read_export(export_dir), ov.Core().read_model(str(done / IR_NAME)), dst, record, hint)
        return record
    st = {**CANDIDATE_SETTINGS, **(settings or {})}
    val = [cut_slate(s, st["max_candidates"]) for s in validation[: st["validation_slates"]]]
    return quantize_with_accuracy_control(export_dir, dst, calibration, val, metric=st["metric"],
                                          thresholds=thresholds, ranking_subset=st["ranking_subset"],
                                          max_reverted=st["max_reverted"], inference_precision=inference_precision,
                                          budget_s=st["budget_s"], on_budget=st["on_budget"], say=say)


def debug_int8(export_dir, slates: Sequence[dict], reference: Sequence[np.ndarray], calibration, settings,
               run_export, tmp: Path, say=lambda m: None) -> dict:
    """``hllm debug precision --precision int8``: the same route as the ``openvino-int8`` candidate —
    :func:`quantize_with_accuracy_control` on ``slates`` (whole, with their FP32 ``reference``), metric
    regret, ``max_drop`` from ``settings.gate`` (:func:`max_drop_for`), no limit on the groups reverted.

    Args:
        slates / reference: the debugged slates and the FP32 export's scores on them (one ``[n_i, K]`` each).
        calibration: feed dicts. settings: :class:`hllm.calibration.precision_debug.DebugSettings`.
        run_export: export dir → its score matrices on ``slates`` (the final INT8 graph is run once).
        tmp: a scratch directory (the INT8 export is written inside it).
    Returns: ``{baseline, islands, islands_figures, passed, accuracy_control, criteria}`` — ``islands``: the
        ONNX node names NNCF reverted to float (``keep_float`` of :func:`quantize_openvino` accepts them);
        ``baseline``: the fully quantized graph's aggregate; ``islands_figures``: the final graph's
        :func:`hllm.calibration.precision_debug.ranking_figures`, ``passed`` by ``settings.passes``.
    Raises: EngineError / SlateError as :func:`quantize_with_accuracy_control`.
    """
    from hllm.calibration.precision_debug import ranking_figures

    d = Path(tmp) / "int8-accuracy-control"
    rec = quantize_with_accuracy_control(export_dir, d, calibration, slates, metric="regret", reference=reference,
                                         thresholds=getattr(settings, "gate", None), ranking_subset=min(8, len(slates)),
                                         say=say)
    ac = rec["accuracy_control"]
    fig = ranking_figures(reference, run_export(d), slates, getattr(settings, "gate", None))
    say(f"reverted {ac['reverted_groups']} of {ac['groups']} quantizer groups ({len(ac['reverted_operations'])} "
        f"operations) → top-1 {fig['top1_agreement']:.3f}, tau {fig['kendall_tau_mean']:.3f}")
    return {"baseline": {"metric": ac["metric"], "aggregate": ac["quantized_metric"]},
            "islands": ac["reverted_operations"], "islands_figures": fig, "passed": settings.passes(fig),
            "accuracy_control": ac, "criteria": {k: v for k, v in vars(settings).items() if k != "gate"}}
