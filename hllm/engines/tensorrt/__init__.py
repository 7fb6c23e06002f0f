"""TensorRT: the runner (``runner``), the deployment GPU targets (``targets``), optimization-profile policy
(``profiles``) and the trtexec / Polygraphy command lines (``interop``). The plan builder, which reads an ONNX
export, is an export step: :mod:`hllm.exporter.plan`. Nothing is imported by this package's ``__init__``, so
``import hllm.engines.tensorrt`` needs no TensorRT."""
