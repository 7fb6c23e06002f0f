"""INT8 for the OpenVINO engine with NNCF's accuracy control, judged by rankings: the search
(:func:`quantize_with_accuracy_control`), the ``openvino-int8`` recipe of ``hllm calibrate --backend auto``
(:func:`build_recipe`) and ``hllm debug precision --precision int8`` (:func:`debug_int8`).

``nncf.quantize_with_accuracy_control`` (NNCF docs, "Quantization with accuracy control") quantizes every
MatMul as :func:`hllm.calibration.recipes.openvino_int8.quantize_openvino` does, then reverts quantizer groups to float
until the ranking quality of :class:`hllm.calibration.recipes.ranking_validation.RankingValidation` has dropped by at
most ``max_drop``.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from hllm.calibration.recipes.openvino_int8 import (IR_NAME, checked_feeds, fake_quantize_count, ignored_node_names, nncf_input,
                                            nncf_output_to_stderr, write_int8_export)
from hllm.calibration.precision_search.precision_debug import ranking_figures
from hllm.calibration.recipes.ranking_validation import (VALIDATION_METRICS, RankingValidation, SearchBudgetExceeded,
                                                 encode_slates, max_drop_for)
from hllm.engines.openvino import check_inference_precision, no_signal_stack_after_compile
from hllm.errors import EngineError
from hllm.formats.export import read_export


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
    :func:`~hllm.calibration.recipes.openvino_int8.quantize_openvino`) quantizes every MatMul, then reverts quantizer groups to float one at a
    time, most harmful first, until the :class:`~hllm.calibration.recipes.ranking_validation.RankingValidation` aggregate of ``metric`` on the
    ``validation`` slates is within ``max_drop`` (absolute) of the float model's, or ``max_reverted``
    groups are reverted, or none is left. NNCF validates in f32 (its own compile); ``inference_precision``
    ``bf16`` only sets the hint the written export runs with (the ops left in float then run in bf16).

    Args:
        export_dir: an FP32 export of flavour ``standard``. out_dir: the new export (must not exist).
        calibration: feed dicts (:func:`hllm.calibration.recipes.openvino_int8.calibration_feeds`) for the activation ranges.
        validation: slates NNCF validates on (labelled for ``auc`` / ``ndcg@10``); keep them apart from the
            slates that judge the result and from the calibration slates.
        metric: the per-slate quality (:data:`~hllm.calibration.recipes.ranking_validation.VALIDATION_METRICS`). max_drop: absolute drop allowed
            (default :func:`~hllm.calibration.recipes.ranking_validation.max_drop_for` of ``thresholds``). reference: FP32 scores of the validation slates
            (default: the float model's scores in NNCF's first validation, OpenVINO f32). ranking_subset: slates NNCF ranks groups on.
        max_reverted: most groups reverted (None = no limit). inference_precision: ``f32`` or ``bf16``.
        budget_s: seconds the search may take from the start (None = no limit); past it NNCF is stopped with
            the model as it stands (:class:`~hllm.calibration.recipes.ranking_validation.RankingValidation` ``deadline``; ``out_of_time`` in the record), or,
            with ``on_budget="raise"``, raises EngineError at once (no INT8 export is written).
        keep_float / smooth_quant_alpha: as :func:`~hllm.calibration.recipes.openvino_int8.quantize_openvino`. say: progress messages.
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

    meta, out = nncf_input(export_dir, out_dir)
    hint = check_inference_precision(inference_precision)
    if metric not in VALIDATION_METRICS:
        raise EngineError(f"unknown validation metric {metric!r}; one of {VALIDATION_METRICS}")
    drop = max_drop_for(metric, thresholds) if max_drop is None else float(max_drop)
    if not (drop >= 0 and np.isfinite(drop)):
        raise EngineError(f"max_drop must be a finite value ≥ 0, got {max_drop}")
    if ranking_subset < 1 or (max_reverted is not None and max_reverted < 1):
        raise EngineError(f"ranking_subset and max_reverted must be ≥ 1, got {ranking_subset}, {max_reverted}")
    feeds = checked_feeds(meta, calibration)
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
        with nncf_output_to_stderr(), _restorer_report() as probe_rep, no_signal_stack_after_compile():
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


#: Settings of the accuracy-controlled INT8 recipe of ``hllm calibrate --backend auto``
#: (:func:`build_recipe`): NNCF validates on the first ``validation_slates`` gate slates cut to their
#: first ``max_candidates`` candidates, ranks groups on ``ranking_subset`` of them, reverts at most
#: ``max_reverted`` groups, and gives up after ``budget_s`` seconds (``on_budget="raise"``: the recipe is
#: then recorded with that error, not gated: a search cut short does not pass, and ranking one pass of 164
#: groups of the 135M model alone took 24 min on 2 shared cores).
ACCURACY_CONTROL_SETTINGS = {"metric": "regret", "validation_slates": 24, "max_candidates": 20, "ranking_subset": 3,
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


def build_recipe(export_dir, dst, calibration, validation: Sequence[dict], thresholds=None,
                 inference_precision: str = "f32", settings: dict | None = None, say=lambda m: None) -> dict:
    """The ``openvino-int8`` / ``openvino-int8-bf16`` recipe of ``calibrate --backend auto``:
    :func:`quantize_with_accuracy_control` with :data:`ACCURACY_CONTROL_SETTINGS` (overridden by ``settings``),
    ``max_drop`` from the gate ``thresholds`` (:func:`~hllm.calibration.recipes.ranking_validation.max_drop_for`), NNCF's validation on the first gate
    slates cut short (:func:`cut_slate`; their FP32 reference is NNCF's own float pass). When ``dst``'s
    sibling ``openvino-int8`` already holds the f32 recipe, the bf16 one reuses its IR with the bf16
    hint instead of searching again (the search runs in f32 either way).

    Returns: the ``quantization`` record. Raises: EngineError / SlateError as :func:`quantize_with_accuracy_control`.
    """
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
    st = {**ACCURACY_CONTROL_SETTINGS, **(settings or {})}
    val = [cut_slate(s, st["max_candidates"]) for s in validation[: st["validation_slates"]]]
    return quantize_with_accuracy_control(export_dir, dst, calibration, val, metric=st["metric"],
                                          thresholds=thresholds, ranking_subset=st["ranking_subset"],
                                          max_reverted=st["max_reverted"], inference_precision=inference_precision,
                                          budget_s=st["budget_s"], on_budget=st["on_budget"], say=say)


def debug_int8(export_dir, slates: Sequence[dict], reference: Sequence[np.ndarray], calibration, settings,
               run_export, tmp: Path, say=lambda m: None) -> dict:
    """``hllm debug precision --precision int8``: the same route as the ``openvino-int8`` recipe —
    :func:`quantize_with_accuracy_control` on ``slates`` (whole, with their FP32 ``reference``), metric
    regret, ``max_drop`` from ``settings.gate`` (:func:`~hllm.calibration.recipes.ranking_validation.max_drop_for`), no limit on the groups reverted.

    Args:
        slates / reference: the debugged slates and the FP32 export's scores on them (one ``[n_i, K]`` each).
        calibration: feed dicts. settings: :class:`hllm.calibration.precision_search.precision_debug.DebugSettings`.
        run_export: export dir → its score matrices on ``slates`` (the final INT8 graph is run once).
        tmp: a scratch directory (the INT8 export is written inside it).
    Returns: ``{baseline, islands, islands_figures, passed, accuracy_control, criteria}`` — ``islands``: the
        ONNX node names NNCF reverted to float (``keep_float`` of :func:`~hllm.calibration.recipes.openvino_int8.quantize_openvino` accepts them);
        ``baseline``: the fully quantized graph's aggregate; ``islands_figures``: the final graph's
        :func:`hllm.calibration.precision_search.precision_debug.ranking_figures`, ``passed`` by ``settings.passes``.
    Raises: EngineError / SlateError as :func:`quantize_with_accuracy_control`.
    """
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
