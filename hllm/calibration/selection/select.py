"""The two recipe lists of ``hllm calibrate``, both run by the one loop (:func:`hllm.calibration.selection.loop.run_loop`):

* :func:`calibrate` — ``--backend B``: the one recipe of B's options
  (:func:`hllm.calibration.recipes.recipe.recipe_for_options`), checked by the gate in order; with ``auto`` the
  ladder of :func:`hllm.calibration.recipes.parts.sensitivity_ladder` adds one part kept in float per recipe
  until the gate passes (at most ``max_tries`` recipes). The chosen one goes to ``out_dir`` if it passed, else to
  ``out_dir.FAILED``, with ``calibration_report.json`` (:class:`hllm.formats.calibration_report.CalibrationResult`)
  and (when drawn here) the calibration set inside it.
* :func:`select` — ``--backend auto``: every engine × precision of the recipe table
  (:mod:`hllm.calibration.recipes.table`) this CPU can run, timed and checked from the fastest down; the fastest
  that passes goes to ``out_dir`` — an export directory whose sidecar names its engine, so ``hllm rank``,
  ``serve``, ``eval`` and ``parity`` open it as it is (the FP32 graph itself when nothing faster passes) — with
  ``selection_report.json`` (:class:`SelectionResult`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

from hllm.calibration.recipes.options import QuantOptions
from hllm.calibration.recipes.recipe import Recipe, recipe_for_options
from hllm.calibration.recipes.table import ACCURACY_CONTROL, RECIPES, check_start, check_validation
from hllm.calibration.selection.loop import FP32_PARITY_ATOL, FP32_PARITY_SLATES, LoopOutcome, LoopRequest, LoopRun, run_loop
from hllm.calibration.selection.pipeline import Progress, Say, no_bar, quiet
from hllm.extras import optional
from hllm.files import atomic_write_json
from hllm.formats.calibration_report import REPORT_NAME, CalibrationResult
from hllm.formats.export import read_export
from hllm.formats.report import envelope
from hllm.measure import describe_machine
from hllm.runtime.slates import slate_ids

#: The report written beside the selected export.
SELECTION_NAME = "selection_report.json"


@dataclass
class SelectionResult:
    """What a selection run decided: ``selected`` (a recipe name), ``recipes`` (one record per recipe:
    refused / skipped / gate or parity figures / engine ms per slate / speed-up over ``onnxruntime-fp32``),
    the machine it ran on and the gate's slates. ``to_dict`` is ``selection_report.json``; :meth:`from_dict`
    also reads a report saved with the former key ``candidates``."""

    selected: str
    recipes: list[dict]
    machine: dict
    eval_slates: dict
    thresholds: dict
    timing: dict = field(default_factory=dict)
    reference: dict = field(default_factory=dict)
    wall_s: float | None = None

    def to_dict(self) -> dict:
        return {"selected": self.selected, "recipes": self.recipes, "thresholds": self.thresholds,
                "eval_slates": self.eval_slates, "reference": self.reference, "timing": self.timing,
                "wall_s": self.wall_s, "machine": self.machine}

    @classmethod
    def from_dict(cls, d: dict) -> "SelectionResult":
        """A selection report read back (``recipes``, or ``candidates`` in reports saved before the rename).
        Raises: KeyError naming a missing key."""
        return cls(d["selected"], list(d["recipes"] if "recipes" in d else d["candidates"]), d.get("machine") or {},
                   d.get("eval_slates") or {}, d.get("thresholds") or {}, d.get("timing") or {},
                   d.get("reference") or {}, d.get("wall_s"))

    def to_report(self) -> dict:
        """:meth:`to_dict` in the report envelope (kind ``calibration_selection``): the file and ``--report``."""
        return envelope("calibration_selection", self.to_dict(), machine=self.machine)


def select(req: LoopRequest, say: Say = quiet, progress: Progress = no_bar) -> tuple[SelectionResult, Path]:
    """``--backend auto``: :func:`run_loop` fastest first over the recipe table (module doc). Returns
    ``(result, out_dir)``; ``progress(description, total)`` → ``advance(n)`` shows the reference pass and each
    recipe's gate.

    Raises: EngineError from :func:`~hllm.calibration.recipes.table.check_start` (unknown recipe, not an
        ONNX Runtime fp32 export) or when the FP32 export itself cannot be checked; SlateError from
        :func:`~hllm.calibration.recipes.table.check_validation`; FileExistsError if ``out_dir`` exists and
        ``overwrite`` is False; the builders' errors are recorded per recipe, not raised.
    """
    from hllm.measure import cpu_flags

    t_start, load_start = time.perf_counter(), _load_1m()
    meta = read_export(req.export_dir)
    check_start(meta, req.only)
    flavour, features, have_ov = meta.flavour, cpu_flags(), optional("openvino") is not None
    if any(c.name in ACCURACY_CONTROL and not (req.only and c.name not in req.only)
           and c.refusal(flavour, features, req.calibration is not None, have_ov) is None for c in RECIPES):
        check_validation(req.validation_slates, req.eval_slates)  # only when NNCF would validate on them
    req, result = replace(req, fastest_first=True), None

    def write(o: LoopOutcome, directory: Path) -> None:
        nonlocal result
        say(f"selected {o.chosen}")
        result = SelectionResult(o.chosen, list(o.records.values()), {**describe_machine(), "load_avg_1m_start": load_start},
                                 _slates_record(req.eval_slates),
                                 {**req.thresholds.to_dict(), "fp32_parity": {"slates": FP32_PARITY_SLATES,
                                                                              "atol": FP32_PARITY_ATOL},
                                  "time_budget_s": req.time_budget_s},
                                 o.timing, o.reference, round(time.perf_counter() - t_start, 1))
        atomic_write_json(directory / SELECTION_NAME, result.to_report())

    o = run_loop(req, RECIPES, write, say, progress)
    return result, o.dest


@dataclass
class CalibrateRequest:
    """One ``hllm calibrate --backend B`` run: ``loop`` (the loop's request: export, out_dir, gate, slates,
    calibration set, ``rounds`` of the speed run, threads, reference cache, overwrite), ``options``
    (:class:`hllm.calibration.recipes.options.QuantOptions`), ``eval_source`` (the gate slates' file),
    ``calibration_saved`` (the set came from a file: not copied into out_dir), ``auto`` / ``max_tries``
    (the ladder of parts kept in float)."""

    loop: LoopRequest
    options: QuantOptions
    eval_source: str = ""
    calibration_saved: bool = False
    auto: bool = False
    max_tries: int = 6


def calibrate(req: CalibrateRequest, say: Say = quiet, progress: Progress = no_bar) -> tuple[CalibrationResult, Path]:
    """``--backend B``: :func:`run_loop` in order over B's recipe, then (``auto``) its ladder (module doc).
    Returns ``(result, directory written)``; ``result.passed`` says whether it is ``out_dir`` or ``out_dir.FAILED``.

    Raises: SlateError / EngineError / ExportError from the steps; NothingToQuantize when the options leave
        nothing to quantize (in ``auto``: when the first recipe does).
    """
    lr, auto, result = replace(req.loop, fastest_first=False, sequential=False), {"ladder": [], "tries": []}, None

    def write(o: LoopOutcome, directory: Path) -> None:
        nonlocal result
        result = _calibration_result(req, o, auto)
        if lr.calibration is not None and not req.calibration_saved:
            lr.calibration.save(directory / "calibration")
        atomic_write_json(directory / REPORT_NAME, result.to_report())

    o = run_loop(lr, lambda run: recipe_ladder(req, run, auto), write, say, progress)
    return result, o.dest


def _recipe(options: QuantOptions, parts: tuple[str, ...]) -> Recipe:
    """B's recipe with ``parts`` kept in float, named after them (a name per rung of the ladder)."""
    opts = QuantOptions(**{**options.__dict__, "exclude": tuple(parts)})
    base = recipe_for_options(opts)
    return Recipe(base.name + "".join(f"+{p}" for p in parts), base.engine, base.precision, scheme=base.scheme,
                  needs_calibration=base.needs_calibration, settings={"options": opts})


def recipe_ladder(req: CalibrateRequest, run: LoopRun, auto: dict):
    """The recipes of a ``--backend B`` run, yielded one at a time: the options' own, then (``auto``; the
    ladder is computed once the first recipe failed, from the calibration ranges its build wrote to
    ``run.cache``, and stored in ``auto["ladder"]``) one more part of
    :func:`hllm.calibration.recipes.parts.sensitivity_ladder` kept in float each, ``max_tries`` recipes at most.
    A recipe is named after its parts (``ort-static+head+block:1``) and carries its QuantOptions in
    ``settings["options"]``."""
    start = tuple(req.options.exclude)
    yield _recipe(req.options, start)
    if not req.auto or req.max_tries < 2:
        return
    import onnx

    from hllm.calibration.recipes.ort_quantize import calibration_ranges
    from hllm.calibration.recipes.parts import sensitivity_ladder
    from hllm.runtime.artefact import resolve

    model = onnx.load(str(resolve(req.loop.export_dir).path), load_external_data=False)
    auto["ladder"] = sensitivity_ladder(model, calibration_ranges(run.cache) if run.cache.is_file() else None)
    del model
    parts = start
    for p in [p for p in auto["ladder"] if p not in start][: req.max_tries - 1]:
        parts += (p,)
        yield _recipe(req.options, parts)


def _calibration_result(req: CalibrateRequest, o: LoopOutcome, auto: dict) -> CalibrationResult:
    """The :class:`CalibrationResult` of a ``--backend B`` run from the loop's outcome."""
    lr, keys = req.loop, ("passed", "top1_agreement", "kendall_tau_mean", "recall@10_delta", "failures")
    tries = [{"excluded": list(o.recipes[n].settings["options"].exclude), **(
        {**{k: o.gates[n][k] for k in keys}, "quantized_nodes": r.get("quantized_nodes"),
         "kept_float_nodes": r.get("kept_float_nodes")} if n in o.gates else
        {"passed": False, "error": r["error"], "stop": True})} for n, r in o.records.items() if n in o.gates or "error" in r]
    chosen = o.records[o.chosen]
    gate = {**o.gates[o.chosen], "quantized_nodes": chosen.get("quantized_nodes"),
            "kept_float_nodes": chosen.get("kept_float_nodes")}
    opts = o.recipes[o.chosen].settings["options"]
    ids, calib = slate_ids(lr.eval_slates), lr.calibration
    auto["tries"] = tries
    speed = o.timing or None
    return CalibrationResult(
        precision=opts.precision, backend=opts.backend, target=opts.target, passed=o.passed,
        top1_agreement=gate["top1_agreement"], kendall_tau_mean=gate["kendall_tau_mean"],
        recall10_delta=gate["recall@10_delta"], excluded_parts=list(opts.exclude), gate=gate,
        eval_slates={"file": req.eval_source, "count": len(ids), "first_id": ids[0], "last_id": ids[-1]},
        calibration=None if calib is None else {k: calib.meta.get(k) for k in
                                                ("source", "source_sha256", "seed", "count", "batch_size", "data_sha256")},
        options=opts.to_dict(), reference=str(lr.export_dir), reference_seconds=o.reference.get("seconds", 0.0),
        auto=auto if req.auto else None, speed=speed,
        speedup_vs_fp32=speed["speedup_vs_fp32"][str(opts.precision)] if speed else None,
        machine=describe_machine(shared=True, note="CPU cores shared with other processes during the run") if speed else None)


def _load_1m() -> float | None:
    """The 1-minute load average (other work on the cores while the run's times were measured), or None."""
    import os

    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _slates_record(slates: Sequence[dict]) -> dict:
    ids = [str(s.get("slate_id", i)) for i, s in enumerate(slates)]
    labelled = sum(1 for s in slates if s.get("labels") and any(s["labels"]))
    return {"count": len(slates), "labelled": labelled, "first_id": ids[0] if ids else None,
            "last_id": ids[-1] if ids else None}
