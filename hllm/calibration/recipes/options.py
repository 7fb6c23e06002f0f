"""What to quantize and how: the options of ``hllm calibrate`` and the checks that refuse bad ones.

Backends (sources; the quantizers are :mod:`hllm.calibration.recipes.ort_quantize` and
:mod:`hllm.calibration.recipes.modelopt_ptq`):

* ``ort-static`` — :func:`onnxruntime.quantization.quantize_static`, QDQ format, activation ranges
  from a :class:`hllm.formats.calibration_set.CalibrationSet` (MinMax), per-channel weights, optional
  ``reduce_range`` (7-bit weights: needed on AVX2 machines without VNNI to avoid overflow in the
  u8×s8 kernels, ORT quantization guide, "When and why do I need to try U8U8 / reduce_range").
* ``ort-dynamic`` — :func:`onnxruntime.quantization.quantize_dynamic`: weights INT8 offline,
  activations quantized per call at run time (no calibration data).
* ``ort-weight-only`` — ONNX Runtime ``MatMulNBits`` with 8-bit weights
  (:class:`onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer`, round-to-nearest,
  symmetric, one scale per ``block_size`` weights along the reduction axis); activations stay float
  (``accuracy_level`` 0/1) or are quantized to INT8 per block inside the kernel (``accuracy_level`` 4).
  No calibration data. A quarter of the FP32 weight bytes; the error is the weights' rounding only.
* ``modelopt`` — NVIDIA TensorRT Model Optimizer ONNX PTQ
  (``modelopt.onnx.quantization.quantize``, https://nvidia.github.io/TensorRT-Model-Optimizer/),
  explicit Q/DQ nodes for TensorRT, ``int8`` (compute capability ≥ 7.5, e.g. A100) or ``fp8``
  (≥ 8.9: Ada, Hopper, Blackwell; refused for an A100 target). Installed only with the
  ``hllm[modelopt]`` extra, best in its own environment (it pins onnx and onnxruntime-gpu).

Only ``MatMul``/``Gemm`` are quantized by default (:data:`DEFAULT_OP_TYPES`); the op types of
:data:`FLOAT_OPS` (the fused ``ort-cpu`` graph's contrib attention, rotary and norms) have no INT8 kernel
and are refused.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from hllm.engines.tensorrt.targets import compute_capability
from hllm.errors import EngineError
from hllm.formats.precision import Precision

BACKENDS = ("ort-static", "ort-dynamic", "ort-weight-only", "modelopt")
PRECISIONS = (Precision.INT8, Precision.FP8)
DEFAULT_OP_TYPES = ("MatMul", "Gemm")
#: Op types of the fused ``ort-cpu`` graph that must stay float: ONNX Runtime has no INT8 kernel for them
#: (``com.microsoft`` attention / rotary, the fused norms); never quantized, never fed by a Q/DQ pair.
FLOAT_OPS = frozenset({"GroupQueryAttention", "MultiHeadAttention", "Attention", "RotaryEmbedding",
                       "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "SkipLayerNormalization"})


class NothingToQuantize(EngineError):
    """The options left no node to quantize (every quantizable node excluded or no matching op type)."""


def quantizable_op_types() -> frozenset[str]:
    """The op types ONNX Runtime's quantizer has a rule for: the union of its QDQ, integer-ops and QLinear
    registries (``onnxruntime.quantization.registry``); an empty set when onnxruntime is not installed
    (nothing to check against: the quantizer then fails on its own)."""
    try:
        from onnxruntime.quantization.registry import IntegerOpsRegistry, QDQRegistry, QLinearOpsRegistry
    except ImportError:
        return frozenset()
    return frozenset(QDQRegistry) | frozenset(IntegerOpsRegistry) | frozenset(QLinearOpsRegistry)


@dataclass
class QuantOptions:
    """What to quantize and how.

    Attributes:
        backend: ``ort-static``, ``ort-dynamic``, ``ort-weight-only`` or ``modelopt``.
        precision: ``int8`` or ``fp8`` (fp8 only with ``modelopt``).
        target: ``cpu`` or a GPU name (``a100``, ``l4``, ``h100`` …) or a compute capability
            (``8.0``, ``sm89``); fp8 needs ≥ 8.9.
        per_channel: per-output-channel weight scales.
        reduce_range: 7-bit weights (ORT; AVX2 without VNNI).
        activation_type: ``uint8`` (default, ORT x86 U8S8) or ``int8`` (ORT static only).
        op_types: op types to quantize.
        exclude: part names kept in float (:mod:`hllm.calibration.recipes.parts`).
        exclude_nodes: extra node names kept in float.
        calibrate_method: ``minmax`` (ORT) / ``max`` (ModelOpt), or ``entropy``, ``percentile``.
        block_size: ``ort-weight-only``: weights sharing one scale along the reduction axis: 16, 32,
            64, 128 or 256 (the sizes ONNX Runtime's blockwise quantizer supports).
        accuracy_level: ``ort-weight-only``: ``MatMulNBits`` compute type, 0 (unset: float),
            1 (fp32), 2 (fp16), 3 (bf16) or 4 (INT8 activations per block).
        weight_matmuls_only: keep activation × activation MatMuls (attention scores and values) in
            float. ORT's ``MatMulConstBOnly`` is honoured only by the QOperator format, so for QDQ
            (static, ModelOpt) these nodes are excluded by name.
    """

    backend: str = "ort-static"
    precision: Precision = Precision.INT8
    target: str = "cpu"
    per_channel: bool = True
    reduce_range: bool = True
    activation_type: str = "uint8"
    op_types: tuple[str, ...] = DEFAULT_OP_TYPES
    exclude: tuple[str, ...] = ()
    exclude_nodes: tuple[str, ...] = ()
    calibrate_method: str = "minmax"
    weight_matmuls_only: bool = True
    block_size: int = 32
    accuracy_level: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.precision, str) and self.precision.lower() in {p.value for p in Precision}:
            self.precision = Precision.parse(self.precision)  # a string from the CLI → the enum; others: validate()

    def validate(self) -> None:
        """Raise :class:`EngineError` naming the bad option (backend, precision, target)."""
        if self.backend not in BACKENDS:
            raise EngineError(f"unknown quantization backend {self.backend!r}; one of {list(BACKENDS)}")
        if self.precision is Precision.BF16:
            from hllm.measure import bf16_support

            ok, what = bf16_support()
            raise EngineError(f"bf16 on CPU needs AVX512_BF16 or AMX; {what}. " + (
                "ONNX Runtime's CPU provider has no x86 bf16 GEMM path either: run bf16 with the PyTorch engine "
                "or a runtime with bf16 CPU kernels" if ok else "This machine cannot run a bf16 engine: use int8."))
        if self.precision not in PRECISIONS:
            raise EngineError(f"unknown precision {self.precision!r}; one of {[str(p) for p in PRECISIONS]}")
        if self.precision is Precision.FP8 and self.backend != "modelopt":
            raise EngineError("fp8 is a TensorRT (Q/DQ) format: use --backend modelopt (ONNX Runtime CPU has no fp8 kernels)")
        float_only = sorted(set(self.op_types) & FLOAT_OPS)
        if float_only:
            raise EngineError(f"op types {float_only} stay float (ONNX Runtime has no INT8 kernel for them: Q/DQ "
                              "around them would only round their inputs); quantize MatMul / Gemm")
        unknown = sorted(set(self.op_types) - quantizable_op_types()) if quantizable_op_types() else []
        if unknown or not self.op_types:
            raise EngineError(f"op types {unknown or '(none)'} cannot be quantized: ONNX Runtime's quantizer "
                              f"knows {sorted(quantizable_op_types())} (--op-type; default MatMul, Gemm)")
        if self.activation_type not in ("uint8", "int8"):
            raise EngineError(f"activation_type must be uint8 or int8, got {self.activation_type!r}")
        if self.backend == "ort-weight-only":
            if self.block_size not in (16, 32, 64, 128, 256):
                raise EngineError(f"block_size must be 16, 32, 64, 128 or 256 (MatMulNBits), got {self.block_size}")
            if "MatMul" not in self.op_types:
                raise EngineError("ort-weight-only quantizes MatMul nodes only: add --op-type MatMul")
        if self.accuracy_level not in (0, 1, 2, 3, 4):
            raise EngineError(f"accuracy_level must be 0-4, got {self.accuracy_level}")
        check_target(self.precision, self.target)

    def to_dict(self) -> dict:
        """The options as a JSON-ready dict (the ``quantization.options`` record of the sidecar)."""
        d = asdict(self)
        d["precision"] = str(self.precision)
        d["op_types"] = list(self.op_types)
        d["exclude"] = list(self.exclude)
        d["exclude_nodes"] = list(self.exclude_nodes)
        return d


def check_target(precision: "Precision | str", target: str) -> None:
    """Refuse precisions the target cannot run.

    Raises:
        EngineError: fp8 for a target below compute capability 8.9 (e.g. A100 = 8.0: no FP8 tensor
            cores; TensorRT FP8 needs Ada / Hopper or later), or fp8 for ``cpu``.
    """
    cc = compute_capability(target)
    if precision == Precision.FP8:
        if cc is None:
            raise EngineError("fp8 needs a GPU target with compute capability ≥ 8.9 (Ada, Hopper); got cpu")
        if cc < (8, 9):
            raise EngineError(
                f"fp8 is not supported on target {target} (compute capability {cc[0]}.{cc[1]}): FP8 tensor cores need "
                "compute capability ≥ 8.9 (Ada L4/L40S, Hopper H100/H200). Use --precision int8 for an A100."
            )

