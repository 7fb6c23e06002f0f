"""Backends behind one interface (:class:`hllm.engines.base.Engine`).

Backend modules are imported on demand so that importing this package pulls in neither torch nor
onnxruntime nor tensorrt: ``hllm.engines.torch``, ``hllm.engines.onnxruntime``,
``hllm.engines.tensorrt``.
"""

from hllm.engines.base import Engine, TensorSpec, check_inputs

__all__ = ["Engine", "TensorSpec", "check_inputs"]
