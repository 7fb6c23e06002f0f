"""The ``hllm calibrate`` pipeline: quantize an FP32 export, gate its rankings, keep it only if it passes.

Steps (each a function below, the CLI only parses options and prints):

1. :func:`prepare_calibration` — load a saved calibration set or draw one from real slates
   (:mod:`hllm.calibration.data`); refused when it overlaps the gate's evaluation slates.
2. :func:`fp32_reference` — the FP32 export's score matrices on the evaluation slates, computed once
   (optionally cached in an ``.npz`` keyed by the graph's sha256).
3. :class:`Attempts` — one quantize (:func:`hllm.calibration.recipes.quantize.quantize_export`) + gate
   (:func:`hllm.verify.sequential.run_gate`) per set of parts kept in float; with ``auto`` the
   :func:`hllm.calibration.recipes.parts.sensitivity_ladder` adds parts one at a time
   (:func:`hllm.calibration.recipes.quantize.auto_exclude`) until the gate passes.
4. Optional interleaved speed run against FP32 (:func:`hllm.calibration.selection.speed.compare_speed`).
5. The candidate directory is promoted to ``out_dir`` if it passed, else to ``out_dir.FAILED``, with
   ``calibration_report.json`` and (when drawn here) the calibration set inside it.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from hllm.calibration.data import build_calibration_set
from hllm.calibration.recipes.options import NothingToQuantize, QuantOptions
from hllm.calibration.recipes.ort_quantize import calibration_ranges
from hllm.calibration.recipes.parts import sensitivity_ladder
from hllm.calibration.recipes.quantize import auto_exclude
from hllm.calibration.recipes.recipe import RecipeInputs, recipe_for_options
from hllm.calibration.selection.speed import compare_speed
from hllm.errors import SlateError
from hllm.extras import optional
from hllm.files import staging_prefix, atomic_write_json, promote_dir
from hllm.formats.calibration_report import REPORT_NAME, CalibrationResult
from hllm.formats.calibration_set import load_calibration_set
from hllm.formats.precision import Precision
from hllm.measure import describe_machine
from hllm.reading import sha256_file
from hllm.runtime.artefact import resolve
from hllm.runtime.ranker import Ranker
from hllm.runtime.slates import read_slates, slate_ids
from hllm.verify.gate import GateThresholds, check_disjoint
from hllm.verify.reference import cpu_ranker, load_reference, reference_key, reference_scores, save_reference
from hllm.verify.scoring import score_slates
from hllm.verify.sequential import run_gate

Say = Callable[[str], None]
#: ``progress(description, total)`` → ``advance(n)``; the CLI draws a bar, library callers may ignore it.
Progress = Callable[[str, int], Callable[[int], None]]


def _quiet(_msg: str) -> None:
    pass


def _no_bar(_desc: str, _total: int) -> Callable[[int], None]:
    return lambda n: None


@dataclass
class CalibrateRequest:
    """Everything one ``hllm calibrate`` run needs (validated by the caller's types).

    Attributes:
        export_dir: FP32 export. out_dir: quantized export to write. options: QuantOptions.
        thresholds: the gate. eval_slates: held-out slates (labels optional). eval_source: their file.
        calibration: a CalibrationSet, or None (dynamic / weight-only need none).
        calibration_saved: True when it came from a file (then it is not copied into out_dir).
        auto / max_tries: automatic exclusion. bench_rounds / bench_warmup: speed run (0 = none).
        threads: ORT intra-op threads. reference_cache: FP32 scores cache (.npz) or None.
        artefact: the export already resolved by the caller (:func:`hllm.runtime.artefact.resolve`), so it
            is read once per command; None = resolved here.
        overwrite: replace an existing ``out_dir`` at the commit; False refuses one that a parallel
            run created meanwhile (FileExistsError).
    """

    export_dir: Path
    out_dir: Path
    options: object
    thresholds: GateThresholds
    eval_slates: list[dict]
    eval_source: str
    calibration: object = None
    calibration_saved: bool = False
    auto: bool = False
    max_tries: int = 6
    bench_rounds: int = 0
    bench_warmup: int = 2
    threads: int | None = None
    reference_cache: Path | None = None
    artefact: object = None
    overwrite: bool = True


def prepare_calibration(artefact, builder, backend: str, calibration: Path | None, calib_slates: Path | None,
                        count: int, seed: int, batch_size: int, eval_ids: Sequence[str], say: Say = _quiet):
    """The calibration set of a run: loaded from ``calibration``, drawn from ``calib_slates``, or None
    for the backends that need none (``ort-dynamic``, ``ort-weight-only``; data given to them is ignored
    with a message).

    Raises: SlateError (another prompt spec, a set without an input the graph declares, overlap with the
        evaluation slates, no data for a backend that needs it).
    """
    needs_data = backend not in ("ort-dynamic", "ort-weight-only")
    calib = None
    if calibration is not None:
        calib = load_calibration_set(calibration)
        if calib.meta.get("prompt") != artefact.prompt.to_dict():
            raise SlateError(f"calibration set {calibration} was encoded with another prompt spec than {artefact.path}")
        missing = [n for n in artefact.graph_inputs if n not in calib.inputs]
        if missing:
            raise SlateError(f"calibration set {calibration} lacks the graph input(s) {missing} of {artefact.path} "
                             "(draw a new one with --calib-slates)")
        check_calibration_tokenizer(calib.meta, artefact.tokenizer_path, builder.pad_id, calibration)
    elif calib_slates is not None and not needs_data:
        say(f"--backend {backend} uses no calibration data: --calib-slates ignored")
    elif calib_slates is not None:
        calib = build_calibration_set(read_slates(calib_slates), builder, count, seed, batch_size,
                                      exclude_ids=eval_ids, source=calib_slates,
                                      tokenizer_path=artefact.tokenizer_path, graph_inputs=artefact.graph_inputs)
        say(f"calibration set: {len(calib.slate_ids)} slates from {calib_slates} (seed {seed})")
    elif needs_data:
        raise SlateError(f"--backend {backend} needs calibration data: pass --calib-slates (e.g. the train split) "
                         "or --calibration")
    if calib is not None:
        check_disjoint(calib.slate_ids, [{"slate_id": i} for i in eval_ids])
    return calib


def check_calibration_tokenizer(meta: dict, tokenizer_path: Path, pad_id: int, where: object) -> None:
    """Refuse a saved calibration set encoded with another tokenizer than the one the export uses: its
    ``tokenizer_sha256`` must equal the sha256 of ``tokenizer_path`` and its ``pad_id`` the builder's
    (the arrays' own hash, ``data_sha256``, cannot tell: token ids of another tokenizer hash just as well).

    Raises: SlateError naming the set and both fingerprints.
    """
    want = sha256_file(tokenizer_path)
    got = meta.get("tokenizer_sha256")
    if got != want:
        raise SlateError(f"calibration set {where} was encoded with another tokenizer (tokenizer_sha256 {str(got)[:12]}…, "
                         f"the export's {tokenizer_path.name} is {want[:12]}…): rebuild it with --calib-slates")
    if meta.get("pad_id") not in (None, pad_id):
        raise SlateError(f"calibration set {where} pads with id {meta.get('pad_id')!r}, the export with {pad_id}")


def fp32_engines(art, threads: int | None = None) -> dict:
    """The fp32 engines that can compute the FP32 reference of the export ``art``
    (:class:`hllm.runtime.artefact.Artefact`): ONNX Runtime on its graph, and OpenVINO at inference
    precision f32 when the export is of flavour ``standard`` and OpenVINO is installed.

    Returns: ``{name: Ranker}`` (engines constructed, not activated).
    """
    out = {"onnxruntime-fp32": cpu_ranker(art, threads)}
    if art.flavour == "standard":
        if optional("openvino") is None:
            return out
        out["openvino-fp32"] = Ranker.from_path(art, engine="openvino", inference_precision="f32", threads=threads)
    return out


def fastest_fp32(art, slates: Sequence[dict], threads: int | None = None, say: Say = _quiet):
    """The fastest of :func:`fp32_engines` on this machine: each engine runs the first slate twice (a
    warm-up: compilation, allocation; then one timed call) and the lowest time wins.

    Returns: ``(name, Ranker, {name: seconds of the timed call})``; with one engine it is not timed.
    Raises: EngineError from an engine that cannot run (ONNX Runtime's is never skipped; an OpenVINO one
        that fails is left out with a message).
    """
    engines = fp32_engines(art, threads)
    if len(engines) == 1 or not slates:
        name = next(iter(engines))
        return name, engines[name], {}
    probe, times = list(slates[:1]), {}
    for name, r in list(engines.items()):
        try:
            with r:
                score_slates([r.engine], r.builder, probe)
                t0 = time.perf_counter()
                score_slates([r.engine], r.builder, probe)
                times[name] = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 — an optional engine that cannot run is not the reference
            if name == "onnxruntime-fp32":
                raise
            say(f"{name} cannot compute the FP32 reference here ({type(e).__name__}: {e}); not used")
            engines.pop(name)
    best = min(times, key=times.get)
    say("FP32 reference engine: " + ", ".join(f"{n} {t * 1e3:.0f} ms" for n, t in times.items()) + f" → {best}")
    return best, engines[best], times


def fp32_reference(req: CalibrateRequest, progress: Progress = _no_bar, say: Say = _quiet, info: dict | None = None):
    """FP32 score matrices on the evaluation slates (from ``req.reference_cache`` when it exists), computed
    by the fastest fp32 engine of the export (:func:`fastest_fp32`).

    A cache is keyed by content (:func:`hllm.verify.reference.reference_key`: the graph file's sha256, K, and
    the hash of each slate's encoded inputs) and used only when it proves it holds those; a fresh
    reference is written to it only when every score is finite.
    ``info``, when given, receives ``engine`` (the engine that computed the scores; None from a cache),
    ``probe_s`` (the engines' probe times), ``cached`` and ``seconds``.
    Returns ``(scores, seconds)``. Raises: ParityError naming the cache file for a cache of another graph,
        another K, other slates or inputs, a short or non-finite one.
    """
    import numpy as np

    t0 = time.perf_counter()
    info = {} if info is None else info
    cache = req.reference_cache
    art = req.artefact or resolve(req.export_dir)
    key = reference_key(art, req.eval_slates) if cache is not None else None
    if cache is not None and cache.is_file():
        ref = load_reference(cache, key)  # before any message: a bad file is the one error line
        say(f"FP32 reference scores from {cache}")
        info.update(engine=None, cached=True, seconds=round(time.perf_counter() - t0, 1))
        return ref, time.perf_counter() - t0
    name, ranker, probe = fastest_fp32(art, req.eval_slates, req.threads, say)
    advance = progress(f"FP32 reference ({name}) on eval slates", len(req.eval_slates))
    ref = reference_scores(ranker, req.eval_slates, on_progress=advance)
    if cache is not None:
        if all(np.isfinite(m).all() for m in ref):
            save_reference(cache, ref, key)
        else:
            say(f"the FP32 reference has non-finite scores: not cached in {cache}")
    info.update(engine=name, probe_s={k: round(v, 3) for k, v in probe.items()}, cached=False,
                seconds=round(time.perf_counter() - t0, 1))
    return ref, time.perf_counter() - t0


def gate_line(d: dict) -> str:
    """One line of a gate report dict (:meth:`hllm.verify.gate.GateReport.to_dict`): the figures of the
    three criteria groups and the verdict (with the failed criteria and, after fail-fast, the stop)."""
    q = d.get("quality") or {}
    lb = lambda m: f"{q[m]['lower_bound']:+.4f}" if m in q else "n/a"  # noqa: E731
    reg = (d.get("fidelity") or {}).get("regret_p95")
    verdict = "pass" if d["passed"] else "FAIL (" + ", ".join(f["criterion"] for f in d["failures"]) + ")"
    stop = f"; stopped after {d['stopped_after']} slates: {d['stop_reason']}" if d.get("stopped_after") is not None else ""
    return (f"{d['gate']} gate: ΔAUC lb {lb('auc')}  ΔNDCG@10 lb {lb('ndcg@10')}  ΔR@10 lb {lb('recall@10')}  "
            f"tau {d['kendall_tau_mean']:.3f}  regret p95 {'n/a' if reg is None else f'{reg:.2g}'}  "
            f"top-1 {d['top1_agreement']:.3f}  → {verdict}{stop}")


@dataclass
class Attempts:
    """Quantize + gate variants of one run into a staging directory; remembers each gate report.

    ``attempt(parts)`` → ``(passed, record)`` is the callable :func:`hllm.calibration.recipes.quantize.auto_exclude`
    drives. ``reports[parts]`` holds the gate dict of every variant that produced a graph.
    """

    req: CalibrateRequest
    ref_scores: list
    staging: Path
    cache: Path
    say: Say = _quiet
    progress: Progress = _no_bar
    reports: dict = field(default_factory=dict)

    def attempt(self, parts: tuple[str, ...]) -> tuple[bool, dict]:
        req, o = self.req, self.req.options
        opts = QuantOptions(**{**o.__dict__, "exclude": tuple(parts)})
        self.say(f"quantizing ({o.backend} {o.precision}, kept in float: {', '.join(parts) or 'nothing'})")
        try:  # the run's one recipe, built with this try's exclusions
            meta = recipe_for_options(opts).build(req.export_dir, self.staging,
                                                  RecipeInputs(req.calibration, opts, cache_path=self.cache))
        except NothingToQuantize as e:
            if not req.auto:
                raise
            self.say(f"excluding {', '.join(parts) or 'nothing'} leaves nothing to quantize: stopping")
            return False, {"error": str(e), "stop": True}
        q = meta.raw["quantization"]
        self.say(f"quantized {q['summary']['quantized_nodes']} nodes, {len(q['excluded_nodes'])} kept in float "
                 f"({q['seconds']:.0f} s)")
        advance = self.progress(f"gate ({o.precision}) on eval slates", len(req.eval_slates))
        rep = run_gate(self.ref_scores, self.staging, req.eval_slates, req.thresholds,
                       req.calibration.slate_ids if req.calibration is not None else (),
                       on_progress=advance, threads=req.threads, fail_fast=True)
        d = {**rep.to_dict(), "quantized_nodes": q["summary"]["quantized_nodes"],
             "kept_float_nodes": len(q["excluded_nodes"])}
        self.reports[tuple(parts)] = d
        self.say(gate_line(d))
        return rep.passed, {k: d[k] for k in ("top1_agreement", "kendall_tau_mean", "recall@10_delta",
                                              "quantized_nodes", "kept_float_nodes", "failures")}

    def search(self) -> tuple[bool, tuple[str, ...], dict]:
        """The requested exclusions, then (``auto``) the sensitivity ladder. Returns (passed, parts,
        auto record or {}). Raises NothingToQuantize when no try produced a graph."""
        import onnx

        req, start = self.req, tuple(self.req.options.exclude)
        ok, rec = self.attempt(start)
        tries, parts, ladder = [{"excluded": list(start), "passed": ok, **rec}], start, []
        if req.auto and not ok and req.max_tries > 1 and not rec.get("stop"):
            from hllm.runtime.artefact import resolve

            model = onnx.load(str(resolve(req.export_dir).path), load_external_data=False)
            ladder = sensitivity_ladder(model, calibration_ranges(self.cache) if self.cache.is_file() else None)
            del model
            nxt = next((p for p in ladder if p not in start), None)
            if nxt is not None:
                ok, parts, more = auto_exclude(self.attempt, ladder, start=start + (nxt,), max_tries=req.max_tries - 1)
                tries += more
        if parts not in self.reports:  # every try stopped before a graph existed
            raise NothingToQuantize(tries[-1].get("error") or "no quantized graph was produced")
        return ok, parts, ({"ladder": ladder, "tries": tries} if req.auto else {})


def calibrate(req: CalibrateRequest, say: Say = _quiet, progress: Progress = _no_bar) -> tuple[CalibrationResult, Path]:
    """Run the whole pipeline (module doc). Returns ``(result, directory written)``; ``result.passed`` says
    whether the directory is ``out_dir`` (passed) or ``out_dir.FAILED``.

    Raises: FileExistsError never (the caller checks ``--overwrite``); SlateError / EngineError /
        ExportError / NothingToQuantize from the steps.
    """
    import tempfile

    ref, ref_s = fp32_reference(req, progress, say)
    out = Path(req.out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    # this run's own names (pid, start time, random part): parallel runs of one OUT_DIR never collide
    staging = Path(tempfile.mkdtemp(prefix=staging_prefix(out), suffix=".tmp", dir=out.parent))
    cache = staging.with_name(staging.name[:-4] + "-calib-cache.json")
    try:
        attempts = Attempts(req, ref, staging, cache, say, progress)
        passed, parts, auto = attempts.search()
        result = _result(req, attempts.reports[parts], passed, parts, ref_s, QuantOptions, auto)
        if req.bench_rounds > 0:
            result.speed, result.speedup_vs_fp32, result.machine = _speed(req, staging, say)
        dest = out if passed else out.with_name(out.name + ".FAILED")
        if req.calibration is not None and not req.calibration_saved:
            req.calibration.save(staging / "calibration")
        atomic_write_json(staging / REPORT_NAME, result.to_report())
        promote_dir(staging, dest, overwrite=req.overwrite or not passed)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        cache.unlink(missing_ok=True)
    return result, dest


def _result(req, final: dict, passed: bool, parts, ref_s: float, QuantOptions, auto: dict) -> CalibrationResult:
    o, evals, calib = req.options, req.eval_slates, req.calibration
    ids = slate_ids(evals)
    return CalibrationResult(
        precision=Precision.parse(o.precision), backend=o.backend, target=o.target, passed=passed,
        top1_agreement=final["top1_agreement"], kendall_tau_mean=final["kendall_tau_mean"],
        recall10_delta=final["recall@10_delta"], excluded_parts=list(parts), gate=final,
        eval_slates={"file": req.eval_source, "count": len(evals), "first_id": ids[0], "last_id": ids[-1]},
        calibration=None if calib is None else {k: calib.meta.get(k) for k in
                                                ("source", "source_sha256", "seed", "count", "batch_size", "data_sha256")},
        options=QuantOptions(**{**o.__dict__, "exclude": tuple(parts)}).to_dict(),
        reference=str(req.export_dir), reference_seconds=round(ref_s, 1), auto=auto or None,
    )


def _speed(req: CalibrateRequest, staging: Path, say: Say) -> tuple[dict, float, dict]:
    """(speed record, speed-up over FP32, machine) of the interleaved timing run."""
    p = req.options.precision
    say(f"timing {p} vs fp32 interleaved ({req.bench_rounds} rounds)")
    evals = req.eval_slates[: max(1, min(len(req.eval_slates), req.bench_rounds))]
    sp = compare_speed({"fp32": req.export_dir, p: staging}, evals, rounds=req.bench_rounds,
                       warmup=req.bench_warmup, threads=req.threads)
    return sp, sp["speedup_vs_fp32"][p], describe_machine(shared=True, note="CPU cores shared with other processes during the run")
