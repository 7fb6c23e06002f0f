"""Torch-free contracts and the files that carry them: one reader and one writer per file.

* :mod:`.prompt` — :class:`PromptSpec` (how a slate becomes a prompt);
* :mod:`.graph` — the graph's input/output names, dtypes and symbolic shapes;
* :mod:`.architectures` — per-family backbone dimensions from ``config.json``;
* :mod:`.checkpoint` — the checkpoint manifest ``hllm.json``;
* :mod:`.export` — the export sidecar ``export.json``;
* :mod:`.plan` — the TensorRT plan sidecar ``<plan>.json`` and the deployment GPU targets;
* :mod:`.profiles` — TensorRT optimization profiles (batch, seq, items);
* :mod:`.calibration_set` — encoded calibration slates (``.npz`` + ``.json``);
* :mod:`.precision` — the :class:`Precision` of a graph.

Importing any of these loads neither torch nor transformers nor onnxruntime.
"""
