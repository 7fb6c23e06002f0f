"""NVIDIA Triton Inference Server model repository for hLLM engines (``hllm triton-repo``).

:mod:`.repo` writes the repository (Python-backend preprocessing → engine → Python-backend LAPJV decode,
as one ensemble: slate JSON in, rankings out); :mod:`.preprocess_model` and :mod:`.decode_model` are the
Python-backend models; :mod:`.vendor` copies them and the hllm modules they import into the repository
(and, with ``--bundle-deps``, the tokenizers and lap wheels) so it runs on a stock Triton image;
:mod:`.client` sends slates with ``tritonclient[http]``. Torch-free.
"""
