"""One quantized export: quantize an exported hLLM ONNX graph into a new export directory (the search that
keeps parts in float until the ranking gate passes is the ladder of :func:`hllm.calibration.selection.select.calibrate`).

The pieces: :mod:`hllm.calibration.recipes.options` (what to quantize and how, the backends), :mod:`hllm.calibration.recipes.parts`
(graph parts kept in float, the quantized graph's summary), :mod:`hllm.calibration.recipes.ort_quantize` (ONNX Runtime
INT8: static, dynamic, weight-only) and :mod:`hllm.calibration.recipes.modelopt_ptq` (ModelOpt INT8 / FP8 Q/DQ for
TensorRT).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from hllm.calibration.recipes.modelopt_ptq import quantize_modelopt
from hllm.calibration.recipes.options import NothingToQuantize, QuantOptions
from hllm.calibration.recipes.ort_quantize import quantize_ort, source_view
from hllm.calibration.recipes.parts import activation_matmuls, excluded_nodes, float_ops_fed_by_quantized, qdq_summary
from hllm.errors import EngineError, ExportError
from hllm.files import atomic_dir
from hllm.formats.export import ExportChange, derive_export, read_export
from hllm.formats.precision import Precision


@dataclass
class QuantResult:
    """A quantized export written to ``out_dir`` (``model.onnx`` + ``export.json`` + ``tokenizer.json``).

    Attributes:
        out_dir: the export directory (loadable by ``Ranker.from_path``).
        excluded_nodes: node names kept in float.
        excluded_parts: the part names that produced them.
        summary: :func:`hllm.calibration.recipes.parts.qdq_summary` of the written graph.
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
        calib: :class:`hllm.formats.calibration_set.CalibrationSet` (static / ModelOpt).
        cache_path: ORT calibration cache path (static).
    Returns: :class:`QuantResult`. The sidecar ``export.json`` gets ``precision`` (``int8``/``fp8``),
        ``quantization`` (backend, options, excluded nodes, ``source_flavour``, calibration record) and a
        new ``onnx_sha256``; ``flavour`` stays the source's (the ``ort-cpu`` contrib ops are kept).
    Raises: EngineError (ModelOpt asked of an ``ort-cpu`` export: TensorRT cannot parse its contrib ops;
        a contrib op left reading quantized values, :func:`float_ops_fed_by_quantized`) / ExportError.
    """
    import onnx

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
        derive_export(exp, tmp, ExportChange(precision=options.precision, quantization=q, graph=dst.name,
                                             extra={"tokenizer": "tokenizer.json"}))
    return QuantResult(Path(out_dir), exclude, list(options.exclude), summary, seconds, options.to_dict())

