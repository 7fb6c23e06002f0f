"""``hllm calibrate --backend auto``: build every engine × precision this CPU can run from one FP32 export,
gate each on labelled held-out slates, time the ones that pass interleaved, keep the fastest.

Candidates (:data:`CANDIDATES`), each with the instruction sets it needs and the export flavour it reads:

============================  ==========  =========  ===========================================
name                          engine      precision  needs
============================  ==========  =========  ===========================================
``onnxruntime-fp32``          ONNX Runt.  fp32       the export itself (the baseline)
``onnxruntime-fused-fp32``    ONNX Runt.  fp32       flavour ``standard`` (fused here: ort-cpu ops)
``openvino-fp32``             OpenVINO    fp32       flavour ``standard``
``openvino-bf16``             OpenVINO    bf16       flavour ``standard``; AVX512_BF16 or AMX-BF16
``openvino-bf16-islands``     OpenVINO    bf16       as above; typed bf16 GEMMs with fp32 islands
``openvino-int8``             OpenVINO    int8       flavour ``standard``; calibration data (NNCF accuracy control)
``openvino-int8-bf16``        OpenVINO    int8       as above, float ops in bf16; AVX512_BF16 or AMX-BF16
``onnxruntime-int8-dynamic``  ONNX Runt.  int8       —
``onnxruntime-int8-static``   ONNX Runt.  int8       calibration data
============================  ==========  =========  ===========================================

A candidate the CPU or the export cannot run is listed with the reason (``refused``) and never built.
The accuracy-control candidates (:data:`ACCURACY_CONTROL`) let NNCF validate on ``validation_slates``,
which must not be gate slates (:func:`check_validation`); without them they are refused.
The FP32 reference scores on the evaluation slates come from the fastest fp32 engine of the export
(:func:`hllm.calibration.pipeline.fastest_fp32`), or from the ``--reference-scores`` cache. An fp32
candidate computes the same function in another order of summation, so it is checked by tensor parity
on the first :data:`FP32_PARITY_SLATES` slates (:func:`fp32_parity`: max|ΔM| ≤ :data:`FP32_PARITY_ATOL`, all
finite) instead of a ranking gate over every slate. A reduced-precision candidate is judged by the gate
(:mod:`hllm.verify.gate`: quality non-inferiority + fidelity floor by default, ``strict`` on request)
on all the slates, scored in chunks and stopped as soon as it can no longer pass
(:func:`hllm.verify.sequential.hopeless`). Those that pass are timed interleaved
(:func:`hllm.calibration.speed.compare_speed`, median engine ms per slate, batch 1) and the fastest is
promoted to ``out_dir`` — an export directory whose sidecar names its engine, so ``hllm rank``,
``serve``, ``eval`` and ``parity`` open it as it is. The FP32 baseline passes its parity check unless an
engine is broken, so a run writes a directory (possibly the FP32 graph itself when nothing faster passes).

Sources: OpenVINO precision hints (docs.openvino.ai, "Precision Control"); NNCF post-training quantization
(``nncf.quantize``); ONNX Runtime quantization (``onnxruntime.quantization``).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from hllm.calibration.candidate import Candidate
from hllm.calibration.pipeline import CalibrateRequest, fp32_reference, gate_line
from hllm.calibration.speed import compare_speed
from hllm.errors import EngineError, SlateError
from hllm.extras import optional
from hllm.files import _staging_prefix, atomic_write_json, copy_files, promote_dir
from hllm.formats.export import read_export, write_export
from hllm.formats.precision import Precision
from hllm.formats.report import envelope
from hllm.verify.parity import ParityReport, Thresholds, compare_slate
from hllm.verify.reference import cpu_ranker, ranker_scores
from hllm.verify.sequential import run_gate

Say = Callable[[str], None]

#: The report written beside the selected export.
SELECTION_NAME = "selection_report.json"
#: fp32 candidates: slates of the tensor-parity check, and its max |ΔM| against the FP32 reference. fp32
#: engines differ only in the order of summation: ONNX Runtime vs PyTorch eager on the real export differ
#: by < 5e-5 on scores of magnitude ~10, so 1e-3 leaves room for other kernels and catches a wrong graph.
FP32_PARITY_SLATES = 8
FP32_PARITY_ATOL = 1e-3


CANDIDATES: tuple[Candidate, ...] = (
    Candidate("onnxruntime-fp32", "onnxruntime", "fp32"),
    Candidate("onnxruntime-fused-fp32", "onnxruntime", "fp32", flavour="standard"),
    Candidate("openvino-fp32", "openvino", "fp32", inference_precision="f32", flavour="standard"),
    Candidate("openvino-bf16", "openvino", "bf16", inference_precision="bf16", flavour="standard",
              isa=("avx512_bf16", "amx_bf16")),
    Candidate("openvino-bf16-islands", "openvino", "bf16", flavour="standard", isa=("avx512_bf16", "amx_bf16")),
    Candidate("openvino-int8", "openvino", "int8", inference_precision="f32", flavour="standard",
              needs_calibration=True),
    Candidate("openvino-int8-bf16", "openvino", "int8", inference_precision="bf16", flavour="standard",
              isa=("avx512_bf16", "amx_bf16"), needs_calibration=True),
    Candidate("onnxruntime-int8-dynamic", "onnxruntime", "int8"),
    Candidate("onnxruntime-int8-static", "onnxruntime", "int8", needs_calibration=True),
)
BASELINE = CANDIDATES[0].name


#: Candidates built by NNCF's accuracy control: their ``validation_fn`` runs on slates of their own, which
#: must not be the gate's (a search tuned on the slates that then judge it would pass by selection).
ACCURACY_CONTROL = ("openvino-int8", "openvino-int8-bf16")
NO_VALIDATION = ("needs validation slates apart from the gate's for NNCF's accuracy control (`hllm calibrate` "
                 "takes the slates after --limit in --slates: give a file with more slates than --limit)")


def check_validation(validation: Sequence[dict], eval_slates: Sequence[dict]) -> None:
    """Refuse validation slates of NNCF's accuracy control that are also gate slates (same ``slate_id``).

    Args: validation / eval_slates: slate dicts (``slate_id`` strings; a slate without one is compared as "").
    Raises: SlateError naming how many overlap and a few of their ids.
    """
    gate_ids = {str(s.get("slate_id", "")) for s in eval_slates}
    both = sorted({str(s.get("slate_id", "")) for s in validation} & gate_ids)
    if both:
        raise SlateError(f"{len(both)} validation slate(s) of the accuracy control are also gate slates (e.g. "
                         f"{both[:3]}): NNCF must validate on other slates than those that judge its result")


def refusal(c: Candidate, flavour: str, features: Sequence[str], has_calibration: bool,
            openvino_installed: bool) -> str | None:
    """Why ``c`` cannot be built here (None = it can): the export's flavour, the CPU's instruction sets
    (``features`` as :func:`hllm.measure.cpu_flags` names them), missing calibration data or OpenVINO."""
    if c.flavour is not None and flavour != c.flavour:
        return f"needs an export of flavour {c.flavour} (this one is {flavour}; `hllm export --flavour {c.flavour}`)"
    if c.isa and not set(c.isa) & set(features):
        return (f"this CPU lacks {' and '.join(i.upper() for i in c.isa)} "
                f"(CPU features: {', '.join(features) or 'unknown'})")
    if c.engine == "openvino" and not openvino_installed:
        return "OpenVINO is not installed (pip install 'hllm[openvino]')"
    if c.needs_calibration and not has_calibration:
        return "needs calibration data (--calib-slates or --calibration)"
    return None


@dataclass
class SelectRequest:
    """One selection run. ``export_dir``: the FP32 export; ``out_dir``: where the winner goes;
    ``eval_slates``: labelled held-out slates of the gate (≥ 200 recommended); ``calibration``: a
    :class:`hllm.formats.calibration_set.CalibrationSet` or None; ``only``: candidate names to consider
    (empty = all); ``rounds`` / ``warmup``: interleaved timing rounds; ``threads``: engine threads."""

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


@dataclass
class SelectionResult:
    """What a selection run decided: ``selected`` (a candidate name), ``candidates`` (one record per
    candidate: refused / gate figures / engine ms per slate / speed-up over ``onnxruntime-fp32``), the
    machine it ran on and the gate's slates. ``to_dict`` is ``selection_report.json``."""

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


