"""ONNX model I/O and the small graph helpers the precision rewrites share: load / save (external data past
2 GB), a new model that keeps another's opsets, the element type of every tensor.

Sources: ONNX Python API (``onnx.load``, ``onnx.save_model`` with ``save_as_external_data``; a protobuf message
cannot exceed 2 GB, ONNX "External Data" documentation) and ``onnx.shape_inference.infer_shapes``.
"""

from __future__ import annotations

import os
from pathlib import Path

from hllm.errors import ExportError

FLOAT = 1  # onnx.TensorProto.FLOAT
FLOAT16 = 10  # onnx.TensorProto.FLOAT16
#: Serialized size from which weights go to an external-data file (2 GB protobuf limit, less a margin).
EXTERNAL_DATA_BYTES = 2 * 1024**3 - 64 * 1024**2


def save_onnx(model, path: str | os.PathLike) -> None:
    """Save an ``onnx.ModelProto`` to ``path``; its weights go to ``<name>.data`` beside it when they reach
    :data:`EXTERNAL_DATA_BYTES` (raw initializer bytes)."""
    import onnx

    path = Path(path)
    size = sum(len(t.raw_data) for t in model.graph.initializer)
    if size >= EXTERNAL_DATA_BYTES:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=path.name + ".data", size_threshold=1024)
    else:
        onnx.save_model(model, str(path))


def load_onnx(path: str | os.PathLike):
    """Load an ONNX model with its external data (if any).

    Raises: ExportError naming the file and the cause (missing, not an ONNX protobuf, external data absent).
    """
    import onnx

    try:
        return onnx.load(str(path))
    except Exception as e:
        raise ExportError(f"cannot load ONNX model {path}: {e}") from None


def model_like(model, graph, precision: str | None = None):
    """A new ``onnx.ModelProto`` with ``model``'s IR version, producer and opsets and the given graph; with
    ``precision``, the metadata property ``hllm.precision`` = ``precision`` (``fp16``, ``bf16-gemm`` …)."""
    import onnx

    out = onnx.ModelProto()
    out.ir_version = model.ir_version
    out.producer_name = model.producer_name
    out.producer_version = model.producer_version
    out.opset_import.extend(model.opset_import)
    out.graph.CopyFrom(graph)
    if precision is not None:
        meta = out.metadata_props.add()
        meta.key, meta.value = "hllm.precision", precision
    return out


def tensor_types(model) -> dict[str, int]:
    """``{tensor name: onnx.TensorProto element type}`` for the graph's inputs, outputs, intermediate values
    (ONNX shape inference runs first when the graph carries no ``value_info``) and initializers."""
    import onnx

    g = model.graph
    if not g.value_info:
        g = onnx.shape_inference.infer_shapes(model).graph
    types = {vi.name: vi.type.tensor_type.elem_type for vi in list(g.value_info) + list(g.input) + list(g.output)
             if vi.type.HasField("tensor_type")}
    types.update({t.name: t.data_type for t in model.graph.initializer})
    return types


def as_float32(infos) -> list:
    """Copies of ONNX ``ValueInfoProto`` s with float16 element types turned into float32."""
    import onnx

    out = []
    for vi in infos:
        v = onnx.ValueInfoProto()
        v.CopyFrom(vi)
        if v.type.tensor_type.elem_type == FLOAT16:
            v.type.tensor_type.elem_type = FLOAT
        out.append(v)
    return out
