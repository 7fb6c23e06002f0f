"""Quantize an exported hLLM ONNX graph: ONNX Runtime INT8 (CPU) and ModelOpt INT8 / FP8 Q/DQ (TensorRT).

Backends (sources):

* ``ort-static`` — :func:`onnxruntime.quantization.quantize_static`, QDQ format, activation ranges
  from a :class:`hllm.calibration.data.CalibrationSet` (MinMax), per-channel weights, optional
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

Only ``MatMul``/``Gemm`` are quantized by default, and in static mode only MatMuls with a constant
(weight) input: the attention score/value MatMuls, the additive masks and the norms stay float (a
quantized −inf mask gets an infinite scale; see ``shared/notes/facts.md``).

The fused ``ort-cpu`` graph (:mod:`hllm.exporter.fusion`) is quantized the same way: its contrib ops
(:data:`FLOAT_OPS`: ``GroupQueryAttention``, ``MultiHeadAttention``, ``RotaryEmbedding``, the
``(Skip)SimplifiedLayerNormalization`` norms) have no INT8 kernel, and ONNX Runtime's quantizer only
touches the op types it is given (``op_types_to_quantize``; an op type outside its QDQ registry would
get Q/DQ pairs around a float kernel, ``onnxruntime/python/tools/quantization/registry.py``), so they are
refused as op types and checked afterwards (:func:`float_ops_fed_by_quantized`). In static QDQ mode ORT
also quantizes each MatMul's *output* unless told otherwise, which would round the q/k/v inputs of
GroupQueryAttention and the residual branches to 8 bits; ``OpTypesToExcludeOutputQuantization`` keeps
them float, and ONNX Runtime runs ``DQ → MatMul`` as ``MatMulIntegerToFloat`` (u8×s8 integer GEMM,
float output) instead of ``QLinearMatMul`` → ``DequantizeLinear``.

Parts that must stay in higher precision are named, resolved to node names through the module path
the dynamo exporter stores in each node's ``pkg.torch.onnx.name_scopes`` metadata:

``head`` (scoring head), ``norms``, ``attention`` (``*.self_attn``), ``mlp``, ``first`` / ``last``
(first / last decoder block), ``block:I`` (block I, negative from the end), or any module path
prefix such as ``backbone.layers.3.mlp.down_proj``, or an exact node name.
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from hllm.errors import EngineError, ExportError, HllmError
from hllm.formats.precision import Precision

BACKENDS = ("ort-static", "ort-dynamic", "ort-weight-only", "modelopt")
PRECISIONS = (Precision.INT8, Precision.FP8)
DEFAULT_OP_TYPES = ("MatMul", "Gemm")
QUANT_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger",
             "QLinearMatMul", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QGemm", "MatMulNBits"}
_ROUNDED_OUTPUT_OPS = {"DequantizeLinear", "QuantizeLinear", "DynamicQuantizeLinear", "QLinearMatMul"}
_BLOCK_RE = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")
_NORM_OPS = {"LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization",
             "SkipSimplifiedLayerNormalization"}
#: Op types of the fused ``ort-cpu`` graph that must stay float: ONNX Runtime has no INT8 kernel for them
#: (``com.microsoft`` attention / rotary, the fused norms); never quantized, never fed by a Q/DQ pair.
FLOAT_OPS = frozenset({"GroupQueryAttention", "MultiHeadAttention", "Attention", "RotaryEmbedding",
                       "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "SkipLayerNormalization"})

MODELOPT_HINT = (
    "NVIDIA ModelOpt is not importable in this environment: install the optional extra "
    "`pip install 'hllm[modelopt]'` (nvidia-modelopt[onnx]; it pins onnx and onnxruntime-gpu, so use a "
    "separate venv, e.g. `python -m venv .venv-modelopt && .venv-modelopt/bin/pip install -e '.[modelopt]'`) "
    "and run `hllm calibrate` from there"
)


class NothingToQuantize(EngineError):
    """The options left no node to quantize (every candidate excluded or no matching op type)."""


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
        exclude: part names kept in float (see module docstring).
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
    from hllm.engines.tensorrt.targets import compute_capability

    cc = compute_capability(target)
    if precision == Precision.FP8:
        if cc is None:
            raise EngineError("fp8 needs a GPU target with compute capability ≥ 8.9 (Ada, Hopper); got cpu")
        if cc < (8, 9):
            raise EngineError(
                f"fp8 is not supported on target {target} (compute capability {cc[0]}.{cc[1]}): FP8 tensor cores need "
                "compute capability ≥ 8.9 (Ada L4/L40S, Hopper H100/H200). Use --precision int8 for an A100."
            )


# -- graph inspection ------------------------------------------------------------------------------

def module_path(node) -> str:
    """The PyTorch module path a node came from (``backbone.layers.0.mlp.up_proj``), or ``""``.

    Read from the dynamo exporter's ``pkg.torch.onnx.name_scopes`` node metadata (a list of scopes,
    the last one being the op itself).
    """
    for p in node.metadata_props:
        if p.key == "pkg.torch.onnx.name_scopes":
            try:
                scopes = ast.literal_eval(p.value)
            except (ValueError, SyntaxError):
                return ""
            mods = [s for s in scopes[:-1] if s]
            return mods[-1] if mods else ""
    return ""


def _is_norm(node, path: str) -> bool:
    if node.op_type in _NORM_OPS:
        return True
    last = path.rsplit(".", 1)[-1]
    return "norm" in last.lower()


def num_blocks(model) -> int:
    """Number of decoder blocks (``layers.I`` module paths) in the graph."""
    idx = [int(m.group(1)) for n in model.graph.node if (m := _BLOCK_RE.search(module_path(n)))
           and not module_path(n).startswith("head")]
    return max(idx) + 1 if idx else 0


def nodes_in_part(model, part: str) -> list[str]:
    """Names of the nodes belonging to ``part`` (see module docstring for the part names).

    Raises: EngineError if the part matches no node (a typo must not silently quantize everything).
    """
    nodes = list(model.graph.node)
    paths = {n.name: module_path(n) for n in nodes}
    if not any(paths.values()) and part not in {n.name for n in nodes}:
        raise EngineError(
            f"cannot resolve part {part!r}: the graph carries no module metadata (export it with `hllm export`); "
            "pass node names instead"
        )
    L = num_blocks(model)

    def block(i: int) -> Callable:
        i = i + L if i < 0 else i
        return lambda n, p: not p.startswith("head") and (m := _BLOCK_RE.search(p)) is not None and int(m.group(1)) == i

    if part == "head":
        pred = lambda n, p: p == "head" or p.startswith("head.")  # noqa: E731
    elif part == "norms":
        pred = _is_norm
    elif part == "attention":
        pred = lambda n, p: ".self_attn" in p and not p.startswith("head")  # noqa: E731
    elif part == "mlp":
        pred = lambda n, p: ".mlp" in p and not p.startswith("head")  # noqa: E731
    elif part == "first":
        pred = block(0)
    elif part == "last":
        pred = block(-1)
    elif part.startswith("block:"):
        try:
            i = int(part.split(":", 1)[1])
        except ValueError:
            raise EngineError(f"bad part {part!r}: expected block:INDEX") from None
        if not -L <= i < L:
            raise EngineError(f"part {part!r}: the graph has {L} blocks")
        pred = block(i)
    else:
        pred = lambda n, p: n.name == part or p == part or p.startswith(part + ".")  # noqa: E731
    out = [n.name for n in nodes if pred(n, paths[n.name])]
    if not out:
        raise EngineError(f"part {part!r} matches no node of the graph")
    return out


def excluded_nodes(model, options: QuantOptions) -> list[str]:
    """Node names to keep in float for ``options`` (parts resolved + explicit names), sorted, unique.

    Raises: EngineError for an unknown node name, a part that matches nothing, or parts asked of a graph
        where a node to quantize (``options.op_types``) carries no module path: it could not be placed in
        any part, so an exclusion could silently miss it.
    """
    names = set(options.exclude_nodes)
    known = {n.name for n in model.graph.node}
    unknown = names - known
    if unknown:
        raise EngineError(f"exclude_nodes not in the graph: {sorted(unknown)[:5]}")
    if options.exclude:
        blind = [n.name for n in model.graph.node if n.op_type in options.op_types and not module_path(n)]
        if blind:
            raise EngineError(f"{len(blind)} {'/'.join(options.op_types)} nodes carry no module path "
                              f"({', '.join(blind[:3])}): parts cannot be resolved on this graph; pass node names "
                              "(--exclude-node) or re-export with `hllm export`")
    for part in options.exclude:
        names.update(nodes_in_part(model, part))
    return sorted(names)


def activation_matmuls(model, op_types: Sequence[str] = DEFAULT_OP_TYPES) -> list[str]:
    """Names of ``op_types`` nodes none of whose inputs is a constant (initializer or Constant output):
    activation × activation products such as attention scores ``Q·Kᵀ`` and ``P·V``."""
    consts = {i.name for i in model.graph.initializer}
    consts |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    return [n.name for n in model.graph.node if n.op_type in op_types and not any(i in consts for i in n.input)]


def weight_matmuls(model, op_types: Sequence[str] = DEFAULT_OP_TYPES) -> list:
    """The ``op_types`` nodes with a constant input (the weight projections the INT8 backends quantize),
    in graph order; the complement of :func:`activation_matmuls`."""
    act = set(activation_matmuls(model, op_types))
    return [n for n in model.graph.node if n.op_type in op_types and n.name not in act]


def float_ops_fed_by_quantized(model) -> list[str]:
    """Names of the :data:`FLOAT_OPS` nodes (contrib attention, rotary, fused norms) of a quantized graph
    that read a tensor rounded to 8 bits (output of ``DequantizeLinear``, ``QLinearMatMul`` …; the float
    outputs of ``MatMulInteger`` → scale, ``MatMulIntegerToFloat`` or ``MatMulNBits`` are not rounded).
    Empty for a graph whose contrib ops all run on unrounded float tensors."""
    producer = {o: n for n in model.graph.node for o in n.output}
    return [n.name for n in model.graph.node if n.op_type in FLOAT_OPS and any(
        (p := producer.get(i)) is not None and p.op_type in _ROUNDED_OUTPUT_OPS for i in n.input)]


def quantized_nodes(model) -> list[str]:
    """Names of the compute nodes that run quantized: ``MatMul``/``Gemm`` with an input produced by a
    ``DequantizeLinear`` (QDQ format) and integer compute ops (``MatMulInteger``, ``QLinearMatMul`` …,
    QOperator / dynamic format)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    integer_ops = QUANT_OPS - {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}
    out = []
    for n in model.graph.node:
        if n.op_type in integer_ops or (n.op_type in ("MatMul", "Gemm") and any(
            (p := producer.get(i)) is not None and p.op_type == "DequantizeLinear" for i in n.input
        )):
            out.append(n.name)
    return out


