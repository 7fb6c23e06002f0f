"""The exporter: a checkpoint's prefill + readout + scoring head as one ONNX graph.

``onnx`` traces and writes the graph (``export_onnx``), ``patches`` holds the export-time patches (reversible
context managers), ``fusion`` rewrites attention for the ``ort-cpu`` flavour, ``fp16`` converts to FP16 with
FP32 islands, ``validate`` checks a written graph against the PyTorch reference at untraced shapes, ``plan`` builds a TensorRT plan
from an export (``hllm build``). Export is
kept apart from validation, as Hugging Face Optimum's exporters do.
"""