def _copy_tree(src: Path, dst: Path) -> None:
    """New directory ``dst`` with a copy of every file of ``src`` (:func:`hllm.files.copy_files`: never hard
    links, so writing the selected export in place cannot change the input export)."""
    dst.mkdir(parents=True)
    copy_files(src, dst)


def check_start(meta, only: Sequence[str] = ()) -> None:
    """Refuse what a selection cannot start from, before any work: a candidate name in ``only`` that is
    not in :data:`CANDIDATES`, an export that is not fp32, or one whose sidecar selects another engine
    than ONNX Runtime (e.g. ``engine: openvino``, a previous selection's result: the ``onnxruntime-*``
    candidates built from it would inherit that engine and be timed on OpenVINO).

    Args:
        meta: the export's :class:`hllm.formats.export.ExportMeta`. only: ``--candidate`` names.
    Raises: EngineError naming the problem and the way out.
    """
    names = {c.name for c in CANDIDATES}
    bad = [n for n in only if n not in names]
    if bad:
        raise EngineError(f"unknown candidate(s) {bad}; one of {sorted(names)}")
    if meta.precision is not Precision.FP32:
        raise EngineError(f"{meta.root} is a {meta.precision.value} export: --backend auto starts from the FP32 export")
    engine = meta.engine
    if engine != "onnxruntime":
        raise EngineError(f"{meta.root}: its sidecar selects the {engine} engine (a `calibrate --backend auto` result?); "
                          "--backend auto starts from the ONNX Runtime FP32 export it was made from")