def qdq_summary(model) -> dict:
    """Counts of quantization ops in a graph: ``{op_type: count}`` for QUANT_OPS, plus ``quantized_nodes``."""
    counts: dict[str, int] = {}
    for n in model.graph.node:
        if n.op_type in QUANT_OPS:
            counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return {"ops": counts, "quantized_nodes": len(quantized_nodes(model))}


# -- ONNX Runtime --------------------------------------------------------------------------------

def calibration_reader(calib):
    """An ``onnxruntime.quantization.CalibrationDataReader`` over a CalibrationSet's batches (one feed dict
    per ``get_next``, :func:`hllm.formats.graph.feed_dict` over the set's inputs; also ``rewind``,
    ``set_range`` for ORT and ``get_first`` for ModelOpt)."""
    from onnxruntime.quantization import CalibrationDataReader

    from hllm.formats.graph import feed_dict

    names = calib.inputs

    class _Reader(CalibrationDataReader):
        def __init__(self, batches):
            self.batches = list(batches)
            self.start, self.end = 0, len(self.batches)
            self.i = 0

        def get_next(self):
            if self.start + self.i >= self.end:
                return None
            b = self.batches[self.start + self.i]
            self.i += 1
            return feed_dict(names, b)

        def get_first(self):  # ModelOpt runs one test batch with it (modelopt.onnx graph_utils)
            return feed_dict(names, self.batches[self.start])

        def rewind(self):
            self.i = 0

        def __len__(self):
            return len(self.batches)

        def set_range(self, start_index, end_index):
            self.start, self.end, self.i = start_index, end_index, 0

    return _Reader(calib.batches)


