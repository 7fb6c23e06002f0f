"""Backends behind one interface (:class:`hllm.engines.base.Engine`).

Backend modules are imported on demand so that importing this package pulls in neither torch nor
onnxruntime nor tensorrt: ``hllm.engines.reference``, ``hllm.engines.ort``,
``hllm.engines.tensorrt.runner`` (its builder beside it in ``hllm.engines.tensorrt.builder``).
"""

from hllm.engines.base import Engine, check_inputs
from hllm.formats.graph import TensorSpec

__all__ = ["Engine", "TensorSpec", "check_inputs"]
