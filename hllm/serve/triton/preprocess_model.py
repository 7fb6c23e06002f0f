"""Prompt building as a Triton Python-backend model: slate JSON in, engine inputs out.

Input per request (Triton adds the batch dim; ``max_batch_size`` ≥ 1):
    slates             [B, 1] BYTES   one slate per row, UTF-8 JSON in the slate format of
                                      :mod:`hllm.runtime.slates`
Outputs:
    input_ids          [B, S] int64   right-padded token ids; S = the longest prompt rounded up to a
                                      multiple of ``seq_bucket`` (at most ``max_seq_len`` unless the
                                      prompt itself is longer)
    readout_positions  [B, K] int64   each candidate's last token; 0 past the slate
    item_mask          [B, K] bool    True for real candidates (a prefix)
    context_positions  [B, 1] int64   only when the engine graph declares it (a head that reads the user
                                      context): index of the last user-context token. Triton needs
                                      non-empty dims, so it travels as ``[B, 1]`` and the engine model's
                                      config reshapes it to the graph's ``[B]`` (``reshape { shape: [ ] }``)
    truncated          [B, K] bool    True where a candidate's text was cut to the token budget

Which engine inputs it emits is the graph's own list (``inputs`` in the settings file, from the export's
sidecar), built by :func:`hllm.formats.graph.feed_dict` — the runtime's feed dict, not a copy of it.

The encoding is :class:`hllm.runtime.prompt.PromptBuilder` and the slate check
:func:`hllm.runtime.slates.validate_slate` — ``hllm triton-repo`` copies these modules, unchanged,
into the repository beside this one, so Triton builds exactly the prompts of ``hllm rank`` / ``hllm
serve``. Triton's dynamic batcher merges requests only when their shapes are equal, so every row is
padded to ``N = K`` item slots and ``S`` to a bucket; right padding leaves every real token's hidden
state unchanged (causal attention, see :mod:`hllm.runtime.prompt`). Each request is encoded on its
own (the Python backend hands ``execute`` a list of requests; it does not merge them); a bad slate
fails only its own request. ``triton_python_backend_utils`` exists only inside Triton and is imported
in :meth:`TritonPythonModel.initialize`. Settings (K, bucket, prompt spec) and ``tokenizer.json``
lie in the model's version directory (``args["model_repository"]/args["model_version"]``).
Python backend API: https://github.com/triton-inference-server/python_backend#usage
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hllm.errors import SlateError
from hllm.formats.graph import INPUT_NAMES, declared_inputs, feed_dict
from hllm.formats.prompt import PromptSpec
from hllm.runtime.prompt import PromptBuilder, load_tokenizer
from hllm.runtime.slates import loads_json, validate_slate

SLATES, TRUNCATED = "slates", "truncated"
#: The settings file in the model's version directory: ``{"num_positions", "seq_bucket", "prompt", "inputs"}``.
SETTINGS = "hllm_preprocess.json"


def bucket_length(s: int, seq_bucket: int, max_seq_len: int) -> int:
    """``s`` rounded up to a multiple of ``seq_bucket``, but not past ``max(s, max_seq_len)``."""
    return min(-(-s // seq_bucket) * seq_bucket, max(s, max_seq_len))


def parse_slates(raw: np.ndarray) -> list[dict]:
    """Slates from a BYTES tensor ``[B]`` or ``[B, 1]`` of UTF-8 JSON objects.

    Raises: SlateError naming the row (not UTF-8, malformed JSON, not a valid slate).
    """
    rows = np.asarray(raw, dtype=object).reshape(-1)
    slates = []
    for i, item in enumerate(rows):
        try:
            text = item.decode("utf-8") if isinstance(item, (bytes, bytearray)) else str(item)
        except UnicodeDecodeError as e:
            raise SlateError(f"slates[{i}]: not a UTF-8 JSON slate ({e})") from None
        slates.append(validate_slate(loads_json(text, f"slates[{i}]"), f"slates[{i}]"))
    if not slates:
        raise SlateError("no slates in the request")
    return slates


def encode_padded(builder: PromptBuilder, slates: list[dict], num_positions: int, seq_bucket: int,
                  graph_inputs=INPUT_NAMES) -> dict[str, np.ndarray]:
    """The engine feed dict of ``slates`` padded to ``K = num_positions`` items and an ``S`` bucket (see
    module doc), plus ``truncated``.

    Args: graph_inputs: the engine graph's declared inputs (:func:`hllm.formats.graph.feed_dict`).
    Returns ``{input_ids [B,S] int64, readout_positions [B,K] int64, item_mask [B,K] bool[,
        context_positions [B] int64], truncated [B,K] bool}`` (graph shapes; :func:`triton_shapes` gives
        Triton's).
    Raises: SlateError (empty slate, more than K candidates, prompt over ``max_seq_len``); ShapeError.
    """
    batch = builder.encode(slates)
    b, s = batch.input_ids.shape
    n = batch.item_mask.shape[1]
    s2 = bucket_length(s, seq_bucket, builder.spec.max_seq_len)
    ids = np.full((b, s2), builder.pad_id, dtype=np.int64)
    ids[:, :s] = batch.input_ids
    pos = np.zeros((b, num_positions), dtype=np.int64)
    pos[:, :n] = batch.readout_positions
    mask = np.zeros((b, num_positions), dtype=bool)
    mask[:, :n] = batch.item_mask
    truncated = np.zeros((b, num_positions), dtype=bool)
    for row, cut in enumerate(batch.truncated):
        truncated[row, cut] = True
    padded = {"input_ids": ids, "readout_positions": pos, "item_mask": mask,
              "context_positions": batch.context_positions}
    return {**feed_dict(graph_inputs, padded), TRUNCATED: truncated}


def triton_shapes(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The arrays as Triton's inference API carries them: a batch-only ``[B]`` tensor becomes ``[B, 1]``
    (every Triton tensor has non-empty ``dims``; the engine config reshapes it back)."""
    return {name: a.reshape(-1, 1) if a.ndim == 1 else a for name, a in arrays.items()}


def load_settings(home: str | Path) -> tuple[PromptBuilder, int, int, tuple[str, ...]]:
    """(builder, K, seq_bucket, graph input names) from ``SETTINGS`` and ``tokenizer.json`` in ``home``.

    Raises: CheckpointError (tokenizer or prompt spec unreadable), OSError / KeyError (settings file),
        ShapeError (an input name that is not an hLLM graph input).
    """
    home = Path(home)
    cfg = json.loads((home / SETTINGS).read_text(encoding="utf-8"))
    k = int(cfg["num_positions"])
    builder = PromptBuilder(load_tokenizer(home / "tokenizer.json"), PromptSpec.from_dict(cfg["prompt"]), max_items=k)
    return builder, k, int(cfg["seq_bucket"]), declared_inputs(cfg["inputs"])


class TritonPythonModel:
    """Triton Python-backend entry point (``initialize`` / ``execute`` / ``finalize``)."""

    def initialize(self, args: dict) -> None:
        """Load the tokenizer and prompt spec from the model's version directory."""
        import triton_python_backend_utils as pb_utils  # provided by Triton's Python backend

        self.pb = pb_utils
        home = Path(args["model_repository"]) / args["model_version"]
        self.builder, self.num_positions, self.seq_bucket, self.graph_inputs = load_settings(home)

    def execute(self, requests: list) -> list:
        """One response per request, in order; a request with a bad slate gets an error response."""
        pb = self.pb
        responses = []
        for request in requests:
            try:
                slates = parse_slates(pb.get_input_tensor_by_name(request, SLATES).as_numpy())
                arrays = triton_shapes(encode_padded(self.builder, slates, self.num_positions, self.seq_bucket, self.graph_inputs))
                responses.append(pb.InferenceResponse(output_tensors=[pb.Tensor(name, a) for name, a in arrays.items()]))
            except Exception as e:  # noqa: BLE001 — one bad request must not fail the others
                responses.append(pb.InferenceResponse(output_tensors=[], error=pb.TritonError(f"hllm preprocess: {e}")))
        return responses

    def finalize(self) -> None:
        """Drop the tokenizer."""
        self.builder = None