@contextlib.contextmanager
def source_view(src: Path, where: Path) -> Iterator[Path]:
    """The graph ``src`` seen through symbolic links in ``where`` (the graph file and its external-data
    files ``src.name*``), removed afterwards.

    ONNX Runtime's quantizers run shape inference into ``<graph>-inferred.onnx`` BESIDE the graph they
    are given (``onnxruntime.quantization.quant_utils.load_model_with_shape_infer``), which would write a
    full copy of the graph into the input export (failing on a read-only export, deleting a user's file
    of that name). Given this view, they write into ``where`` (inside the output's staging directory).
    """
    where.mkdir(parents=True, exist_ok=True)
    try:
        for p in src.parent.iterdir():
            if p.name.startswith(src.name) and p.is_file():
                (where / p.name).symlink_to(p.resolve())
        yield where / src.name
    finally:
        shutil.rmtree(where, ignore_errors=True)


def _external(model_path: Path) -> bool:
    return model_path.stat().st_size > 1_900_000_000 or any(
        p.name != model_path.name and p.name.startswith(model_path.name) for p in model_path.parent.iterdir()
    )


def quantize_ort(src: Path, dst: Path, options: QuantOptions, calib=None, exclude: Sequence[str] = (),
                 cache_path: Path | None = None) -> None:
    """ONNX Runtime INT8 quantization of ``src`` into ``dst`` (static QDQ or dynamic).

    Args:
        src, dst: FP32 and output ``.onnx`` paths.
        options: backend ``ort-static`` (needs ``calib``), ``ort-dynamic`` or ``ort-weight-only``.
        calib: a :class:`hllm.calibration.data.CalibrationSet` (static).
        exclude: node names kept in float.
        cache_path: ORT calibration cache (JSON of tensor ranges): written on first use, reused after,
            so re-quantizing with other exclusions skips the calibration runs.
    Raises: EngineError (no calibration data for static; ORT failure).
    """
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_dynamic, quantize_static

    ext = _external(src)
    if options.backend == "ort-weight-only":
        _quantize_weight_only(src, dst, options, exclude, ext)
        return
    act = QuantType.QUInt8 if options.activation_type == "uint8" else QuantType.QInt8
    try:
        if options.backend == "ort-dynamic":
            quantize_dynamic(src, dst, op_types_to_quantize=list(options.op_types), per_channel=options.per_channel,
                             reduce_range=options.reduce_range, weight_type=QuantType.QInt8,
                             nodes_to_exclude=list(exclude), use_external_data_format=ext,
                             extra_options={"MatMulConstBOnly": True})
            return
        if calib is None and not (cache_path and Path(cache_path).is_file()):
            raise EngineError("static INT8 needs calibration data (--calibration or --calib-slates)")
        methods = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
                   "percentile": CalibrationMethod.Percentile}
        if options.calibrate_method not in methods:
            raise EngineError(f"ORT calibrate_method must be one of {list(methods)}, got {options.calibrate_method!r}")
        quantize_static(
            src, dst, calibration_reader(calib) if calib is not None else None,
            quant_format=QuantFormat.QDQ, op_types_to_quantize=list(options.op_types),
            per_channel=options.per_channel, reduce_range=options.reduce_range,
            activation_type=act, weight_type=QuantType.QInt8, nodes_to_exclude=list(exclude),
            use_external_data_format=ext, calibrate_method=methods[options.calibrate_method],
            calibration_cache_path=cache_path,
            # MatMul outputs stay float (module docstring): ORT runs MatMulIntegerToFloat, and the contrib ops
            # and residual adds after a MatMul read unrounded values
            extra_options={"MatMulConstBOnly": True, "OpTypesToExcludeOutputQuantization": list(options.op_types)},
        )
    except HllmError:
        raise
    except Exception as e:
        raise EngineError(f"ONNX Runtime quantization failed: {type(e).__name__}: {e}") from None


