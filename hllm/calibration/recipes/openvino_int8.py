"""INT8 for the OpenVINO engine: NNCF post-training quantization of a ``standard`` export, with SmoothQuant.

NNCF (``nncf.quantize`` with ``model_type=ModelType.TRANSFORMER``) inserts FakeQuantize nodes on the
MatMul inputs and weights (8-bit, per-channel weights, per-tensor activations) from ranges measured on
calibration inputs, and for transformer models first applies SmoothQuant (Xiao et al. 2023, "SmoothQuant:
Accurate and Efficient Post-Training Quantization for Large Language Models", §4): activation outlier
channels are divided by ``s_j = max|X_j|^α / max|W_j|^(1-α)`` and the following weights multiplied by it,
which is exact in real arithmetic and moves the quantization difficulty from activations to weights.
Parts named in ``keep_float`` (module paths or parts as :func:`hllm.calibration.recipes.parts.nodes_in_part`
resolves them, e.g. ``backbone.layers.11.mlp.down_proj``, ``block:11``, ``head``) go to NNCF's
``IgnoredScope`` and stay fp32.

The output is an export directory that ``hllm rank`` / :func:`hllm.runtime.artefact.open_engine` open with
the OpenVINO engine: the FP32 export's files plus ``model_int8.xml`` / ``.bin`` (OpenVINO IR, weights
kept uncompressed), and ``export.json`` with ``precision: int8``, ``engine: openvino``,
``openvino: {ir, inference_precision}`` and ``quantization`` (what was done, for ``hllm info``).

INT8 with NNCF's accuracy control (quantizers reverted to float until the rankings are good enough):
:mod:`hllm.calibration.recipes.accuracy_control`.

Sources: NNCF post-training quantization, https://docs.openvino.ai/2026/openvino-workflow/model-optimization-guide/quantizing-models-post-training/basic-quantization-flow.html ;
``nncf.IgnoredScope``, ``nncf.AdvancedSmoothQuantParameters`` (NNCF API reference).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from hllm.calibration.data import choose_slates
from hllm.calibration.recipes.parts import nodes_in_part
from hllm.engines.openvino import no_signal_stack_after_compile
from hllm.errors import EngineError
from hllm.extras import quiet_telemetry
from hllm.files import copy_files
from hllm.formats.export import ExportChange, OpenVinoSettings, derive_export, read_export
from hllm.formats.graph import input_names, sidecar_reads_context
from hllm.formats.precision import Precision

IR_NAME = "model_int8.xml"


@contextlib.contextmanager
def nncf_output_to_stderr() -> Iterator[None]:
    """Within the block, NNCF's output goes to stderr, not stdout: its progress bars (``rich`` consoles that
    write to whatever ``sys.stdout`` is when they print, ``nncf.common.logging.track_progress``) and its log
    records (the ``nncf`` logger's console handler holds the ``sys.stdout`` of import time,
    ``nncf.common.logging.logger``). stdout stays free for the data a command prints (``--json``, ``-o -``).
    Restores both on exit; a file handler added to the ``nncf`` logger is left alone.
    """
    quiet_telemetry()  # before NNCF and OpenVINO load (their telemetry)
    with contextlib.redirect_stdout(sys.stderr):
        import nncf  # noqa: F401 - what it prints while importing goes to stderr too; its logger exists from here on

        moved = [h for h in logging.getLogger("nncf").handlers  # console handlers, not a user's log file
                 if type(h) is logging.StreamHandler and h.stream not in (sys.stderr, sys.__stderr__)]
        old = [h.setStream(sys.stderr) for h in moved]
        try:
            yield
        finally:
            for h, stream in zip(moved, old):
                h.setStream(stream)

def nncf_input(export_dir, out_dir):
    """The export NNCF quantizes and the new output directory: ``(ExportMeta, Path)``.

    Raises: EngineError for an export that is not fp32 of flavour ``standard``, or an existing ``out_dir``.
    """
    meta = read_export(export_dir)
    out = Path(out_dir)
    if meta.flavour != "standard" or meta.precision is not Precision.FP32:
        raise EngineError(f"{meta.root}: NNCF INT8 needs an fp32 export of flavour standard, got "
                          f"{meta.precision.value} {meta.flavour} (export with --flavour standard)")
    if out.exists():
        raise EngineError(f"{out} exists; choose a new directory")
    return meta, out


def ignored_node_names(onnx_path: Path, keep_float: Sequence[str]) -> list[str]:
    """ONNX node names of the parts to keep in fp32 (OpenVINO's ONNX frontend keeps them as op names).

    Raises: EngineError for a part that matches no node (:func:`hllm.calibration.recipes.parts.nodes_in_part`).
    """
    if not keep_float:
        return []
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    names: list[str] = []
    for part in keep_float:
        names += [n for n in nodes_in_part(model, part) if n not in names]
    return names


def checked_feeds(meta, calibration: Iterable[dict]) -> list[dict]:
    """The calibration feed dicts as a list, after checking there is one and that its inputs are the graph's
    (``context_positions`` exactly when the sidecar says the head reads the user context).

    Raises: EngineError (no input; inputs other than the graph's).
    """
    feeds = list(calibration)
    if not feeds:
        raise EngineError("NNCF INT8 needs at least one calibration input")
    want = set(input_names(sidecar_reads_context(meta.raw)))
    if set(feeds[0]) != want:
        raise EngineError(f"calibration inputs {sorted(feeds[0])} do not match the graph's {sorted(want)} "
                          "(encode them with calibration_feeds(..., context=...))")
    return feeds


def calibration_feeds(slates: Sequence[dict], builder, count: int, seed: int = 0, context: bool = False,
                      exclude_ids: Sequence[str] = ()) -> list[dict]:
    """``count`` slates drawn reproducibly (:func:`hllm.calibration.data.choose_slates`) and encoded one per feed
    with the export's prompt builder, with ``context_positions`` when the graph reads the user context.

    Raises: SlateError (too few eligible slates, encoding).
    """
    return [builder.encode([s]).inputs(context) for s in choose_slates(slates, count, seed, exclude_ids)]


def quantize_openvino(export_dir: str | os.PathLike, out_dir: str | os.PathLike, calibration: Iterable[dict],
                      keep_float: Sequence[str] = (), smooth_quant_alpha: float | None = None,
                      subset_size: int | None = None) -> dict:
    """Quantize the FP32 ``standard`` export in ``export_dir`` to INT8 with NNCF; write ``out_dir``.

    Args:
        export_dir: an FP32 export of flavour ``standard`` (OpenVINO cannot read the fused one).
        out_dir: the new export directory (must not exist; never inside ``export_dir``).
        calibration: feed dicts ``{input name: array}`` — e.g. a :class:`hllm.formats.calibration_set.CalibrationSet`
            of real slates encoded with the export's prompt builder.
        keep_float: parts kept in fp32 (module doc). smooth_quant_alpha: SmoothQuant α for MatMuls
            (None = NNCF's default for transformers; a negative value disables smoothing).
        subset_size: calibration inputs NNCF reads (default: all).
    Returns: the ``quantization`` record written into the sidecar.
    Raises: EngineError (wrong flavour / precision, out_dir exists, a part that matches nothing,
        NNCF failure).
    """
    with nncf_output_to_stderr():
        import nncf
    import openvino as ov

    meta, out = nncf_input(export_dir, out_dir)
    feeds = checked_feeds(meta, calibration)
    ignored = ignored_node_names(meta.onnx_path, keep_float)
    advanced = None
    if smooth_quant_alpha is not None:
        advanced = nncf.AdvancedQuantizationParameters(
            smooth_quant_alphas=nncf.AdvancedSmoothQuantParameters(matmul=float(smooth_quant_alpha)))
    t0 = time.perf_counter()
    model = ov.Core().read_model(str(meta.onnx_path))
    try:
        with nncf_output_to_stderr(), no_signal_stack_after_compile():
            q = nncf.quantize(model, nncf.Dataset(feeds), model_type=nncf.ModelType.TRANSFORMER,
                              subset_size=subset_size or len(feeds),
                              ignored_scope=nncf.IgnoredScope(names=ignored, validate=False) if ignored else None,
                              advanced_parameters=advanced)
    except Exception as e:
        raise EngineError(f"NNCF quantization failed: {e}") from None
    seconds = time.perf_counter() - t0
    record = {"backend": "nncf", "precision": "int8", "nncf": nncf.__version__, "openvino": ov.__version__,
              "model_type": "transformer", "smooth_quant_alpha": smooth_quant_alpha,
              "calibration_inputs": subset_size or len(feeds), "keep_float": list(keep_float),
              "ignored_nodes": len(ignored), "fake_quantize_nodes": fake_quantize_count(q), "seconds": round(seconds, 1)}
    write_int8_export(meta, q, out, record)
    return record


def fake_quantize_count(model) -> int:
    """Number of ``FakeQuantize`` nodes of an OpenVINO model (the quantizers NNCF inserted and kept)."""
    return sum(op.get_type_name() == "FakeQuantize" for op in model.get_ops())


def write_int8_export(meta, model, out: Path, record: dict, inference_precision: str = "f32", ir_name: str = IR_NAME,
                      dynamic_group_size: int | None = None) -> None:
    """Write the quantized OpenVINO ``model`` as the new export directory ``out``: the FP32 export's files,
    ``model_int8.xml`` / ``.bin`` (weights uncompressed) and a sidecar with ``precision: int8``,
    ``engine: openvino``, ``openvino: {ir, inference_precision}`` and ``quantization: record``. Written
    to a staging directory beside ``out`` and renamed, so a failure leaves no half export.

    Args:
        meta: the FP32 export's :class:`hllm.formats.export.ExportMeta`. model: an ``openvino.Model``.
        out: the new directory (must not exist). record: what was done (for ``hllm info``).
        inference_precision: the CPU plugin's hint for the ops left in float: ``f32`` or ``bf16``
            (:func:`hllm.engines.openvino.check_inference_precision`).
        ir_name: the IR file name. dynamic_group_size: the CPU plugin's ``DYNAMIC_QUANTIZATION_GROUP_SIZE``
            the engine compiles with (None = not set).
    Raises: EngineError if ``out`` exists; OSError from writing.
    """
    import openvino as ov

    if out.exists():
        raise EngineError(f"{out} exists; choose a new directory")
    staging = out.with_name(f".{out.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        ov.save_model(model, str(staging / ir_name), compress_to_fp16=False)
        copy_files(meta.root, staging, skip=("export.json",))
        derive_export(meta, staging, ExportChange(precision="int8", engine="openvino", quantization=record,
                                                  openvino=OpenVinoSettings(ir_name, inference_precision,
                                                                            dynamic_group_size)))
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
