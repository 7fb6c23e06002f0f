"""Calibration and quantization of exported hLLM graphs, gated by ranking fidelity.

* :mod:`.data` — calibration sets from real slates through the runtime's prompt builder (npz + json);
* :mod:`.quantize` — ONNX Runtime INT8 (static QDQ / dynamic) and ModelOpt INT8 / FP8 Q/DQ, parts kept
  in float, automatic exclusion;
* :mod:`.gate` — the fidelity gate (top-1 agreement, Kendall tau, ΔRecall@10) against the FP32 graph;
* :mod:`.speed` — interleaved CPU speed of a quantized export vs FP32.

Importing this package loads numpy only; onnx / onnxruntime / modelopt are imported by the functions
that need them.
"""

from hllm.calibration.data import CalibrationSet, build_calibration_set, check_disjoint, load_calibration_set

__all__ = ["CalibrationSet", "build_calibration_set", "check_disjoint", "load_calibration_set"]
