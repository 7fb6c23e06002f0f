"""Everything that writes an artefact: GGUF conversion, ``hllm init``, LoRA merge, ONNX export (+ FP16
islands, attention fusion), TensorRT plans, quantization and the calibrate pipeline.

Builders may use engines (to validate what they wrote); engines never import builders.
"""
