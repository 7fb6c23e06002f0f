"""NVIDIA Triton Inference Server model repository for hLLM engines (``hllm triton-repo``).

:mod:`.repo` writes the repository (engine model + Python-backend LAPJV decode + ensemble),
:mod:`.decode_model` is the Python-backend model (the runtime's decode, imported), :mod:`.client`
sends slates over the KServe v2 HTTP protocol. Torch-free.
"""
