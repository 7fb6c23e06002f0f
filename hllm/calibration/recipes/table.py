"""The recipes of ``hllm calibrate --backend auto``: the table (:data:`RECIPES`), what a selection refuses to
start from (:func:`check_start`) and the validation slates NNCF's accuracy control may use
(:func:`check_validation`). How each is built: :meth:`hllm.calibration.recipes.recipe.Recipe.build`; the run
that builds, times and gates them: :mod:`hllm.calibration.selection.select`.

================================  ==========  =========  =========================  ==================================
name                              engine      precision  scheme                     needs
================================  ==========  =========  =========================  ==================================
``onnxruntime-fp32``              ONNX Runt.  fp32       export                     the export itself (the baseline)
``onnxruntime-fused-fp32``        ONNX Runt.  fp32       fused-fp32                 flavour ``standard`` (fused:
                                                                                    ort-cpu ops)
``openvino-fp32``                 OpenVINO    fp32       openvino-fp32              flavour ``standard``
``openvino-bf16``                 OpenVINO    bf16       openvino-bf16-hint         flavour ``standard``; AVX512_BF16
                                                                                    or AMX-BF16
``openvino-bf16-islands``         OpenVINO    bf16       openvino-bf16-islands      as above; typed bf16 GEMMs, fp32
                                                                                    islands
``openvino-int8-weights-sym``     OpenVINO    int8       openvino-int8-weights      flavour ``standard`` (INT8_SYM
                                                                                    weights, dynamic activation
                                                                                    quantization, group 32)
``openvino-int8-weights-asym``    OpenVINO    int8       openvino-int8-weights      as above, INT8_ASYM weights
``openvino-int8-mlp``             OpenVINO    int8       openvino-mixed-int8-mlp    flavour ``standard``; AVX512_BF16
                                                                                    / AMX (INT8 MLP products with
                                                                                    dynamic activation quantization,
                                                                                    fp32 attention and head, bf16
                                                                                    elsewhere)
``openvino-int8-mlp-fp32``        OpenVINO    int8       openvino-mixed-int8-mlp    as above, fp32 elsewhere; for a CPU
                                                                                    without AVX512_BF16 / AMX
``openvino-int8-search``          OpenVINO    int8       openvino-int8-sensitivity  as ``openvino-int8-mlp``; validation
                                                                                    slates (the most sensitive layers'
                                                                                    MLPs kept bf16)
``openvino-int8-search-fp32``     OpenVINO    int8       openvino-int8-sensitivity  as above, kept fp32; for a CPU
                                                                                    without AVX512_BF16 / AMX
``openvino-int8``                 OpenVINO    int8       nncf-accuracy-control      flavour ``standard``; calibration
                                                                                    data
``openvino-int8-bf16``            OpenVINO    int8       nncf-accuracy-control      as above, float ops in bf16;
                                                                                    AVX512_BF16 / AMX
``onnxruntime-int8-dynamic``      ONNX Runt.  int8       ort-dynamic                —
``onnxruntime-int8-static``       ONNX Runt.  int8       ort-static                 calibration data
================================  ==========  =========  =========================  ==================================

Sources: OpenVINO precision hints (docs.openvino.ai, "Precision Control") and CPU dynamic quantization
(``DYNAMIC_QUANTIZATION_GROUP_SIZE``); NNCF post-training quantization (``nncf.quantize``,
``nncf.quantize_with_accuracy_control``) and weight compression (``nncf.compress_weights``, ``nncf.IgnoredScope``);
ONNX Runtime quantization (``onnxruntime.quantization``).
"""

from __future__ import annotations

from typing import Sequence

from hllm.calibration.recipes.recipe import Recipe
from hllm.errors import EngineError, SlateError
from hllm.formats.precision import Precision
from hllm.runtime.slates import slate_ids

