"""Recipes: each way of building an engine × precision from an FP32 export (:mod:`.recipe`, the build
function of each scheme in :mod:`.builders`, the ``--backend auto`` table in :mod:`.table`) and the
quantizers they call (ONNX Runtime, ModelOpt, NNCF, OpenVINO weight compression)."""