def _quantize_weight_only(src: Path, dst: Path, options: QuantOptions, exclude: Sequence[str], ext: bool) -> None:
    """Rewrite every ``MatMul`` with a constant weight (not in ``exclude``) of ``src`` as ``MatMulNBits``
    with 8-bit symmetric block-wise weights into ``dst`` (run on CPU by the pinned ONNX Runtime 1.32).

    Raises: EngineError if ONNX Runtime's quantizer fails (message names the cause).
    """
    import logging

    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    log = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    level = log.level
    log.setLevel(logging.WARNING)  # it logs every node at INFO
    try:
        q = MatMulNBitsQuantizer(onnx.load(str(src)), bits=8, block_size=options.block_size, is_symmetric=True,
                                 accuracy_level=options.accuracy_level or None, nodes_to_exclude=list(exclude),
                                 op_types_to_quantize=("MatMul",))
        q.process()
        q.model.save_model_to_file(str(dst), use_external_data_format=ext)
    except Exception as e:
        raise EngineError(f"ONNX Runtime weight-only quantization failed: {type(e).__name__}: {e}") from None
    finally:
        log.setLevel(level)


def calibration_ranges(cache_path: Path) -> dict[str, float]:
    """``{tensor: max |value|}`` from an ORT calibration cache (the activation range seen in calibration)."""
    from onnxruntime.quantization.calibrate import load_tensors_data

    data = load_tensors_data(cache_path)
    out = {}
    for name, td in data.data.items():
        lo, hi = td.range_value
        out[name] = float(max(abs(np.asarray(lo).max()), abs(np.asarray(hi).max())))
    return out


