"""Mixed precision for the OpenVINO engine: INT8 MLP matrix products, fp32 attention and head, bf16 elsewhere
(the ``openvino-mixed-int8-mlp`` recipe scheme; also the graph of every try of the sensitivity search,
:mod:`hllm.calibration.recipes.int8_search`).

Each matrix product of a ``standard`` export gets one of three precisions, decided from the module paths
the exporter stores on the nodes (:mod:`hllm.calibration.recipes.parts`):

1. **int8** — the weight matrix products of ``int8`` parts (default ``mlp``: ``gate_proj`` / ``up_proj`` /
   ``down_proj`` of every decoder layer) less those of ``keep`` parts. ``nncf.compress_weights`` (data-free,
   ``INT8_SYM``, one scale per output channel) stores their weights as 8-bit integers; its
   ``nncf.IgnoredScope`` names every other weight matrix product and the embedding tables, so nothing else
   is compressed. At compile time the CPU plugin's ``DYNAMIC_QUANTIZATION_GROUP_SIZE`` quantizes their
   activations on the fly (one scale per group of 32 values along the reduction axis), so these products
   run on the INT8 kernels: the compiled model lists them as ``FullyConnected`` in ``i8``
   (:func:`hllm.calibration.recipes.openvino_weights.compiled_dynamic_quantization`; the effective group the
   plugin reports and the runtime INT8 GEMM count are recorded).
2. **fp32** — the islands ``fp32`` (default
   :data:`hllm.calibration.precision_search.bf16_islands.RECIPE_ISLANDS`: q/k/v/o projections, the
   attention scores QKᵀ / PV and the scoring head) and every op that is no matrix product (RMSNorm, the
   rotary position math, softmax, residual adds): the graph is compiled with ``INFERENCE_PRECISION_HINT=f32``.
3. **bf16** — every other matrix product (e.g. an MLP kept out of INT8 by ``keep``): the explicitly typed
   bf16 graph of :mod:`hllm.exporter.bf16` (the mechanism of the ``openvino-bf16-islands`` recipe), on a CPU
   with AVX512_BF16 / AMX-BF16. ``float_precision="fp32"`` (a CPU without them) keeps these in fp32 too.
   With the defaults every MLP product is INT8, so the bf16 and fp32 variants differ only once parts are
   kept out of INT8 (the search keeps the most sensitive layers' MLPs in bf16).

Why weight compression + dynamic activation quantization, not ``nncf.quantize`` restricted to the MLP:
static INT8 quantizes each activation tensor with one scale measured on calibration slates, and on the real
model static INT8 everywhere failed the ranking gate badly (mean Kendall tau 0.65). The MLP's ``down_proj``
reads ``SiLU(gate)·up``, the activation with the strongest outlier channels of a decoder layer (Xiao et al.
2023, "SmoothQuant", §3), where one per-tensor scale is coarsest; the dynamic scales are computed per token
and per group of 32 values at run time, so an outlier only coarsens its own group, and no calibration data
(nor its statistics passes, minutes on 2 cores) is needed. NNCF's accuracy control is not available for
weight compression (``nncf.quantize_with_accuracy_control`` drives ``nncf.quantize`` only); the bounded
search of :mod:`hllm.calibration.recipes.int8_search` plays its part.

The export written: the FP32 export's files plus ``model_mixed.xml`` / ``.bin`` (OpenVINO IR) and a sidecar
with ``precision: int8``, ``engine: openvino``, ``openvino: {ir, inference_precision: f32,
dynamic_quantization_group_size}`` and ``quantization`` (:func:`build_mixed_export`).

Sources: NNCF weight compression (``nncf.compress_weights``, ``nncf.CompressWeightsMode``; docs.openvino.ai,
"Weight Compression") and ``nncf.IgnoredScope`` (NNCF API reference); OpenVINO CPU plugin, "Dynamic
quantization" (``DYNAMIC_QUANTIZATION_GROUP_SIZE``, ``openvino.properties.hint.dynamic_quantization_group_size``);
OpenVINO "Precision Control" (``INFERENCE_PRECISION_HINT``).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Sequence

from hllm.calibration.precision_search.bf16_islands import RECIPE_ISLANDS
from hllm.calibration.recipes.parts import nodes_in_part, weight_matmuls
from hllm.errors import EngineError

IR_NAME = "model_mixed.xml"
#: Precisions of the matrix products that are neither INT8 nor fp32 islands.
FLOAT_PRECISIONS = ("bf16", "fp32")
#: Parts quantized to INT8 by default: every decoder layer's MLP.
DEFAULT_INT8 = ("mlp",)
#: Ops that turn an 8-bit weight constant into the float weight a MatMul reads (NNCF's decompression
#: subgraph: Convert, minus the zero point, times the scale; reshapes of grouped scales).
_DECOMPRESSION_OPS = {"Convert", "Subtract", "Multiply", "Reshape", "Transpose", "Unsqueeze"}


def int8_matmuls(model, int8_parts: Sequence[str] = DEFAULT_INT8, keep: Sequence[str] = ()) -> list[str]:
    """ONNX node names of the weight matrix products to quantize, in graph order: those of ``int8_parts``
    less those of ``keep`` (part names: :func:`hllm.calibration.recipes.parts.nodes_in_part`).

    Args: model: the FP32 ``onnx.ModelProto``. int8_parts / keep: part names (``mlp``, ``block:3``,
        ``backbone.layers.3.mlp`` …).
    Raises: EngineError for a part that matches no node, an ``int8`` part without a weight matrix product,
        a ``keep`` part that keeps none of the INT8 products, or nothing left to quantize.
    """
    weights = [n.name for n in weight_matmuls(model)]
    chosen: set[str] = set()
    for part in int8_parts:
        got = set(nodes_in_part(model, part)) & set(weights)
        if not got:
            raise EngineError(f"INT8 part {part!r} holds no weight matrix product")
        chosen |= got
    for part in keep:
        got = set(nodes_in_part(model, part)) & chosen
        if not got:
            raise EngineError(f"kept part {part!r} keeps none of the INT8 matrix products (of {list(int8_parts)})")
        chosen -= got
    if not chosen:
        raise EngineError(f"every INT8 matrix product of {list(int8_parts)} is kept in float: nothing to quantize")
    return [n for n in weights if n in chosen]


def check_fp32_islands(model, islands: Sequence[str]) -> tuple[str, ...]:
    """``islands`` parsed and checked against the graph: each must name a matrix product of ``model``
    (an op class present in the graph, or a module path containing one).

    Raises: ExportError (unknown island, module path without a matrix product), EngineError (an op class
        that no matrix product of the graph has).
    """
    from hllm.exporter.bf16 import check_islands, node_site

    isl = check_islands(model, islands)
    classes = {node_site(n)[0] for n in model.graph.node if n.op_type in ("MatMul", "Gemm")}
    missing = [x for x in isl if x != "all" and "." not in x and x not in classes]
    if missing:
        raise EngineError(f"fp32 island(s) {missing} match no matrix product of the graph (it has {sorted(c for c in classes if c)})")
    return isl


#: The suffix OpenVINO's ONNX frontend gives a matrix product whose bias it split off (``Gemm`` / ``MatMul`` + ``Add``).
_NO_BIAS = "/WithoutBiases"


def _onnx_name(ov_name: str) -> str:
    """The ONNX node name of an OpenVINO ``MatMul`` (``node_linear_7/WithoutBiases`` → ``node_linear_7``)."""
    return ov_name.removesuffix(_NO_BIAS)


def _ignored(model, ov_model, int8: Sequence[str]) -> list[str]:
    """What NNCF must leave alone, named as in the OpenVINO model ``ov_model``: every ``MatMul`` not in
    ``int8`` (ONNX names; a biased product is ``NAME/WithoutBiases`` there) and the embedding tables (``Gather``
    of an initializer of the ONNX ``model``, which ``compress_weights`` compresses too)."""
    keep = set(int8)
    inits = {i.name for i in model.graph.initializer}
    gathers = {n.name for n in model.graph.node if n.op_type == "Gather" and n.input and n.input[0] in inits}
    return [op.get_friendly_name() for op in ov_model.get_ops()
            if (op.get_type_name() == "MatMul" and _onnx_name(op.get_friendly_name()) not in keep)
            or (op.get_type_name() == "Gather" and op.get_friendly_name() in gathers)]


def compressed_matmuls(model) -> list[str]:
    """Names of the ``MatMul`` ops of an ``openvino.Model`` that read an 8-bit (``i8`` / ``u8``) constant
    through a decompression subgraph (the products ``compress_weights`` quantized)."""
    import openvino as ov

    def int8_const(node, depth: int = 5) -> bool:
        t = node.get_type_name()
        if t == "Constant":
            return node.get_element_type() in (ov.Type.i8, ov.Type.u8)
        return depth > 0 and t in _DECOMPRESSION_OPS and any(
            int8_const(node.input_value(i).get_node(), depth - 1) for i in range(node.get_input_size()))

    return [op.get_friendly_name() for op in model.get_ops() if op.get_type_name() == "MatMul"
            and any(int8_const(op.input_value(i).get_node()) for i in range(op.get_input_size()))]


def mixed_model(onnx_model, onnx_path: Path, int8: Sequence[str], fp32_islands: Sequence[str],
                float_precision: str, tmp: Path, mode: str = "int8_sym"):
    """The mixed ``openvino.Model`` (module doc) and the bf16 conversion report (None for ``fp32``).

    Args:
        onnx_model / onnx_path: the FP32 graph, in memory and on disk. int8: node names to quantize
            (:func:`int8_matmuls`; empty: the float graph, NNCF not run). fp32_islands: islands kept fp32 (checked by :func:`check_fp32_islands`).
        float_precision: ``bf16`` or ``fp32`` for the other products. tmp: a scratch directory that must
            outlive the returned model (OpenVINO may map the typed graph's weights from it).
        mode: ``int8_sym`` / ``int8_asym`` (:data:`hllm.calibration.recipes.openvino_weights.MODES`).
    Raises: EngineError (NNCF fails, or quantizes other products than ``int8``).
    """
    import nncf
    import openvino as ov

    from hllm.calibration.recipes.openvino_int8 import nncf_output_to_stderr
    from hllm.engines.openvino import no_signal_stack_after_compile
    from hllm.exporter.bf16 import convert_to_bf16, node_site
    from hllm.exporter.onnx_io import save_onnx

    rep = None
    path = onnx_path
    if float_precision == "bf16":
        sites = [node_site(n)[1] for n in onnx_model.graph.node if n.name in set(int8)]
        typed, r = convert_to_bf16(onnx_model, tuple(dict.fromkeys([*fp32_islands, *sites])))
        rep = r.to_dict()
        path = Path(tmp) / "typed.onnx"
        save_onnx(typed, path)
    model = ov.Core().read_model(str(path))
    if not int8:  # the float graph alone (the search's baseline)
        return model, rep
    try:
        with nncf_output_to_stderr(), no_signal_stack_after_compile():
            q = nncf.compress_weights(model, mode=nncf.CompressWeightsMode(mode), group_size=None,
                                      ignored_scope=nncf.IgnoredScope(names=_ignored(onnx_model, model, int8)))
    except Exception as e:
        raise EngineError(f"NNCF weight compression failed: {type(e).__name__}: {e}") from None
    got = [_onnx_name(n) for n in compressed_matmuls(q)]
    if sorted(got) != sorted(int8):
        raise EngineError(f"NNCF compressed {len(got)} matrix products, expected the {len(int8)} INT8 ones "
                          f"(extra: {sorted(set(got) - set(int8))[:3]}, missing: {sorted(set(int8) - set(got))[:3]})")
    return q, rep


def build_mixed_export(export_dir, dst, int8: Sequence[str] = DEFAULT_INT8, keep: Sequence[str] = (),
                       fp32: Sequence[str] = RECIPE_ISLANDS, float_precision: str = "bf16",
                       mode: str = "int8_sym", group_size: int = 32, extra: dict | None = None) -> dict:
    """Write the mixed export (module doc) of the FP32 ``standard`` export ``export_dir`` into the new
    directory ``dst``. Returns the ``quantization`` record of its sidecar.

    Args:
        int8 / keep: parts quantized to INT8 and parts of them kept in float (:func:`int8_matmuls`).
        fp32: islands kept fp32 (:mod:`hllm.exporter.bf16` names: op classes, module paths).
        float_precision: ``bf16`` (needs AVX512_BF16 / AMX-BF16) or ``fp32`` for the remaining products.
        mode: NNCF's INT8 weight mode (``int8_sym`` / ``int8_asym``). group_size: the dynamic activation
            quantization group (32 / 64 / 128). extra: more keys for the record (the search's).
    Returns: ``{backend, precision, mode, granularity, int8_parts, keep, fp32_islands, float_precision,
        int8_matmuls (count), int8_nodes (ONNX names), bf16_matmuls, fp32_matmuls, dynamic_quantization:
        {group_size, effective_group_size}, runtime_int8_gemms (compiled ops running i8/u8), nncf,
        openvino, seconds}``.
    Raises: EngineError (flavour / precision, ``dst`` exists, a mode / group / float precision not
        accepted, bf16 on a CPU without bf16 instructions, a part or island that matches nothing, NNCF
        failure), ExportError (an unknown island).
    """
    import nncf
    import openvino as ov

    from hllm.calibration.recipes.openvino_int8 import nncf_input, write_int8_export
    from hllm.calibration.recipes.openvino_weights import GROUP_SIZES, MODES, compiled_dynamic_quantization
    from hllm.exporter.onnx_io import load_onnx
    from hllm.formats.export import ExportChange, derive_export, read_export

    if mode not in MODES:
        raise EngineError(f"weight compression mode {mode!r} is not one of {MODES}")
    if group_size not in GROUP_SIZES:
        raise EngineError(f"dynamic quantization group size {group_size!r} is not one of {GROUP_SIZES}")
    check_float_precision(float_precision)
    meta, out = nncf_input(export_dir, dst)
    t0 = time.perf_counter()
    onnx_model = load_onnx(meta.onnx_path)
    names = int8_matmuls(onnx_model, int8, keep)
    islands = check_fp32_islands(onnx_model, fp32)
    with tempfile.TemporaryDirectory(prefix="hllm-mixed-") as tmp:
        q, rep = mixed_model(onnx_model, meta.onnx_path, names, islands, float_precision, Path(tmp), mode)
        gemms = len([n for n in onnx_model.graph.node if n.op_type in ("MatMul", "Gemm")])
        bf16 = rep["bf16_gemms"] if rep else 0
        record = {"backend": "nncf-weights-mixed", "precision": "int8", "mode": mode, "granularity": "per-channel",
                  "int8_parts": list(int8), "keep": list(keep), "fp32_islands": list(islands),
                  "float_precision": float_precision, "int8_matmuls": len(names), "int8_nodes": names,
                  "bf16_matmuls": bf16, "fp32_matmuls": gemms - len(names) - bf16,
                  "dynamic_quantization": {"group_size": group_size}, "nncf": nncf.__version__,
                  "openvino": ov.__version__, **(extra or {}), "seconds": round(time.perf_counter() - t0, 1)}
        write_int8_export(meta, q, out, record, "f32", ir_name=IR_NAME, dynamic_group_size=group_size)
    effective, runtime = compiled_dynamic_quantization(out / IR_NAME, group_size, "f32")
    record["dynamic_quantization"]["effective_group_size"] = effective
    record["runtime_int8_gemms"] = sum(v for k, v in runtime.items()
                                       if k.split(":")[0] in ("FullyConnected", "MatMul") and k.endswith((":i8", ":u8")))
    derive_export(read_export(out), out, ExportChange(quantization=record))
    return record


def check_float_precision(value: str) -> str:
    """``value`` if it is one of :data:`FLOAT_PRECISIONS` and this CPU can run it (``bf16``: AVX512_BF16 or
    AMX-BF16, :func:`hllm.measure.bf16_support`). Raises: EngineError naming the problem."""
    from hllm.measure import bf16_support

    if value not in FLOAT_PRECISIONS:
        raise EngineError(f"float precision {value!r} is not one of {FLOAT_PRECISIONS}")
    ok, what = bf16_support()
    if value == "bf16" and not ok:
        raise EngineError(f"bf16 outside the INT8 and fp32 parts needs AVX512_BF16 or AMX-BF16; {what} "
                          "(use the fp32 variant)")
    return value

