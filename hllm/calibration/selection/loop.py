"""The one loop of ``hllm calibrate``: build → check → time → choose → write, over a sequence of recipes
(:class:`hllm.calibration.recipes.recipe.Recipe`). ``--backend B`` runs it over B's recipe or its ladder, in
order; ``--backend auto`` over the recipe table, fastest first (:mod:`hllm.calibration.selection.select`).

The FP32 reference comes first (:func:`hllm.calibration.selection.pipeline.fp32_reference`). Each recipe the CPU
and the export allow is built into a staging directory beside ``out_dir`` (:meth:`Recipe.refusal`: a refused one
is recorded with the reason). Check: an fp32 recipe by tensor parity on the first :data:`FP32_PARITY_SLATES`
slates (:func:`fp32_parity`; the engine that computed the reference is not rerun), a reduced-precision one by
the gate (:mod:`hllm.verify.gate`) with fail-fast (:mod:`hllm.verify.sequential`). Time and choose:

* *in order*: each recipe is built and checked until one passes (a build or check error ends the list); the
  last one checked is chosen and, with ``rounds``, timed against the FP32 export;
* *fastest first*: the first recipe (the baseline, the export itself) is checked at once, so a run always has
  a recipe to write; every built recipe is timed interleaved
  (:func:`hllm.calibration.selection.speed.compare_speed`) and checked from the fastest down, the first that
  passes chosen and the slower ones recorded as ``skipped``; NNCF's accuracy control
  (:data:`~hllm.calibration.recipes.table.ACCURACY_CONTROL`) runs last with what is left of ``time_budget_s``
  after :data:`ACCURACY_CONTROL_RESERVE_S`, refused below :data:`ACCURACY_CONTROL_MIN_S`.

The caller's report is written into the chosen directory, which goes to ``out_dir`` if it passed, else to
``out_dir.FAILED``.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

from hllm.calibration.recipes.recipe import Recipe, RecipeInputs
from hllm.calibration.recipes.table import ACCURACY_CONTROL, NO_VALIDATION
from hllm.calibration.selection.pipeline import Progress, Say, no_bar, quiet, fp32_reference, gate_line
from hllm.calibration.selection.speed import compare_speed
from hllm.errors import EngineError
from hllm.extras import optional
from hllm.files import promote_dir
from hllm.staging import staging_prefix, sweep_stale_staging
from hllm.formats.export import read_export
from hllm.formats.precision import Precision
from hllm.verify.parity import ParityReport, Thresholds, compare_slate
from hllm.verify.reference import cpu_ranker, ranker_scores
from hllm.verify.sequential import run_gate

#: fp32 recipes: slates of the tensor-parity check, and its max |ΔM| against the FP32 reference. fp32
#: engines differ only in the order of summation: ONNX Runtime vs PyTorch eager on the real export differ
#: by < 5e-5 on scores of magnitude ~10, so 1e-3 leaves room for other kernels and catches a wrong graph.
FP32_PARITY_SLATES = 8
FP32_PARITY_ATOL = 1e-3
#: Default wall-clock budget of a table run, seconds: 20 min, what a 200-slate selection takes on 2 cores
#: (the FP32 reference computed in the run; docs/calibration.md, "Measured").
TIME_BUDGET_S = 1200.0
#: NNCF accuracy control: the least search time worth starting (its two statistics passes over 32
#: calibration inputs took 3–7 min on 2 cores before any group was ranked), and the time kept after it
#: for timing and gating its result.
ACCURACY_CONTROL_MIN_S = 600.0
ACCURACY_CONTROL_RESERVE_S = 120.0
#: The keys of a gate report kept in each recipe's record (``selection_report.json``).
GATE_RECORD_KEYS = ("gate", "slates", "passed", "failures", "criteria", "quality", "fidelity", "strict_passed",
                    "top1_agreement", "perm_match_rate", "kendall_tau_mean", "recall@10_delta", "auc_delta",
                    "ndcg@10_delta", "nonfinite", "max_abs_diff", "stopped_after", "stop_reason", "sequential")


@dataclass
class LoopRequest:
    """One run of the loop. ``export_dir``: the FP32 export (``artefact``: it resolved, or None);
    ``out_dir``: where the chosen recipe goes; ``thresholds``: the gate; ``eval_slates``: held-out slates of
    the gate (labels optional, ≥ 200 recommended); ``calibration``: a
    :class:`hllm.formats.calibration_set.CalibrationSet` or None; ``only``: recipe names to build (empty =
    all; the first recipe always); ``rounds`` / ``warmup``: interleaved timing rounds (0 rounds: no timing in
    order); ``threads``: engine threads; ``reference_cache``: the FP32 scores cache (.npz) or None;
    ``overwrite``: replace an existing ``out_dir``; ``bf16_islands``: the islands file of ``hllm debug
    precision --precision bf16`` (None = the default islands); ``validation_slates``: NNCF accuracy control's,
    disjoint from ``eval_slates``; ``time_budget_s``: the seconds the run plans for (accuracy control gets what
    is left; None = its own budget); ``spent_before_s``: seconds the caller spent before (calibration data);
    ``fastest_first``: in order or fastest first (module doc); ``sequential``: the gate may also pass early once
    every bound clears its margin (:func:`hllm.verify.sequential.sequential_gate`)."""

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
    bf16_islands: Path | None = None
    validation_slates: list[dict] = field(default_factory=list)
    time_budget_s: float | None = TIME_BUDGET_S
    spent_before_s: float = 0.0
    fastest_first: bool = True
    sequential: bool = True
    artefact: object = None


@dataclass
class LoopOutcome:
    """What :func:`run_loop` decided: ``chosen`` (a recipe name) and whether it ``passed``; ``records`` (one
    dict per recipe, in order: refused / error / skipped / check figures / build, check and engine times);
    ``gates`` (the full gate report dict of each gated recipe); ``timing`` (compare_speed's records);
    ``reference`` (how the FP32 reference was computed); ``dest`` (the directory written); ``recipes`` (the
    recipes by name, as the loop got them)."""

    chosen: str
    passed: bool
    records: dict[str, dict]
    gates: dict[str, dict]
    timing: dict
    reference: dict
    dest: Path
    recipes: dict[str, Recipe] = field(default_factory=dict)


class LoopRun:
    """The state of one :func:`run_loop`: the recipes and records by name, built paths, gate reports, the
    errors raised by builds and checks, the reference and the clock. ``cache`` is ONNX Runtime's
    calibration-range file of the run (an ``ort-static`` build writes it; a ladder reads it)."""

    def __init__(self, req: LoopRequest | None, ref, ref_info: dict, say: Say, progress: Progress, work: Path,
                 t_start: float):
        self.req, self.ref, self.ref_info, self.say, self.progress = req, ref, ref_info, say, progress
        self.work, self.t_start, self.cache = work, t_start, work / "calibration-ranges.json"
        self.recipes: dict[str, Recipe] = {}
        self.records: dict[str, dict] = {}
        self.built: dict[str, Path] = {}
        self.gates: dict[str, dict] = {}
        self.errors: dict[str, Exception] = {}
        self.baseline: str | None = None
        self.here: tuple = ("", (), False)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t_start + (self.req.spent_before_s if self.req is not None else 0.0)

    def admit(self, c: Recipe) -> bool:
        """Record ``c``; refuse it (record ``refused``) when not requested or not buildable here (``self.here``:
        the export's flavour, the CPU's features, whether OpenVINO is installed). Returns whether it may be built."""
        r = self.req
        self.recipes[c.name] = c
        self.baseline = self.baseline or c.name
        rec = self.records[c.name] = {"name": c.name, "engine": c.engine, "precision": str(c.precision)}
        why = "not requested (--recipe)" if r.only and c.name not in r.only and c.name != self.baseline else \
            c.refusal(self.here[0], self.here[1], r.calibration is not None, self.here[2]) or \
            (NO_VALIDATION if c.name in ACCURACY_CONTROL and not r.validation_slates else None)
        if why:
            rec["refused"] = why
            self.say(f"{c.name}: refused — {why}")
        return not why

    def build(self, c: Recipe, ac_settings: dict | None = None) -> bool:
        """Build ``c`` into the work directory; on failure the record gets ``error``. Returns success."""
        r, rec = self.req, self.records[c.name]
        t0 = time.perf_counter()
        self.say(f"{c.name}: building")
        try:
            inputs = RecipeInputs(r.calibration, options=c.settings.get("options"), cache_path=self.cache,
                                  bf16_islands=r.bf16_islands, validation=r.validation_slates,
                                  thresholds=r.thresholds, ac_settings=ac_settings)
            q = c.build(r.export_dir, self.work / c.name, inputs).raw.get("quantization") or {}
            self.built[c.name] = self.work / c.name
        except Exception as e:  # one recipe's failure is a record; the caller decides whether it ends the run
            self.errors[c.name], rec["error"] = e, f"{type(e).__name__}: {e}"
            self.say(f"{c.name}: failed — {rec['error']}")
            return False
        finally:
            rec["build_s"] = round(time.perf_counter() - t0, 1)
        if "summary" in q:  # an ONNX Runtime / ModelOpt quantization: what it quantized
            rec.update(quantized_nodes=q["summary"]["quantized_nodes"], kept_float_nodes=len(q["excluded_nodes"]))
            self.say(f"{c.name}: quantized {rec['quantized_nodes']} nodes, {rec['kept_float_nodes']} kept in float")
        return True

    def check(self, c: Recipe) -> bool:
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
                advance = self.progress(f"gate {c.name} on eval slates", len(r.eval_slates))
                rep = run_gate(self.ref, path, r.eval_slates, r.thresholds,
                               r.calibration.slate_ids if hasattr(r.calibration, "slate_ids") else (),
                               threads=r.threads, fail_fast=True, on_progress=advance, sequential=r.sequential)
                g = self.gates[c.name] = rep.to_dict()
                rec["check"], rec["gate"], rec["passed"] = "gate", {k: g[k] for k in GATE_RECORD_KEYS if k in g}, rep.passed
                self.say(f"{c.name}: {gate_line(g)}")
        except Exception as e:  # noqa: BLE001 — recorded; the caller decides whether it ends the run
            self.errors[c.name], rec["error"], rec["passed"] = e, f"{type(e).__name__}: {e}", False
            self.say(f"{c.name}: failed — {rec['error']}")
        rec["check_s"] = round(time.perf_counter() - t0, 1)
        return bool(rec["passed"])

    def fastest_passing(self, names: Sequence[str], timing: dict, winner: str) -> str:
        """Check ``names`` from the fastest down (by ``timing``'s medians), stopping at the first that passes
        or at one no faster than ``winner``; the rest are recorded as ``skipped``. Returns the new winner."""
        ms = {n: timing["engine_ms"][n]["median"] for n in names}
        limit = timing["engine_ms"][winner]["median"] if winner in timing["engine_ms"] else float("inf")
        found = None
        for n in sorted(names, key=ms.get):
            if found is None and ms[n] < limit and n != winner:
                if self.check(self.recipes[n]):
                    found = n
                continue
            if n != winner and "check" not in self.records[n]:
                better = found or winner
                self.records[n]["skipped"] = f"not faster than {better}, which passed (it could not be selected)"
        return found or winner

    def time(self, built: dict, baseline: str, record: Sequence[str] | None = None) -> dict:
        """Interleaved engine timing of ``built`` (``{name: export dir}``, ``baseline`` among them) on the first
        ``rounds`` gate slates; fills the records of the recipes named in ``record`` (None = all of ``built``)
        with ``engine_ms_median`` and ``speedup_vs_fp32``. A recipe that cannot run is dropped from ``built`` and its record gets ``error``.
        Returns compare_speed's record (empty with one recipe or a baseline that cannot run)."""
        r = self.req
        if len(built) < 2:
            return {}
        self.say(f"timing {', '.join(built)} interleaved ({r.rounds} rounds)")
        evals = r.eval_slates[: max(1, min(len(r.eval_slates), r.rounds))]
        try:
            sp = compare_speed(dict(built), evals, rounds=r.rounds, warmup=r.warmup, threads=r.threads, baseline=baseline)
        except Exception:  # noqa: BLE001 — find the recipes that cannot run, record them, time the rest
            bad = _unrunnable(built, evals[:1], r.threads, baseline)
            if not bad:
                raise
            for name, why in bad.items():
                built.pop(name)
                if name in self.records:
                    self.records[name]["error"] = f"timing: {why}"
                self.say(f"{name}: cannot be timed — {why}")
            return self.time(built, baseline, record) if baseline in built else {}
        for name in built:
            if name in self.records and (record is None or name in record):
                self.records[name]["engine_ms_median"] = round(sp["engine_ms"][name]["median"], 3)
                self.records[name]["speedup_vs_fp32"] = sp[f"speedup_vs_{baseline}"][name]
        return sp


def run_loop(req: LoopRequest, recipes: Iterable[Recipe] | Callable[[LoopRun], Iterable[Recipe]],
             write_report: Callable[[LoopOutcome, Path], None], say: Say = quiet,
             progress: Progress = no_bar) -> LoopOutcome:
    """Run the loop (module doc) over ``recipes`` — a sequence, or a callable that gets the run and yields
    them lazily (a ladder that reads what the build before it measured, :attr:`LoopRun.cache`).
    ``write_report(outcome, directory)`` writes the caller's report into the chosen recipe's directory before
    it is promoted. Returns the :class:`LoopOutcome`.

    Raises: EngineError when the first recipe of a fastest-first run cannot be built or checked (the FP32
        export itself); in order, the error of the first build or check that failed other than
        NothingToQuantize, or that one when nothing was built; FileExistsError if ``out_dir`` exists and
        ``overwrite`` is False; ParityError from a bad reference cache.
    """
    from hllm.measure import cpu_flags

    ref_info: dict = {}
    ref, _ = fp32_reference(req, progress, say, info=ref_info)
    out = Path(req.out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale_staging(out)  # staging directories of OUT_DIR left by killed runs (their writer is gone)
    work = Path(tempfile.mkdtemp(prefix=staging_prefix(out), suffix=".tmp", dir=out.parent))
    run = LoopRun(req, ref, ref_info, say, progress, work, time.perf_counter())
    try:
        run.here = (read_export(req.export_dir).flavour, cpu_flags(), optional("openvino") is not None)
        todo = recipes(run) if callable(recipes) else recipes
        chosen, timing = (_fastest_first if req.fastest_first else _in_order)(run, todo)
        passed = bool(run.records[chosen].get("passed"))
        dest = out if passed else out.with_name(out.name + ".FAILED")
        outcome = LoopOutcome(chosen, passed, run.records, run.gates, timing, ref_info, dest, run.recipes)
        write_report(outcome, run.built[chosen])
        promote_dir(run.built[chosen], dest, overwrite=req.overwrite or not passed)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return outcome


def _in_order(run: LoopRun, recipes: Iterable[Recipe]) -> tuple[str, dict]:
    """In order (module doc): build and check each recipe until one passes; a build or check error ends the list.
    Returns ``(the last recipe checked, timing against the FP32 export or {})``."""
    from hllm.calibration.recipes.options import NothingToQuantize

    last = stop = None
    for c in recipes:
        if not run.admit(c):
            stop = EngineError(f"{c.name}: {run.records[c.name]['refused']}")
            break
        if not run.build(c):
            stop = run.errors[c.name]
            if isinstance(stop, NothingToQuantize):
                run.say(f"{c.name} leaves nothing to quantize: stopping")
            break
        if last is not None:  # a later rung was built: the one before it failed and is not written
            shutil.rmtree(run.built.pop(last), ignore_errors=True)
        last = c.name
        if run.check(c) or c.name in run.errors:
            stop = run.errors.get(c.name)
            break
    if stop is not None and (last is None or not isinstance(stop, NothingToQuantize)):
        raise stop
    c = run.recipes[last]
    timing = run.time({"fp32": run.req.export_dir, str(c.precision): run.built[last]}, "fp32") if run.req.rounds else {}
    return last, timing


def _fastest_first(run: LoopRun, recipes: Iterable[Recipe]) -> tuple[str, dict]:
    """Fastest first (module doc). Returns ``(the chosen recipe, timing)``."""
    deferred = []
    for c in recipes:  # refuse, defer (accuracy control) or build
        if run.admit(c):
            if c.name in ACCURACY_CONTROL:
                deferred.append(c)
            else:
                run.build(c)
    base = run.baseline
    if base not in run.built or not run.check(run.recipes[base]):
        rec = run.records[base]
        why = rec.get("error") or f"parity with the FP32 reference failed: {rec.get('parity', {}).get('failures')}"
        raise EngineError(f"the FP32 export itself could not be checked: {why}")
    built = dict(run.built)
    timing = run.time(built, base)
    winner = run.fastest_passing(list(built), timing, base) if timing else base
    if deferred:
        winner, timing = _accuracy_control(run, deferred, winner, timing)
    return winner, timing


def _accuracy_control(run: LoopRun, deferred: list, winner: str, timing: dict) -> tuple[str, dict]:
    """Build the deferred searching recipes (NNCF accuracy control, the INT8 search) with the time left (or refuse
    them), time them beside the baseline and ``winner``, and check those faster than ``winner``. Returns ``(winner, timing)``; the timing
    of this step is stored under ``timing["accuracy_control"]``."""
    req = run.req
    settings = None
    if req.time_budget_s is not None:
        left = req.time_budget_s - run.elapsed() - ACCURACY_CONTROL_RESERVE_S
        if left < ACCURACY_CONTROL_MIN_S:
            why = (f"time budget: {max(left, 0):.0f} s of the {req.time_budget_s:.0f} s budget left for the searching "
                   f"recipes (NNCF accuracy control, the INT8 search), which need ≥ {ACCURACY_CONTROL_MIN_S:.0f} s here "
                   "(raise --time-budget)")
            for c in deferred:
                run.records[c.name]["refused"] = why
                run.say(f"{c.name}: refused — {why}")
            return winner, timing
        settings = {"budget_s": left}
    ok = [c.name for c in deferred if run.build(c, settings)]
    if not ok:
        return winner, timing
    sub = {n: run.built[n] for n in dict.fromkeys([run.baseline, winner, *ok])}
    sp = run.time(sub, run.baseline, ok)  # drops from ``sub`` what cannot be timed
    names = [n for n in dict.fromkeys([*ok, winner]) if n in sub]
    new = run.fastest_passing(names, sp, winner) if sp and winner in sub else winner
    return new, {**timing, "accuracy_control": sp}


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


def _unrunnable(built: dict, probe: Sequence[dict], threads: int | None, baseline: str) -> dict[str, str]:
    """``{name: error}`` of the recipes in ``built`` that fail to load or to score the ``probe`` slates.
    Raises: EngineError when the baseline itself is one of them (it passed its check before)."""
    bad = {}
    for name, path in built.items():
        try:
            r = cpu_ranker(path, threads)
            with r:
                ranker_scores(r, list(probe))
        except Exception as e:  # noqa: BLE001 — reported per recipe
            bad[name] = f"{type(e).__name__}: {e}"
    if baseline in bad:
        raise EngineError(f"the FP32 export cannot be timed: {bad[baseline]}")
    return bad

