"""ONNX Runtime INT8 quantizers: static QDQ, dynamic and weight-only ``MatMulNBits`` (backends in
:mod:`hllm.calibration.recipes.options`).

The fused ``ort-cpu`` graph (:mod:`hllm.exporter.fusion`) is quantized the same way as the standard one: its
contrib ops (:data:`hllm.calibration.recipes.options.FLOAT_OPS`: ``GroupQueryAttention``, ``MultiHeadAttention``,
``RotaryEmbedding``, the ``(Skip)SimplifiedLayerNormalization`` norms) have no INT8 kernel, and ONNX Runtime's
quantizer only touches the op types it is given (``op_types_to_quantize``; an op type outside its QDQ registry
would get Q/DQ pairs around a float kernel, ``onnxruntime/python/tools/quantization/registry.py``), so they
are refused as op types and checked afterwards
(:func:`hllm.calibration.recipes.parts.float_ops_fed_by_quantized`). In static QDQ mode ORT also quantizes each
MatMul's *output* unless told otherwise, which would round the q/k/v inputs of GroupQueryAttention and the
residual branches to 8 bits; ``OpTypesToExcludeOutputQuantization`` keeps them float, and ONNX Runtime runs
``DQ → MatMul`` as ``MatMulIntegerToFloat`` (u8×s8 integer GEMM, float output) instead of ``QLinearMatMul``
→ ``DequantizeLinear``.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from hllm.calibration.recipes.options import QuantOptions
from hllm.errors import EngineError, HllmError
from hllm.formats.graph import feed_dict


def calibration_reader(calib):
    """An ``onnxruntime.quantization.CalibrationDataReader`` over a CalibrationSet's batches (one feed dict
    per ``get_next``, :func:`hllm.formats.graph.feed_dict` over the set's inputs; also ``rewind``,
    ``set_range`` for ORT and ``get_first`` for ModelOpt)."""
    from onnxruntime.quantization import CalibrationDataReader

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


def external_data(model_path: Path) -> bool:
    """Whether the graph at ``model_path`` keeps (or must keep) its weights in external-data files: it is
    near the 2 GB protobuf limit, or files ``<name>*`` lie beside it."""
    return model_path.stat().st_size > 1_900_000_000 or any(
        p.name != model_path.name and p.name.startswith(model_path.name) for p in model_path.parent.iterdir()
    )


def quantize_ort(src: Path, dst: Path, options: QuantOptions, calib=None, exclude: Sequence[str] = (),
                 cache_path: Path | None = None) -> None:
    """ONNX Runtime INT8 quantization of ``src`` into ``dst`` (static QDQ or dynamic).

    Args:
        src, dst: FP32 and output ``.onnx`` paths.
        options: backend ``ort-static`` (needs ``calib``), ``ort-dynamic`` or ``ort-weight-only``.
        calib: a :class:`hllm.formats.calibration_set.CalibrationSet` (static).
        exclude: node names kept in float.
        cache_path: ORT calibration cache (JSON of tensor ranges): written on first use, reused after,
            so re-quantizing with other exclusions skips the calibration runs.
    Raises: EngineError (no calibration data for static; ORT failure).
    """
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_dynamic, quantize_static

    ext = external_data(src)
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

