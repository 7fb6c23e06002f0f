"""The one vocabulary of engines and precisions of the reduced-precision wing: which engines an artefact's
sidecar, a recipe or a frontier contender may name, and which precisions a recipe or a quantizer produces.
Every other module imports these names from here (never a copy of the tuples).

=========================  ===============================================  =====================================
name                       values                                           who reads it
=========================  ===============================================  =====================================
:data:`SIDECAR_ENGINES`    onnxruntime, openvino                            ``export.json``'s ``engine``
:data:`ARTEFACT_ENGINES`   auto + the sidecar engines                       ``hllm rank --engine``, contenders
:data:`RECIPE_ENGINES`     the artefact engines + torch (eager reference)   :class:`hllm.calibration.recipes.Recipe`
:data:`RECIPE_PRECISIONS`  fp32, bf16, int8                                 recipes, ``bench frontier``
:data:`QUANT_PRECISIONS`   int8, fp8                                        ``hllm calibrate --precision``
:data:`OPENVINO_HINTS`     f32, bf16 (+ the aliases the engine accepts)     ``openvino.inference_precision``
=========================  ===============================================  =====================================
"""

from __future__ import annotations

from hllm.formats.precision import Precision

#: Engines a sidecar's ``engine`` key may name (absent = onnxruntime).
SIDECAR_ENGINES = ("onnxruntime", "openvino")
#: Engines an artefact may be opened with: ``auto`` (what its sidecar says) or one of the sidecar engines.
ARTEFACT_ENGINES = ("auto",) + SIDECAR_ENGINES
#: Engines a recipe or contender names: the artefact engines, or the checkpoint's PyTorch eager reference.
RECIPE_ENGINES = ARTEFACT_ENGINES + ("torch",)
#: Precisions of a recipe's matrix products.
RECIPE_PRECISIONS = (Precision.FP32, Precision.BF16, Precision.INT8)
#: Precisions ``hllm calibrate`` quantizes to with one backend (fp8: ModelOpt for TensorRT only).
QUANT_PRECISIONS = (Precision.INT8, Precision.FP8)
#: OpenVINO's ``INFERENCE_PRECISION_HINT`` values (first two) and the aliases a sidecar may record.
OPENVINO_HINTS = ("f32", "bf16", "fp32", "float32", "bfloat16")
