"""The candidates of ``hllm calibrate --backend auto``: the table (:data:`CANDIDATES`), why one cannot be
built here (:func:`refusal`), what a selection refuses to start from (:func:`check_start`) and how each is
built from the FP32 export (:func:`build`). The run that builds, times and gates them: :mod:`hllm.calibration.select`.

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

Sources: OpenVINO precision hints (docs.openvino.ai, "Precision Control"); NNCF post-training quantization
(``nncf.quantize``, ``nncf.quantize_with_accuracy_control``); ONNX Runtime quantization (``onnxruntime.quantization``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from hllm.calibration.candidate import Candidate
from hllm.errors import EngineError, SlateError
from hllm.files import copy_files
from hllm.formats.export import read_export, write_export
from hllm.formats.precision import Precision
from hllm.runtime.slates import slate_ids

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
    """Refuse validation slates of NNCF's accuracy control that are also gate slates, by the project's one id
    rule (:func:`hllm.runtime.slates.slate_id`): ``validation`` follows ``eval_slates`` in the input, so a slate
    without ``slate_id`` is named by its index after the gate's.

    Args: validation / eval_slates: slate dicts, in input order (the gate's first).
    Raises: SlateError naming how many overlap and a few of their ids.
    """
    gate = set(slate_ids(eval_slates))
    both = sorted(set(slate_ids(validation, len(eval_slates))) & gate)
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
        raise EngineError(f"{meta.root} is an export of precision {meta.precision.value}: --backend auto starts from the FP32 export")
    engine = meta.engine
    if engine != "onnxruntime":
        raise EngineError(f"{meta.root}: its sidecar selects the {engine} engine (a `calibrate --backend auto` result?); "
                          "--backend auto starts from the ONNX Runtime FP32 export it was made from")


def build(c: Candidate, export_dir: Path, dst: Path, calibration=None, bf16_islands: Path | None = None,
          validation: Sequence[dict] = (), thresholds=None, ac_settings: dict | None = None) -> Path:
    """Write candidate ``c`` of ``export_dir`` to the new directory ``dst``; returns ``dst``.

    Fused fp32: :func:`hllm.exporter.fusion.fuse_export`. fp32 / bf16 OpenVINO: the export's files with a sidecar that says ``engine: openvino`` and the
    inference precision. INT8: NNCF with accuracy control on OpenVINO (:func:`hllm.calibration.accuracy_control.build_candidate`:
    NNCF validates on the ``validation`` slates — held out from the gate's, :func:`check_validation` — with a
    ``max_drop`` from ``thresholds``; ``ac_settings`` override its
    :data:`~hllm.calibration.accuracy_control.CANDIDATE_SETTINGS`, e.g. ``budget_s``)
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
                        inference_precision=c.inference_precision, settings=ac_settings)
    else:
        from hllm.calibration.options import QuantOptions
        from hllm.calibration.quantize import quantize_export

        backend = "ort-dynamic" if c.name.endswith("dynamic") else "ort-static"
        quantize_export(export_dir, dst, QuantOptions(backend=backend, precision=Precision.INT8), calibration)
    return dst