def build(c: Candidate, export_dir: Path, dst: Path, calibration=None, bf16_islands: Path | None = None,
          validation: Sequence[dict] = (), thresholds=None) -> Path:
    """Write candidate ``c`` of ``export_dir`` to the new directory ``dst``; returns ``dst``.

    Fused fp32: :func:`hllm.exporter.fusion.fuse_export`. fp32 / bf16 OpenVINO: the export's files with a sidecar that says ``engine: openvino`` and the
    inference precision. INT8: NNCF with accuracy control on OpenVINO (:func:`hllm.calibration.accuracy_control.build_candidate`:
    NNCF validates on the ``validation`` slates — held out from the gate's, :func:`check_validation` — with a
    ``max_drop`` from ``thresholds``)
    or ``onnxruntime.quantization`` (dynamic / static).
    Raises: EngineError / NothingToQuantize from the quantizers.
    """
    if c.name == BASELINE:
        _copy_tree(export_dir, dst)
    elif c.name == "openvino-bf16-islands":
        from hllm.calibration.bf16_islands import build_candidate

        build_candidate(export_dir, dst, bf16_islands)
    elif c.name == "onnxruntime-fused-fp32":
        from hllm.exporter.fusion import fuse_export

        fuse_export(export_dir, dst)
    elif c.engine == "openvino" and c.precision in (Precision.FP32, Precision.BF16):
        _copy_tree(export_dir, dst)
        raw = read_export(export_dir).raw
        write_export(dst, {**raw, "engine": "openvino", "openvino": {"inference_precision": c.inference_precision}})
    elif c.name in ACCURACY_CONTROL:  # NNCF accuracy control on validation slates apart from the gate's
        from hllm.calibration.accuracy_control import build_candidate

        build_candidate(export_dir, dst, calibration, validation, thresholds,
                        inference_precision=c.inference_precision)
    else:
        from hllm.calibration.options import QuantOptions
        from hllm.calibration.quantize import quantize_export

        backend = "ort-dynamic" if c.name.endswith("dynamic") else "ort-static"
        quantize_export(export_dir, dst, QuantOptions(backend=backend, precision=Precision.INT8), calibration)
    return dst


