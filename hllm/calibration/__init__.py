"""Calibration and quantization of an export: the ``hllm calibrate`` pipeline (``pipeline``), the quantizers
(``quantize``: ONNX Runtime static / dynamic / weight-only, ModelOpt), calibration data drawn from real
slates (``data``) and per-layer activation ranges (``activation_ranges``).
"""