# -- ModelOpt -----------------------------------------------------------------------------------

def modelopt_available() -> bool:
    """True when ``modelopt.onnx.quantization`` can be imported here."""
    try:
        import modelopt.onnx.quantization  # noqa: F401
    except Exception:
        return False
    return True


def quantize_modelopt(src: Path, dst: Path, options: QuantOptions, calib, exclude: Sequence[str] = ()) -> None:
    """ModelOpt ONNX PTQ: explicit INT8 or FP8 Q/DQ for TensorRT, other tensors kept in FP32.

    Raises: EngineError (ModelOpt not importable: names the extra / venv; no calibration data; failure).
    """
    if not modelopt_available():
        raise EngineError(MODELOPT_HINT)
    if calib is None:
        raise EngineError("ModelOpt PTQ needs calibration data (--calibration or --calib-slates)")
    from modelopt.onnx.quantization import quantize as mo_quantize

    work = dst.parent / f".{dst.stem}.modelopt-src"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    # ModelOpt rewrites its input model in place (shared/notes/facts.md): quantize a copy.
    for p in src.parent.iterdir():
        if p.is_file() and p.name.startswith(src.name):
            shutil.copy2(p, work / p.name)
    methods = {"minmax": "max", "max": "max", "entropy": "entropy"}
    if options.calibrate_method not in methods:
        raise EngineError(f"ModelOpt calibrate_method must be one of {list(methods)}, got {options.calibrate_method!r}")
    method = methods[options.calibrate_method]
    try:
        mo_quantize(
            onnx_path=str(work / src.name),
            quantize_mode=str(options.precision),
            calibration_data_reader=calibration_reader(calib),
            calibration_method=method,
            calibration_eps=["cpu"],
            op_types_to_quantize=list(options.op_types),
            # ModelOpt matches these as regular expressions: anchor them (node_linear_1 ≠ node_linear_10)
            nodes_to_exclude=[f"^{re.escape(n)}$" for n in exclude] or None,
            high_precision_dtype="fp32",
            use_external_data_format=_external(src),
            output_path=str(dst),
        )
    except HllmError:
        raise
    except Exception as e:
        raise EngineError(f"ModelOpt quantization failed: {type(e).__name__}: {e}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not dst.is_file():
        raise EngineError(f"ModelOpt wrote no model at {dst}")


# -- one quantized export ----------------------------------------------------------------------

@dataclass
class QuantResult:
    """A quantized export written to ``out_dir`` (``model.onnx`` + ``export.json`` + ``tokenizer.json``).

    Attributes:
        out_dir: the export directory (loadable by ``Ranker.from_path``).
        excluded_nodes: node names kept in float.
        excluded_parts: the part names that produced them.
        summary: :func:`qdq_summary` of the written graph.
        seconds: wall time of the quantization step.
    """

    out_dir: Path
    excluded_nodes: list[str]
    excluded_parts: list[str]
    summary: dict
    seconds: float
    options: dict = field(default_factory=dict)


def quantize_export(
    export_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    options: QuantOptions,
    calib=None,
    cache_path: Path | None = None,
) -> QuantResult:
    """Quantize an FP32 export directory into a new export directory (written atomically).

    Args:
        export_dir: output of ``hllm export`` (``export.json`` with ``precision: fp32``).
        out_dir: the quantized export to write (replaced if present).
        options: :class:`QuantOptions`.
        calib: :class:`hllm.calibration.data.CalibrationSet` (static / ModelOpt).
        cache_path: ORT calibration cache path (static).
    Returns: :class:`QuantResult`. The sidecar ``export.json`` gets ``precision`` (``int8``/``fp8``),
        ``quantization`` (backend, options, excluded nodes, ``source_flavour``, calibration record) and a
        new ``onnx_sha256``; ``flavour`` stays the source's (the ``ort-cpu`` contrib ops are kept).
    Raises: EngineError (ModelOpt asked of an ``ort-cpu`` export: TensorRT cannot parse its contrib ops;
        a contrib op left reading quantized values, :func:`float_ops_fed_by_quantized`) / ExportError.
    """
    import onnx

    from hllm.files import atomic_dir, sha256_file
    from hllm.formats.export import graph_bytes, read_export, write_export

    options.validate()
    export_dir = Path(export_dir)
    exp = read_export(export_dir)
    if exp.precision is not Precision.FP32:
        raise ExportError(f"{export_dir} is already {exp.precision}: quantize the FP32 export")
    if options.backend == "modelopt" and exp.flavour != "standard":
        raise EngineError(f"{export_dir} is the {exp.flavour} flavour (ONNX Runtime contrib ops TensorRT cannot "
                          "parse): ModelOpt Q/DQ for TensorRT needs `hllm export --flavour standard`")
    meta = exp.raw
    src = exp.onnx_path
    model = onnx.load(str(src), load_external_data=False)
    exclude = excluded_nodes(model, options)
    act_mm = activation_matmuls(model, options.op_types) if options.weight_matmuls_only else []
    del model
    t0 = time.perf_counter()
    with atomic_dir(out_dir, overwrite=True) as tmp:
        dst = tmp / "model.onnx"
        if options.backend == "modelopt":
            quantize_modelopt(src, dst, options, calib, sorted(set(exclude) | set(act_mm)))
        else:
            with source_view(src, tmp / ".source") as view:
                quantize_ort(view, dst, options, calib, sorted(set(exclude) | set(act_mm)), cache_path)
        shutil.copy2(exp.tokenizer_path, tmp / "tokenizer.json")
        qmodel = onnx.load(str(dst), load_external_data=False)
        summary = qdq_summary(qmodel)
        rounded = float_ops_fed_by_quantized(qmodel)
        del qmodel
        if not summary["quantized_nodes"]:
            raise NothingToQuantize("quantization produced no quantized node (check op types and exclusions)")
        if rounded:
            raise EngineError(f"{len(rounded)} float-only ops ({', '.join(rounded[:3])}) would read 8-bit rounded "
                              "inputs: keep the nodes that feed them in float (--exclude-node)")
        seconds = time.perf_counter() - t0
        q = {
            "backend": options.backend,
            "options": options.to_dict(),
            "excluded_parts": list(options.exclude),
            "excluded_nodes": exclude,
            "float_activation_matmuls": act_mm,
            "summary": summary,
            "source_export": str(export_dir),
            "source_flavour": exp.flavour,
            "source_onnx_sha256": meta.get("onnx_sha256"),
            "seconds": round(seconds, 1),
        }
        if calib is not None:
            q["calibration"] = {k: calib.meta.get(k) for k in
                                ("source", "source_sha256", "seed", "count", "batch_size", "data_sha256")}
        new_meta = {**meta, "onnx": "model.onnx", "tokenizer": "tokenizer.json", "precision": str(options.precision),
                    "onnx_sha256": sha256_file(dst), "onnx_bytes": graph_bytes(dst), "quantization": q}
        write_export(tmp, new_meta)
    return QuantResult(Path(out_dir), exclude, list(options.exclude), summary, seconds, options.to_dict())


# -- automatic exclusion -----------------------------------------------------------------------

def sensitivity_ladder(model, ranges: dict[str, float] | None = None) -> list[str]:
    """Parts to keep in float, most sensitive first, for the automatic mode.

    ``head`` first (it writes the scores directly), then decoder blocks. With calibration ranges
    (ORT cache) the blocks are ordered by the largest activation magnitude entering their quantized
    MatMuls (per-tensor INT8 activation scales grow with it, so the rounding step is coarsest
    there); without, from the ends inward (last, first, second-to-last, second …).
    """
    L = num_blocks(model)
    ladder = ["head"] if any(module_path(n).startswith("head") for n in model.graph.node) else []
    if L == 0:
        return ladder
    if ranges:
        score = {i: 0.0 for i in range(L)}
        for n in model.graph.node:
            p = module_path(n)
            m = _BLOCK_RE.search(p)
            if n.op_type in DEFAULT_OP_TYPES and m and not p.startswith("head"):
                score[int(m.group(1))] = max(score[int(m.group(1))], *(ranges.get(i, 0.0) for i in n.input))
        blocks = sorted(range(L), key=lambda i: -score[i])
    else:
        blocks = []
        lo, hi = 0, L - 1
        while lo <= hi:
            blocks.append(hi)
            if lo != hi:
                blocks.append(lo)
            lo, hi = lo + 1, hi - 1
    return ladder + [f"block:{i}" for i in blocks]


def auto_exclude(
    attempt: Callable[[tuple[str, ...]], tuple[bool, dict]],
    ladder: Iterable[str],
    start: tuple[str, ...] = (),
    max_tries: int = 6,
) -> tuple[bool, tuple[str, ...], list[dict]]:
    """Try ``start``, then add the next part of ``ladder`` each time until ``attempt`` passes.

    Args:
        attempt: callable(excluded parts) → (passed, record); quantizes and gates one variant. A record
            with ``"stop": True`` ends the search (e.g. nothing left to quantize).
        ladder: parts in the order to exclude (see :func:`sensitivity_ladder`).
        start: parts excluded in every try.
        max_tries: at most this many attempts (the first has only ``start``).
    Returns: (passed, the excluded parts of the passing try, else of the last try that was evaluated
        (not stopped), one record per try).
    """
    tried: list[dict] = []
    excl = tuple(start)
    todo = [p for p in ladder if p not in excl]
    for _ in range(max_tries):
        ok, rec = attempt(excl)
        tried.append({"excluded": list(excl), "passed": ok, **rec})
        if ok:
            return True, excl, tried
        if not todo or rec.get("stop"):
            break
        excl = excl + (todo.pop(0),)
    evaluated = [t for t in tried if not t.get("stop")]
    return False, tuple(evaluated[-1]["excluded"]) if evaluated else tuple(start), tried
