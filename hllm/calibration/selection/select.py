"""``hllm calibrate --backend auto``: build every engine × precision this CPU can run from one FP32 export
(:mod:`hllm.calibration.recipes.table`), time them, and gate them from the fastest down until one passes.

The run, in order:

1. **FP32 reference** scores on the evaluation slates, from the fastest fp32 engine of the export
   (:func:`hllm.calibration.selection.pipeline.fastest_fp32`) or the ``--reference-scores`` cache.
2. **Build** every recipe the CPU and the export allow (a refused one is listed with the reason); the
   accuracy-control recipes wait for step 5.
3. **Baseline check**: ``onnxruntime-fp32`` (the export itself) by tensor parity, so a run always has a
   recipe to write.
4. **Time, then gate fastest first.** Every built recipe is timed interleaved
   (:func:`hllm.calibration.selection.speed.compare_speed`, median engine ms per slate, batch 1); they are checked
   in that order and the first that passes is selected: a slower one could not be selected, so it is
   recorded as ``skipped`` with the recipe that passed before it. An fp32 recipe computes the same
   function in another order of summation, so it is checked by tensor parity on the first
   :data:`FP32_PARITY_SLATES` slates (:func:`fp32_parity`: max|ΔM| ≤ :data:`FP32_PARITY_ATOL`, all finite);
   a reduced-precision one by the gate (:mod:`hllm.verify.gate`: quality non-inferiority + fidelity floor
   by default, ``strict`` on request) on all the slates, scored in chunks and stopped as soon as it can no
   longer pass (:func:`hllm.verify.sequential.hopeless`).
5. **NNCF accuracy control** (:data:`~hllm.calibration.recipes.table.ACCURACY_CONTROL`) runs last, with
   what is left of ``time_budget_s`` after :data:`ACCURACY_CONTROL_RESERVE_S` for its own timing and gate;
   below :data:`ACCURACY_CONTROL_MIN_S` it is refused with the figures (its statistics collection alone
   takes minutes on 2 cores). It validates on ``validation_slates``, never gate slates.

The winner is promoted to ``out_dir`` — an export directory whose sidecar names its engine, so ``hllm
rank``, ``serve``, ``eval`` and ``parity`` open it as it is (the FP32 graph itself when nothing faster passes).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from hllm.calibration.recipes.recipe import RecipeInputs
from hllm.calibration.recipes.table import (ACCURACY_CONTROL, BASELINE, NO_VALIDATION, RECIPES, check_start,
                                            check_validation)
from hllm.calibration.selection.pipeline import CalibrateRequest, fp32_reference, gate_line
from hllm.calibration.selection.speed import compare_speed
from hllm.errors import EngineError
from hllm.extras import optional
from hllm.files import staging_prefix, atomic_write_json, promote_dir, sweep_stale_staging
from hllm.formats.export import read_export
from hllm.formats.precision import Precision
from hllm.formats.report import envelope
from hllm.verify.parity import ParityReport, Thresholds, compare_slate
from hllm.verify.reference import cpu_ranker, ranker_scores
from hllm.verify.sequential import run_gate

Say = Callable[[str], None]

#: The report written beside the selected export.
SELECTION_NAME = "selection_report.json"
#: fp32 recipes: slates of the tensor-parity check, and its max |ΔM| against the FP32 reference. fp32
#: engines differ only in the order of summation: ONNX Runtime vs PyTorch eager on the real export differ
#: by < 5e-5 on scores of magnitude ~10, so 1e-3 leaves room for other kernels and catches a wrong graph.
FP32_PARITY_SLATES = 8
FP32_PARITY_ATOL = 1e-3
#: Default wall-clock budget of a run, seconds: 20 min, what a 200-slate selection takes on 2 cores (the
#: FP32 reference computed in the run; docs/calibration.md, "Measured").
TIME_BUDGET_S = 1200.0
#: NNCF accuracy control: the least search time worth starting (its two statistics passes over 32
#: calibration inputs took 3–7 min on 2 cores before any group was ranked), and the time kept after it
#: for timing and gating its result.
ACCURACY_CONTROL_MIN_S = 600.0
ACCURACY_CONTROL_RESERVE_S = 120.0


@dataclass
class SelectRequest:
    """One selection run. ``export_dir``: the FP32 export; ``out_dir``: where the winner goes;
    ``eval_slates``: labelled held-out slates of the gate (≥ 200 recommended); ``calibration``: a
    :class:`hllm.formats.calibration_set.CalibrationSet` or None; ``only``: recipe names to consider
    (empty = all); ``rounds`` / ``warmup``: interleaved timing rounds; ``threads``: engine threads;
    ``time_budget_s``: the wall-clock seconds the run plans for; the accuracy-control search gets what is left
    of it (None = no limit: it gets :data:`~hllm.calibration.recipes.accuracy_control.CANDIDATE_SETTINGS`' budget);
    ``spent_before_s``: seconds the caller spent on this run before :func:`select` (calibration data), counted
    against the budget."""

    export_dir: Path
    out_dir: Path
    thresholds: object
    eval_slates: list[dict]
    calibration: object = None
    only: tuple[str, ...] = ()
    rounds: int = 5
    warmup: int = 1
    threads: int | None = None
    reference_cache: Path | None = None
    overwrite: bool = False
    bf16_islands: Path | None = None  # islands file of `hllm debug precision --precision bf16` (None = base islands)
    validation_slates: list[dict] = field(default_factory=list)  # NNCF accuracy control's: disjoint from eval_slates
    time_budget_s: float | None = TIME_BUDGET_S
    spent_before_s: float = 0.0


@dataclass
class SelectionResult:
    """What a selection run decided: ``selected`` (a recipe name), ``candidates`` (the report key kept for readers: one record per
    recipe: refused / skipped / gate or parity figures / engine ms per slate / speed-up over
    ``onnxruntime-fp32``), the machine it ran on and the gate's slates. ``to_dict`` is ``selection_report.json``."""

    selected: str
    candidates: list[dict]
    machine: dict
    eval_slates: dict
    thresholds: dict
    timing: dict = field(default_factory=dict)
    reference: dict = field(default_factory=dict)
    wall_s: float | None = None

    def to_dict(self) -> dict:
        return {"selected": self.selected, "candidates": self.candidates, "thresholds": self.thresholds,
                "eval_slates": self.eval_slates, "reference": self.reference, "timing": self.timing,
                "wall_s": self.wall_s, "machine": self.machine}

    def to_report(self) -> dict:
        """:meth:`to_dict` in the report envelope (kind ``calibration_selection``): the file and ``--report``."""
        return envelope("calibration_selection", self.to_dict(), machine=self.machine)


class SelectionRun:
    """The state of one :func:`select` run: records by name, built paths, the reference, the clock."""

    def __init__(self, req: SelectRequest, ref, ref_info: dict, say: Say, progress, work: Path, t_start: float):
        self.req, self.ref, self.ref_info, self.say, self.progress = req, ref, ref_info, say, progress
        self.work, self.t_start = work, t_start
        self.records: dict[str, dict] = {}
        self.built: dict[str, Path] = {}

    def elapsed(self) -> float:
        return time.perf_counter() - self.t_start + (self.req.spent_before_s if self.req is not None else 0.0)

    def build(self, c, ac_settings: dict | None = None) -> bool:
        """Build ``c`` into the work directory; on failure the record gets ``error``. Returns success."""
        r, rec = self.req, self.records[c.name]
        t0 = time.perf_counter()
        try:
            inputs = RecipeInputs(r.calibration, bf16_islands=r.bf16_islands, validation=r.validation_slates,
                                  thresholds=r.thresholds, ac_settings=ac_settings)
            self.built[c.name] = c.build(r.export_dir, self.work / c.name, inputs).root
        except Exception as e:  # one recipe's failure is a record, never the end of the run
            rec["error"] = f"{type(e).__name__}: {e}"
            self.say(f"{c.name}: failed — {rec['error']}")
            return False
        finally:
            rec["build_s"] = round(time.perf_counter() - t0, 1)
        return True

    def check(self, c) -> bool:
        """Parity (fp32) or the fail-fast gate (reduced precision) of the built ``c``; fills its record."""
        r, rec, path = self.req, self.records[c.name], self.built[c.name]
        t0 = time.perf_counter()
        try:
            if c.precision is Precision.FP32 and c.name == self.ref_info.get("engine"):
                rec["check"], rec["passed"] = "reference", True  # it computed the reference: nothing to compare it with
                self.say(f"{c.name}: computed the FP32 reference")
            elif c.precision is Precision.FP32:
                par = fp32_parity(self.ref, path, r.eval_slates, r.threads)
                rec["check"], rec["parity"], rec["passed"] = "parity", par.to_dict(per_slate=False), par.passed
                self.say(f"{c.name}: parity on {par.summary().slates} slates, max|ΔM| "
                         f"{par.summary().max_abs_diff:.2g} (≤ {FP32_PARITY_ATOL:g}) → {'pass' if par.passed else 'FAIL'}")
            else:
                advance = self.progress(f"gate {c.name}", len(r.eval_slates))
                rep = gate_fail_fast(self.ref, path, r.eval_slates, r.thresholds, r.threads, on_progress=advance)[0]
                g = rep.to_dict()
                rec["check"], rec["gate"], rec["passed"] = "gate", _gate_record(g), bool(rep.passed)
                self.say(f"{c.name}: {gate_line(g)}")
        except Exception as e:  # noqa: BLE001 — recorded, the run goes on
            rec["error"], rec["passed"] = f"{type(e).__name__}: {e}", False
            self.say(f"{c.name}: failed — {rec['error']}")
        rec["check_s"] = round(time.perf_counter() - t0, 1)
        return bool(rec["passed"])

    def fastest_passing(self, names: Sequence[str], timing: dict, winner: str) -> str:
        """Check ``names`` from the fastest down (by ``timing``'s medians), stopping at the first that passes
        or at one no faster than ``winner``; the rest are recorded as ``skipped``. Returns the new winner."""
        ms = {n: timing["engine_ms"][n]["median"] for n in names}
        limit = timing["engine_ms"][winner]["median"] if winner in timing["engine_ms"] else float("inf")
        by_name = {c.name: c for c in RECIPES}
        found = None
        for n in sorted(names, key=ms.get):
            if found is None and ms[n] < limit and n != winner:
                if self.check(by_name[n]):
                    found = n
                continue
            if n != winner and "check" not in self.records[n]:
                better = found or winner
                self.records[n]["skipped"] = f"not faster than {better}, which passed (it could not be selected)"
        return found or winner


def select(req: SelectRequest, say: Say = lambda m: None, progress=None) -> tuple[SelectionResult, Path]:
    """Run the selection (module doc); returns ``(result, out_dir)``. ``progress(description, total)`` →
    ``advance(n)`` shows the reference pass and each recipe's gate (:data:`hllm.calibration.selection.pipeline.Progress`).

    Raises: EngineError from :func:`~hllm.calibration.recipes.table.check_start` (unknown recipe, not an
        ONNX Runtime fp32 export) or when the FP32 export itself cannot be checked; SlateError from
        :func:`~hllm.calibration.recipes.table.check_validation`; FileExistsError if ``out_dir`` exists and
        ``overwrite`` is False; the quantizers' errors are recorded per recipe, not raised.
    """
    from hllm.measure import cpu_flags, describe_machine

    t_start, load_start = time.perf_counter(), _load_1m()
    progress = progress or (lambda d, n: (lambda k: None))
    meta = read_export(req.export_dir)
    check_start(meta, req.only)
    flavour, features = meta.flavour, cpu_flags()
    have_ov = optional("openvino") is not None
    if any(c.name in ACCURACY_CONTROL and not (req.only and c.name not in req.only)
           and c.refusal(flavour, features, req.calibration is not None, have_ov) is None for c in RECIPES):
        check_validation(req.validation_slates, req.eval_slates)  # only when NNCF would validate on them
    ref_info: dict = {}
    ref, _ = fp32_reference(CalibrateRequest(req.export_dir, req.out_dir, None, req.thresholds, req.eval_slates, "",
                                             threads=req.threads, reference_cache=req.reference_cache),
                            progress, say, info=ref_info)
    out = Path(req.out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale_staging(out)  # staging directories of OUT_DIR left by killed runs (their writer is gone)
    work = Path(tempfile.mkdtemp(prefix=staging_prefix(out), suffix=".tmp", dir=out.parent))
    run = SelectionRun(req, ref, ref_info, say, progress, work, t_start)
    try:
        deferred = []
        for c in RECIPES:  # the one loop over recipes: refuse, defer (accuracy control) or build
            rec = run.records[c.name] = {"name": c.name, "engine": c.engine, "precision": str(c.precision)}
            why = "not requested (--candidate)" if req.only and c.name not in req.only and c.name != BASELINE else \
                c.refusal(flavour, features, req.calibration is not None, have_ov) or \
                (NO_VALIDATION if c.name in ACCURACY_CONTROL and not req.validation_slates else None)
            if why:
                rec["refused"] = why
                say(f"{c.name}: refused — {why}")
            elif c.name in ACCURACY_CONTROL:
                deferred.append(c)
            else:
                run.build(c)
        if BASELINE not in run.built or not run.check(RECIPES[0]):
            rec = run.records[BASELINE]
            why = rec.get("error") or f"parity with the FP32 reference failed: {rec.get('parity', {}).get('failures')}"
            raise EngineError(f"the FP32 export itself could not be checked: {why}")
        timing = time_recipes(req, run.built, list(run.records.values()), say)
        winner = run.fastest_passing(list(run.built), timing, BASELINE) if timing else BASELINE
        if deferred:
            winner, timing = _accuracy_control(run, deferred, winner, timing)
        say(f"selected {winner}")
        result = SelectionResult(winner, list(run.records.values()),
                                 {**describe_machine(), "load_avg_1m_start": load_start},
                                 _slates_record(req.eval_slates),
                                 {**req.thresholds.to_dict(), "fp32_parity": {"slates": FP32_PARITY_SLATES,
                                                                              "atol": FP32_PARITY_ATOL},
                                  "time_budget_s": req.time_budget_s},
                                 timing, ref_info, round(time.perf_counter() - t_start, 1))
        atomic_write_json(run.built[winner] / SELECTION_NAME, result.to_report())
        promote_dir(run.built[winner], out, overwrite=req.overwrite)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result, out


def _accuracy_control(run: SelectionRun, deferred: list, winner: str, timing: dict) -> tuple[str, dict]:
    """Step 5 of the module doc: build the NNCF accuracy-control recipes with the time left (or refuse
    them), time them beside the baseline and ``winner``, and check those faster than ``winner``.
    Returns ``(winner, timing)``; the timing of this step is stored under ``timing["accuracy_control"]``."""
    req = run.req
    settings = None
    if req.time_budget_s is not None:
        left = req.time_budget_s - run.elapsed() - ACCURACY_CONTROL_RESERVE_S
        if left < ACCURACY_CONTROL_MIN_S:
            why = (f"time budget: {max(left, 0):.0f} s of the {req.time_budget_s:.0f} s budget left for NNCF accuracy "
                   f"control, which needs ≥ {ACCURACY_CONTROL_MIN_S:.0f} s here (raise --time-budget)")
            for c in deferred:
                run.records[c.name]["refused"] = why
                run.say(f"{c.name}: refused — {why}")
            return winner, timing
        settings = {"budget_s": left}
    ok = [c.name for c in deferred if run.build(c, settings)]
    if not ok:
        return winner, timing
    sub = {n: run.built[n] for n in dict.fromkeys([BASELINE, winner, *ok])}
    sp = time_recipes(req, sub, [run.records[n] for n in ok], run.say)  # drops from ``sub`` what cannot be timed
    names = [n for n in dict.fromkeys([*ok, winner]) if n in sub]
    new = run.fastest_passing(names, sp, winner) if sp and winner in sub else winner
    return new, {**timing, "accuracy_control": sp}


def gate_fail_fast(ref: Sequence, path, slates: Sequence[dict], thresholds, threads: int | None = None,
                   chunk: int = 10, on_progress=None):
    """Gate the export at ``path`` against the reference scores ``ref`` (one ``[n_i, K]`` float32 array per
    slate) with the sequential gate (:func:`hllm.verify.sequential.sequential_gate`): ``chunk`` slates at a
    time, passing early once every bound clears its margin, stopping as soon as it can no longer pass
    (:func:`hllm.verify.sequential.hopeless`). Returns ``(GateReport over the slates scored, number scored)``;
    its ``sequential`` record says how many slates it needed and why it stopped.

    Raises: EngineError / SlateError from loading or running the engine.
    """
    rep = run_gate(ref, path, slates, thresholds, threads=threads, fail_fast=True, chunk=chunk, on_progress=on_progress,
                   sequential=True)
    return rep, len(rep.records)


def fp32_parity(ref: Sequence, path, slates: Sequence[dict], threads: int | None = None,
                count: int = FP32_PARITY_SLATES, atol: float = FP32_PARITY_ATOL):
    """Tensor parity of the fp32 recipe at ``path`` with the FP32 reference scores ``ref`` on the first
    ``count`` slates: max|ΔM| ≤ ``atol`` and no non-finite score (rankings are reported, not required:
    an fp32 engine may order an exact near-tie otherwise).

    Returns: :class:`hllm.verify.parity.ParityReport`. Raises: EngineError / SlateError from the engine.
    """
    part = list(slates[:count])
    r = cpu_ranker(path, threads)
    got = ranker_scores(r, part)
    records = [compare_slate(a, b, str(s.get("slate_id", i))) for i, (a, b, s) in enumerate(zip(ref, got, part))]
    return ParityReport(records, Thresholds(atol=atol, min_perm_match=0.0, min_top1=0.0, min_tau=-1.0),
                        reference="fp32 reference", backend=r.engine.name, precision="fp32")


#: The keys of a gate report kept in each recipe's record of ``selection_report.json``.
GATE_RECORD_KEYS = ("gate", "slates", "passed", "failures", "criteria", "quality", "fidelity", "strict_passed",
                    "top1_agreement", "perm_match_rate", "kendall_tau_mean", "recall@10_delta", "auc_delta",
                    "ndcg@10_delta", "nonfinite", "max_abs_diff", "stopped_after", "stop_reason", "sequential")


def _gate_record(g: dict) -> dict:
    return {k: g[k] for k in GATE_RECORD_KEYS if k in g}


def time_recipes(req: SelectRequest, built: dict, records: list[dict], say: Say) -> dict:
    """Interleaved engine timing of the ``built`` recipes (``{name: export dir}``, the baseline among them)
    on the first ``req.rounds`` gate slates; fills the ``records`` of those recipes with
    ``engine_ms_median`` and ``speedup_vs_fp32``. Returns compare_speed's record (empty with one recipe)."""
    if len(built) < 2:
        return {}
    say(f"timing {', '.join(built)} interleaved ({req.rounds} rounds)")
    evals = req.eval_slates[: max(1, min(len(req.eval_slates), req.rounds))]
    try:
        sp = compare_speed(dict(built), evals, rounds=req.rounds, warmup=req.warmup, threads=req.threads,
                           baseline=BASELINE)
    except Exception:  # noqa: BLE001 — find the recipes that cannot run, record them, time the rest
        bad = _unrunnable(built, evals[:1], req.threads)
        if not bad:
            raise
        for name, why in bad.items():
            built.pop(name)
            for r in records:
                if r["name"] == name:
                    r["error"] = f"timing: {why}"
            say(f"{name}: cannot be timed — {why}")
        return time_recipes(req, built, records, say) if BASELINE in built else {}
    for r in records:
        if r["name"] in built:
            r["engine_ms_median"] = round(sp["engine_ms"][r["name"]]["median"], 3)
            r["speedup_vs_fp32"] = sp[f"speedup_vs_{BASELINE}"][r["name"]]
    return sp


def _unrunnable(built: dict, probe: Sequence[dict], threads: int | None) -> dict[str, str]:
    """``{name: error}`` of the recipes in ``built`` that fail to load or to score the ``probe`` slates.
    Raises: EngineError when the baseline itself is one of them (it passed its parity check before)."""
    bad = {}
    for name, path in built.items():
        try:
            r = cpu_ranker(path, threads)
            with r:
                ranker_scores(r, list(probe))
        except Exception as e:  # noqa: BLE001 — reported per recipe
            bad[name] = f"{type(e).__name__}: {e}"
    if BASELINE in bad:
        raise EngineError(f"the FP32 export cannot be timed: {bad[BASELINE]}")
    return bad


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