def select(req: SelectRequest, say: Say = lambda m: None, progress=None) -> tuple[SelectionResult, Path]:
    """Run the selection (module doc); returns ``(result, out_dir)``. ``progress(description, total)`` →
    ``advance(n)`` shows the reference pass and each candidate's gate (:data:`hllm.calibration.pipeline.Progress`).

    Raises: EngineError from :func:`check_start` (unknown candidate, not an ONNX Runtime fp32 export) or when
        the FP32 export itself cannot be gated; FileExistsError if ``out_dir`` exists and
        ``overwrite`` is False; the quantizers' errors are recorded per candidate, not raised.
    """
    from hllm.measure import cpu_flags, describe_machine

    t_start, load_start = time.perf_counter(), _load_1m()
    progress = progress or (lambda d, n: (lambda k: None))
    meta = read_export(req.export_dir)
    check_start(meta, req.only)
    check_validation(req.validation_slates, req.eval_slates)
    flavour, features = meta.flavour, cpu_flags()
    have_ov = optional("openvino") is not None
    ref_info: dict = {}
    ref, _ = fp32_reference(CalibrateRequest(req.export_dir, req.out_dir, None, req.thresholds, req.eval_slates, "",
                                             threads=req.threads, reference_cache=req.reference_cache),
                            progress, say, info=ref_info)
    out = Path(req.out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=_staging_prefix(out), suffix=".tmp", dir=out.parent))
    records, built = [], {}
    try:
        for c in CANDIDATES:
            rec = {"name": c.name, "engine": c.engine, "precision": str(c.precision)}
            records.append(rec)
            why = "not requested (--candidate)" if req.only and c.name not in req.only and c.name != BASELINE else \
                refusal(c, flavour, features, req.calibration is not None, have_ov) or \
                (NO_VALIDATION if c.name in ACCURACY_CONTROL and not req.validation_slates else None)
            if why:
                rec["refused"] = why
                say(f"{c.name}: refused — {why}")
                continue
            t0 = time.perf_counter()
            try:
                path = build(c, req.export_dir, work / c.name, req.calibration, bf16_islands=req.bf16_islands,
                             validation=req.validation_slates, thresholds=req.thresholds)
                rec["build_s"] = round(time.perf_counter() - t0, 1)
                t0 = time.perf_counter()
                if c.precision is Precision.FP32 and c.name == ref_info.get("engine"):
                    rec["check"] = "reference"  # it computed the reference: nothing to compare it with
                    rec["passed"] = True
                    say(f"{c.name}: computed the FP32 reference")
                elif c.precision is Precision.FP32:
                    par = fp32_parity(ref, path, req.eval_slates, req.threads)
                    rec["check"], rec["parity"], rec["passed"] = "parity", par.to_dict(per_slate=False), par.passed
                    say(f"{c.name}: parity on {par.summary().slates} slates, max|ΔM| {par.summary().max_abs_diff:.2g} "
                        f"(≤ {FP32_PARITY_ATOL:g}) → {'pass' if par.passed else 'FAIL'}")
                else:
                    advance = progress(f"gate {c.name}", len(req.eval_slates))
                    rep = gate_fail_fast(ref, path, req.eval_slates, req.thresholds, req.threads, on_progress=advance)[0]
                    g = rep.to_dict()
                    rec["check"], rec["gate"], rec["passed"] = "gate", _gate_record(g), bool(rep.passed)
                    say(f"{c.name}: {gate_line(g)}")
                rec["check_s"] = round(time.perf_counter() - t0, 1)
            except Exception as e:  # one candidate's failure is a record, never the end of the run
                rec["error"] = f"{type(e).__name__}: {e}"
                say(f"{c.name}: failed — {rec['error']}")
                continue
            if rec["passed"]:
                built[c.name] = path
        if BASELINE not in built:
            why = records[0].get("error") or f"parity with the FP32 reference failed: {records[0].get('parity', {}).get('failures')}"
            raise EngineError(f"the FP32 export itself could not be checked: {why}")
        timing = _time(req, built, records, say)
        best = min(built, key=lambda n: timing["engine_ms"][n]["median"]) if timing else BASELINE
        say(f"selected {best}")
        result = SelectionResult(best, records, {**describe_machine(), "load_avg_1m_start": load_start},
                                 _slates_record(req.eval_slates),
                                 {**req.thresholds.to_dict(), "fp32_parity": {"slates": FP32_PARITY_SLATES,
                                                                              "atol": FP32_PARITY_ATOL}},
                                 timing, ref_info, round(time.perf_counter() - t_start, 1))
        atomic_write_json(built[best] / SELECTION_NAME, result.to_report())
        promote_dir(built[best], out, overwrite=req.overwrite)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result, out


