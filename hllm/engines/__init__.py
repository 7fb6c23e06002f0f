"""Backends behind one interface (:class:`hllm.engines.base.Engine`).

Backend modules are imported on demand so that importing this package pulls in neither torch nor
onnxruntime nor openvino nor tensorrt: ``hllm.engines.reference``, ``hllm.engines.ort``,
``hllm.engines.openvino``, ``hllm.engines.tensorrt.runner`` (plans are built by ``hllm.exporter.plan``).
"""

from hllm.engines.base import Engine, check_inputs
from hllm.formats.graph import TensorSpec

__all__ = ["Engine", "TensorSpec", "check_inputs"]