BF16_ISA = ("avx512_bf16", "amx_bf16")
RECIPES: tuple[Recipe, ...] = (
    Recipe("onnxruntime-fp32", "onnxruntime", "fp32", scheme="export"),
    Recipe("onnxruntime-fused-fp32", "onnxruntime", "fp32", scheme="fused-fp32", flavour="standard"),
    Recipe("openvino-fp32", "openvino", "fp32", scheme="openvino-fp32", inference_precision="f32", flavour="standard"),
    Recipe("openvino-bf16", "openvino", "bf16", scheme="openvino-bf16-hint", inference_precision="bf16",
           flavour="standard", isa=BF16_ISA),
    Recipe("openvino-bf16-islands", "openvino", "bf16", scheme="openvino-bf16-islands", flavour="standard", isa=BF16_ISA),
    Recipe("openvino-int8-weights-sym", "openvino", "int8", scheme="openvino-int8-weights", inference_precision="f32",
           flavour="standard", settings={"mode": "int8_sym", "group_size": 32}),
    Recipe("openvino-int8-weights-asym", "openvino", "int8", scheme="openvino-int8-weights", inference_precision="f32",
           flavour="standard", settings={"mode": "int8_asym", "group_size": 32}),
    Recipe("openvino-int8-mlp", "openvino", "int8", scheme="openvino-mixed-int8-mlp", inference_precision="f32",
           flavour="standard", isa=BF16_ISA, settings={"float_precision": "bf16"}),
    Recipe("openvino-int8-mlp-fp32", "openvino", "int8", scheme="openvino-mixed-int8-mlp", inference_precision="f32",
           flavour="standard", isa_absent=BF16_ISA, settings={"float_precision": "fp32"}),
    Recipe("openvino-int8-search", "openvino", "int8", scheme="openvino-int8-sensitivity", inference_precision="f32",
           flavour="standard", isa=BF16_ISA, settings={"float_precision": "bf16"}),
    Recipe("openvino-int8-search-fp32", "openvino", "int8", scheme="openvino-int8-sensitivity",
           inference_precision="f32", flavour="standard", isa_absent=BF16_ISA, settings={"float_precision": "fp32"}),
    Recipe("openvino-int8", "openvino", "int8", scheme="nncf-accuracy-control", inference_precision="f32",
           flavour="standard", needs_calibration=True),
    Recipe("openvino-int8-bf16", "openvino", "int8", scheme="nncf-accuracy-control", inference_precision="bf16",
           flavour="standard", isa=BF16_ISA, needs_calibration=True),
    Recipe("onnxruntime-int8-dynamic", "onnxruntime", "int8", scheme="ort-dynamic"),
    Recipe("onnxruntime-int8-static", "onnxruntime", "int8", scheme="ort-static", needs_calibration=True),
)
BASELINE = RECIPES[0].name


#: Recipes built by a search on validation slates (NNCF's accuracy control, whose ``validation_fn`` runs on
#: them, and the INT8 sensitivity search): the slates must not be the gate's (a search tuned on the slates
#: that then judge it would pass by selection). The selection builds them last, with the time left.
ACCURACY_CONTROL = ("openvino-int8", "openvino-int8-bf16", "openvino-int8-search", "openvino-int8-search-fp32")
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


def check_start(meta, only: Sequence[str] = ()) -> None:
    """Refuse what a selection cannot start from, before any work: a recipe name in ``only`` that is
    not in :data:`RECIPES`, an export that is not fp32, or one whose sidecar selects another engine
    than ONNX Runtime (e.g. ``engine: openvino``, a previous selection's result: the ``onnxruntime-*``
    recipes built from it would inherit that engine and be timed on OpenVINO).

    Args:
        meta: the export's :class:`hllm.formats.export.ExportMeta`. only: ``--recipe`` names.
    Raises: EngineError naming the problem and the way out.
    """
    names = {r.name for r in RECIPES}
    bad = [n for n in only if n not in names]
    if bad:
        raise EngineError(f"unknown recipe(s) {bad}; one of {sorted(names)}")
    if meta.precision is not Precision.FP32:
        raise EngineError(f"{meta.root} is an export of precision {meta.precision.value}: --backend auto starts from the FP32 export")
    engine = meta.engine
    if engine != "onnxruntime":
        raise EngineError(f"{meta.root}: its sidecar selects the {engine} engine (a `calibrate --backend auto` result?); "
                          "--backend auto starts from the ONNX Runtime FP32 export it was made from")