def gate_fail_fast(ref: Sequence, path, slates: Sequence[dict], thresholds, threads: int | None = None,
                   chunk: int = 10, on_progress=None):
    """Gate the export at ``path`` against the reference scores ``ref`` (one ``[n_i, K]`` float32 array per
    slate), scoring ``chunk`` slates at a time and stopping as soon as the gate can no longer pass
    (:func:`hllm.verify.sequential.hopeless`). Returns ``(GateReport over the slates scored, number scored)``; a
    report over fewer slates than given is a failure whatever its figures.

    Raises: EngineError / SlateError from loading or running the engine.
    """
    rep = run_gate(ref, path, slates, thresholds, threads=threads, fail_fast=True, chunk=chunk, on_progress=on_progress)
    return rep, len(rep.records)


def fp32_parity(ref: Sequence, path, slates: Sequence[dict], threads: int | None = None,
                count: int = FP32_PARITY_SLATES, atol: float = FP32_PARITY_ATOL):
    """Tensor parity of the fp32 candidate at ``path`` with the FP32 reference scores ``ref`` on the first
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


#: The keys of a gate report kept in each candidate's record of ``selection_report.json``.
GATE_RECORD_KEYS = ("gate", "slates", "passed", "failures", "criteria", "quality", "fidelity", "strict_passed",
                    "top1_agreement", "perm_match_rate", "kendall_tau_mean", "recall@10_delta", "auc_delta",
                    "ndcg@10_delta", "nonfinite", "max_abs_diff", "stopped_after", "stop_reason")


def _gate_record(g: dict) -> dict:
    return {k: g[k] for k in GATE_RECORD_KEYS if k in g}


def _time(req: SelectRequest, built: dict, records: list[dict], say: Say) -> dict:
    """Interleaved engine timing of the candidates that passed; fills each record's ``engine_ms`` and
    ``speedup_vs_fp32``. Returns compare_speed's record (empty when only the baseline passed)."""
    if len(built) < 2:
        return {}
    say(f"timing {', '.join(built)} interleaved ({req.rounds} rounds)")
    evals = req.eval_slates[: max(1, min(len(req.eval_slates), req.rounds))]
    sp = compare_speed(dict(built), evals, rounds=req.rounds, warmup=req.warmup, threads=req.threads,
                       baseline=BASELINE)
    for r in records:
        if r["name"] in built:
            r["engine_ms_median"] = round(sp["engine_ms"][r["name"]]["median"], 3)
            r["speedup_vs_fp32"] = sp[f"speedup_vs_{BASELINE}"][r["name"]]
    return sp


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
