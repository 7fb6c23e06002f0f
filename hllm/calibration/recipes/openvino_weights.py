"""INT8 weight compression for the OpenVINO engine, with OpenVINO's dynamic activation quantization
(the ``openvino-int8-weights`` recipe scheme).

NNCF's ``nncf.compress_weights`` (data-free) stores the MatMul weights of a ``standard`` export as 8-bit
integers, one scale per output channel (``group_size`` None: per-channel), symmetric (``INT8_SYM``, zero
point 0) or asymmetric (``INT8_ASYM``, a zero point per channel); activations stay float in the graph.
At compile time the CPU plugin's ``DYNAMIC_QUANTIZATION_GROUP_SIZE`` property quantizes the activations of
those MatMuls to 8 bits on the fly, one scale per group of that many values along the reduction axis
(32 / 64 / 128; 0 = off), so the products run on the INT8 kernels. The plugin may not apply the setting
(a CPU or kernel without the path): the value the compiled model reports
(``CompiledModel.get_property("DYNAMIC_QUANTIZATION_GROUP_SIZE")``) is read back after one compilation
and recorded beside the requested one.

The export written: the FP32 export's files plus ``model_int8w.xml`` / ``.bin`` (OpenVINO IR), and a
sidecar with ``precision: int8``, ``engine: openvino``, ``openvino: {ir, inference_precision,
dynamic_quantization_group_size}`` (the engine compiles with it) and ``quantization`` (mode, group
size requested and effective, compressed weights).

Sources: NNCF weight compression (``nncf.compress_weights``, ``nncf.CompressWeightsMode``;
docs.openvino.ai, "Weight Compression"); OpenVINO CPU plugin properties
(``openvino.properties.hint.dynamic_quantization_group_size``).
"""

from __future__ import annotations

import time
from pathlib import Path

from hllm.errors import EngineError

IR_NAME = "model_int8w.xml"
#: NNCF's INT8 weight-compression modes this scheme accepts.
MODES = ("int8_sym", "int8_asym")
#: Dynamic activation quantization group sizes (values per scale along the reduction axis).
GROUP_SIZES = (32, 64, 128)
#: The CPU plugin property that sets (and, on a compiled model, reports) the group size.
DYNAMIC_QUANTIZATION = "DYNAMIC_QUANTIZATION_GROUP_SIZE"


def effective_group_size(xml: Path, group_size: int, inference_precision: str = "f32") -> int:
    """Compile the IR ``xml`` for the CPU with ``DYNAMIC_QUANTIZATION_GROUP_SIZE = group_size`` and return
    the value the compiled model reports (``get_property``): the setting in effect, 0 = off.

    Raises: EngineError when OpenVINO cannot compile it.
    """
    return compiled_dynamic_quantization(xml, group_size, inference_precision)[0]


def compile_dynamic(model, group_size: int, inference_precision: str = "f32"):
    """``model`` (an IR / ONNX path or an ``openvino.Model``) compiled for the CPU with
    ``DYNAMIC_QUANTIZATION_GROUP_SIZE = group_size`` and ``INFERENCE_PRECISION_HINT = inference_precision``
    (the compiling thread's alternate signal stack dropped: :func:`hllm.engines.openvino.drop_signal_stack`).

    Raises: EngineError when OpenVINO cannot compile it.
    """
    import openvino as ov

    from hllm.engines.openvino import drop_signal_stack

    try:
        return ov.Core().compile_model(str(model) if isinstance(model, Path) else model, "CPU",
                                       {DYNAMIC_QUANTIZATION: int(group_size),
                                        "INFERENCE_PRECISION_HINT": inference_precision})
    except Exception as e:
        raise EngineError(f"OpenVINO cannot compile {model if isinstance(model, (Path, str)) else 'the model'} with "
                          f"{DYNAMIC_QUANTIZATION}={group_size}: {e}") from None
    finally:
        drop_signal_stack()


def compiled_dynamic_quantization(model, group_size: int, inference_precision: str = "f32") -> tuple[int, dict]:
    """Compile ``model`` (:func:`compile_dynamic`): ``(effective group size, runtime precisions)`` — the group
    the compiled model reports (0 = off) and what its kernels run (:func:`hllm.exporter.bf16.runtime_precisions`,
    e.g. ``{"FullyConnected:i8": 6, ...}``: a weight-compressed MatMul whose activations are quantized on the
    fly runs as ``FullyConnected`` in ``i8``).

    Raises: EngineError when OpenVINO cannot compile it.
    """
    from hllm.exporter.bf16 import runtime_precisions

    compiled = compile_dynamic(model, group_size, inference_precision)
    return int(compiled.get_property(DYNAMIC_QUANTIZATION)), runtime_precisions(compiled)


def compress_weights_export(export_dir, dst, mode: str = "int8_sym", group_size: int = 32,
                            inference_precision: str = "f32") -> dict:
    """Write the INT8-weight export of the FP32 ``standard`` export ``export_dir`` into the new directory
    ``dst`` (module doc). Returns the ``quantization`` record.

    Args:
        mode: ``int8_sym`` or ``int8_asym`` (:data:`MODES`). group_size: the dynamic activation
            quantization group (:data:`GROUP_SIZES`). inference_precision: OpenVINO's hint for float ops.
    Raises: EngineError for another mode, group size, flavour or precision, an existing ``dst``, or when
        NNCF compresses no weight.
    """
    import nncf
    import openvino as ov

    from hllm.calibration.recipes.openvino_int8 import nncf_input, nncf_output_to_stderr, write_int8_export
    from hllm.engines.openvino import no_signal_stack_after_compile

    if mode not in MODES:
        raise EngineError(f"weight compression mode {mode!r} is not one of {MODES}")
    if group_size not in GROUP_SIZES:
        raise EngineError(f"dynamic quantization group size {group_size!r} is not one of {GROUP_SIZES}")
    meta, out = nncf_input(export_dir, dst)
    t0 = time.perf_counter()
    model = ov.Core().read_model(str(meta.onnx_path))
    with nncf_output_to_stderr(), no_signal_stack_after_compile():
        q = nncf.compress_weights(model, mode=nncf.CompressWeightsMode(mode), group_size=None)
    compressed = sum(op.get_type_name() == "Constant" and op.get_element_type() in (ov.Type.i8, ov.Type.u8)
                     for op in q.get_ops())
    if not compressed:
        raise EngineError(f"{meta.root}: NNCF compressed no weight to 8 bits ({mode})")
    record = {"backend": "nncf-weights", "precision": "int8", "mode": mode, "granularity": "per-channel",
              "compressed_weights": compressed, "nncf": nncf.__version__, "openvino": ov.__version__,
              "dynamic_quantization": {"group_size": group_size}, "seconds": round(time.perf_counter() - t0, 1)}
    write_int8_export(meta, q, out, record, inference_precision, ir_name=IR_NAME, dynamic_group_size=group_size)
    effective = effective_group_size(out / IR_NAME, group_size, inference_precision)
    record["dynamic_quantization"]["effective_group_size"] = effective
    from hllm.formats.export import ExportChange, derive_export, read_export

    derive_export(read_export(out), out, ExportChange(quantization=record))
    return record
