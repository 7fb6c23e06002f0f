"""The steps of ``hllm calibrate`` that every recipe list shares (the loop that builds, checks, times and
chooses recipes is :mod:`hllm.calibration.selection.loop`; the CLI only parses options and prints):

* :func:`prepare_calibration` — load a saved calibration set or draw one from real slates
  (:mod:`hllm.calibration.data`); refused when it overlaps the gate's evaluation slates.
* :func:`fp32_reference` — the FP32 export's score matrices on the evaluation slates, computed once by its
  fastest fp32 engine (:func:`fastest_fp32`), optionally cached in an ``.npz`` keyed by content.
* :func:`gate_line` — one line of a gate report for the progress log.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Sequence

from hllm.calibration.data import build_calibration_set
from hllm.errors import SlateError
from hllm.extras import optional
from hllm.formats.calibration_set import load_calibration_set
from hllm.reading import sha256_file
from hllm.runtime.artefact import resolve
from hllm.runtime.ranker import Ranker
from hllm.runtime.slates import read_slates
from hllm.verify.gate import check_disjoint
from hllm.verify.reference import cpu_ranker, load_reference, reference_key, reference_scores, save_reference
from hllm.verify.scoring import score_slates

Say = Callable[[str], None]
#: ``progress(description, total)`` → ``advance(n)``; the CLI draws a bar, library callers may ignore it.
Progress = Callable[[str, int], Callable[[int], None]]


def quiet(_msg: str) -> None:
    """A :data:`Say` that says nothing."""


def no_bar(_desc: str, _total: int) -> Callable[[int], None]:
    """A :data:`Progress` that draws nothing."""
    return lambda n: None


def prepare_calibration(artefact, builder, backend: str, calibration: Path | None, calib_slates: Path | None,
                        count: int, seed: int, batch_size: int, eval_ids: Sequence[str], say: Say = quiet):
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


def fastest_fp32(art, slates: Sequence[dict], threads: int | None = None, say: Say = quiet):
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


def fp32_reference(req, progress: Progress = no_bar, say: Say = quiet, info: dict | None = None):
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
