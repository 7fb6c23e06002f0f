"""File formats only: the torch-free contracts and the files that carry them, one reader and one writer per file.

* :mod:`.prompt` — :class:`PromptSpec` (how a slate becomes a prompt);
* :mod:`.graph` — the graph's input/output names, dtypes and symbolic shapes;
* :mod:`.architectures` — per-family backbone dimensions from ``config.json``;
* :mod:`.checkpoint` — the checkpoint manifest ``hllm.json``;
* :mod:`.export` — the export sidecar ``export.json``;
* :mod:`.plan` — the TensorRT plan sidecar ``<plan>.json``;
* :mod:`.profiles` — the form of a TensorRT optimization profile (batch, seq, items);
* :mod:`.calibration_set` / :mod:`.calibration_report` — encoded calibration slates (``.npz`` + ``.json``) and
  the calibration report;
* :mod:`.npz` — checked ``.npz`` reading; :mod:`.tokenizer` — the tokenizer file's fingerprint;
* :mod:`.provenance` — the library versions recorded in sidecars;
* :mod:`.precision` — the :class:`Precision` of a graph.

Policies that use these formats live with their owners (GPU targets and profile choice:
:mod:`hllm.engines.tensorrt`; which artefact a path holds: :mod:`hllm.runtime.artefact`; inspection:
:mod:`hllm.cli.describe`). Importing any of these loads neither torch, transformers, onnx, onnxruntime nor
fastapi (the ``forbidden`` contract in ``pyproject.toml``).
"""
