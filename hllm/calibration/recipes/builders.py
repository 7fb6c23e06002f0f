"""The build function of each recipe scheme (:data:`hllm.calibration.recipes.recipe.SCHEMES`):
``builder(recipe, export_dir, dst, inputs)`` writes the new export directory ``dst`` from the FP32 export
``export_dir``. :data:`BUILDERS` maps each scheme to its function; :meth:`Recipe.build` looks it up.

Sources: ONNX Runtime quantization (``onnxruntime.quantization``); NVIDIA ModelOpt ONNX PTQ; NNCF
(``nncf.quantize``, ``nncf.quantize_with_accuracy_control``, ``nncf.compress_weights``, ``nncf.IgnoredScope``);
OpenVINO precision hints (docs.openvino.ai, "Precision Control") and CPU dynamic quantization
(``DYNAMIC_QUANTIZATION_GROUP_SIZE``).
"""

from __future__ import annotations

from pathlib import Path

from hllm.files import copy_files
from hllm.formats.export import ExportChange, OpenVinoSettings, derive_export, read_export


def build_export(recipe, export_dir: Path, dst: Path, inputs) -> None:
    """``export``: the FP32 export itself, every file copied (never hard links: writing the selected
    export in place cannot change the input)."""
    dst.mkdir(parents=True)
    copy_files(export_dir, dst)


def build_quantized(recipe, export_dir: Path, dst: Path, inputs) -> None:
    """``ort-static`` / ``ort-dynamic`` / ``ort-weight-only`` / ``modelopt``: :func:`hllm.calibration.recipes.quantize.quantize_export`
    with ``inputs.options`` (None = the scheme's defaults at the recipe's precision)."""
    from hllm.calibration.recipes.options import QuantOptions
    from hllm.calibration.recipes.quantize import quantize_export

    opts = inputs.options or QuantOptions(backend=recipe.scheme, precision=recipe.precision)
    quantize_export(export_dir, dst, opts, inputs.calibration,
                    cache_path=inputs.cache_path if opts.backend == "ort-static" else None)


def build_nncf_int8(recipe, export_dir: Path, dst: Path, inputs) -> None:
    """``nncf-int8``: NNCF post-training INT8 with SmoothQuant on OpenVINO
    (:func:`hllm.calibration.recipes.openvino_int8.quantize_openvino`), ``inputs.keep_float`` in NNCF's ignored scope."""
    from hllm.calibration.recipes.openvino_int8 import quantize_openvino

    quantize_openvino(export_dir, dst, inputs.feeds, keep_float=inputs.keep_float,
                      smooth_quant_alpha=inputs.smooth_quant_alpha)


def build_accuracy_control(recipe, export_dir: Path, dst: Path, inputs) -> None:
    """``nncf-accuracy-control``: NNCF INT8 with accuracy control on validation slates apart from the gate's
    (:func:`hllm.calibration.recipes.accuracy_control.build_recipe`)."""
    from hllm.calibration.recipes import accuracy_control

    accuracy_control.build_recipe(export_dir, dst, inputs.calibration, inputs.validation, inputs.thresholds,
                                     inference_precision=recipe.inference_precision or "f32",
                                     settings=inputs.ac_settings)


def build_openvino_hint(recipe, export_dir: Path, dst: Path, inputs) -> None:
    """``openvino-fp32`` / ``openvino-bf16-hint``: the export's files with a sidecar that says ``engine:
    openvino`` and the inference precision hint."""
    build_export(recipe, export_dir, dst, inputs)
    derive_export(read_export(export_dir), dst, ExportChange(
        engine="openvino", openvino=OpenVinoSettings(None, recipe.inference_precision)))


def build_bf16_islands(recipe, export_dir: Path, dst: Path, inputs) -> None:
    """``openvino-bf16-islands``: typed bf16 GEMMs with fp32 islands (:func:`hllm.calibration.precision_search.bf16_islands.build_recipe`)."""
    from hllm.calibration.precision_search.bf16_islands import build_recipe

    build_recipe(export_dir, dst, inputs.bf16_islands)


def build_fused(recipe, export_dir: Path, dst: Path, inputs) -> None:
    """``fused-fp32``: ONNX Runtime's fused contrib ops (:func:`hllm.exporter.fusion.fuse_export`)."""
    from hllm.exporter.fusion import fuse_export

    fuse_export(export_dir, dst)


def build_int8_weights(recipe, export_dir: Path, dst: Path, inputs) -> None:
    """``openvino-int8-weights``: NNCF INT8 weight compression + OpenVINO's dynamic activation quantization
    (:func:`hllm.calibration.recipes.openvino_weights.compress_weights_export`)."""
    from hllm.calibration.recipes.openvino_weights import compress_weights_export

    compress_weights_export(export_dir, dst, **recipe.settings)


def build_mixed_int8_mlp(recipe, export_dir: Path, dst: Path, inputs) -> None:
    """``openvino-mixed-int8-mlp``: INT8 MLP products (NNCF weight compression restricted by its ignored scope,
    dynamic activation quantization), fp32 attention and head, bf16 / fp32 elsewhere
    (:func:`hllm.calibration.recipes.openvino_mixed.build_mixed_export` with the recipe's settings;
    ``inputs.keep_float``: parts kept out of INT8)."""
    from hllm.calibration.recipes.openvino_mixed import build_mixed_export

    keep = {"keep": tuple(inputs.keep_float)} if inputs.keep_float else {}
    build_mixed_export(export_dir, dst, **{**recipe.settings, **keep})


def build_int8_sensitivity(recipe, export_dir: Path, dst: Path, inputs) -> None:
    """``openvino-int8-sensitivity``: the bounded sensitivity-ordered INT8 search on validation slates apart
    from the gate's (:func:`hllm.calibration.recipes.int8_search.sensitivity_search`; ``inputs.ac_settings``
    override its settings, e.g. the selection's ``budget_s``)."""
    from hllm.calibration.recipes.int8_search import sensitivity_search

    sensitivity_search(export_dir, dst, inputs.validation, inputs.thresholds,
                       float_precision=recipe.settings.get("float_precision", "bf16"), settings=inputs.ac_settings)


BUILDERS = {
    "export": build_export, "ort-static": build_quantized, "ort-dynamic": build_quantized,
    "ort-weight-only": build_quantized, "modelopt": build_quantized, "nncf-int8": build_nncf_int8,
    "nncf-accuracy-control": build_accuracy_control, "openvino-fp32": build_openvino_hint,
    "openvino-bf16-hint": build_openvino_hint, "openvino-bf16-islands": build_bf16_islands,
    "fused-fp32": build_fused, "openvino-int8-weights": build_int8_weights,
    "openvino-mixed-int8-mlp": build_mixed_int8_mlp, "openvino-int8-sensitivity": build_int8_sensitivity,
}
