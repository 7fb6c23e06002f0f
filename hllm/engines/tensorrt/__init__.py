"""TensorRT: the plan builder (``builder``) beside its runner (``runner``). Neither is imported by this
package's ``__init__`` so that ``import hllm.engines.tensorrt`` needs no TensorRT."""
