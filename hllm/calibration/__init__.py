"""Reduced-precision engines of an export, laid out in three parts:

* :mod:`hllm.calibration.recipes` — each engine × precision and how it is built from the FP32 export
  (:class:`~hllm.calibration.recipes.recipe.Recipe`: ONNX Runtime static / dynamic / weight-only INT8,
  ModelOpt, NNCF INT8 and accuracy control, OpenVINO fp32 / bf16 hint / bf16 islands / INT8 weights,
  fused fp32) and the quantizers behind them;
* :mod:`hllm.calibration.selection` — build, gate against the FP32 reference, keep what passes
  (``hllm calibrate``, ``--backend auto``);
* :mod:`hllm.calibration.precision_search` — which modules must stay fp32 (``hllm debug precision``).

Calibration data drawn from real slates, shared by all three: :mod:`hllm.calibration.data`.
"""
