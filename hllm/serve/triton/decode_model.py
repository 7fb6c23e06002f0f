"""The LAPJV decode step as a Triton Python-backend model (``models/hllm_decode/1/model.py`` imports it).

Inputs per request (Triton strips nothing: the batch dim is the request's own):
    scores     [B, N, K] float32   the engine's score matrices
    item_mask  [B, N]    bool      True for real candidates (a prefix of each row)
Output:
    ranking    [B, N]    int64     ``ranking[b, p]`` = candidate at rank position p; -1 past the slate

The decoding is :func:`hllm.runtime.decode.decode_batch` — the runtime's own code: ``hllm triton-repo``
copies this module and the ones it imports, unchanged, into the repository, so Triton and ``hllm serve``
rank identically. It needs numpy and ``lap`` (shipped in the repository with ``--bundle-deps``).
Triton's Python backend does not split or merge batches for a model: with ``dynamic_batching`` it hands :meth:`TritonPythonModel.execute` several requests at once,
and each is decoded on its own here (LAPJV is per slate anyway). ``triton_python_backend_utils``
exists only inside Triton and is imported in :meth:`TritonPythonModel.initialize`.
(https://github.com/triton-inference-server/python_backend#usage)
"""

from __future__ import annotations

import numpy as np

from hllm.errors import DecodeError
from hllm.runtime.decode import decode_batch

SCORES, ITEM_MASK, RANKING = "scores", "item_mask", "ranking"


def rank_arrays(scores: np.ndarray, item_mask: np.ndarray) -> np.ndarray:
    """Rankings of a batch: ``scores [B, N, K]`` float, ``item_mask [B, N]`` bool → ``[B, N]`` int64, -1 padded.

    Raises: DecodeError (shape mismatch, a mask that is not a prefix, non-finite scores, N > K).
    """
    scores = np.asarray(scores)
    mask = np.asarray(item_mask, dtype=bool)
    if scores.ndim != 3 or mask.shape != scores.shape[:2]:
        raise DecodeError(f"scores {scores.shape} and item_mask {mask.shape} must be [B, N, K] and [B, N]")
    n_items = mask.sum(axis=1)
    for b, n in enumerate(n_items):
        if not mask[b, :n].all():
            raise DecodeError(f"slate {b}: item_mask must mark a prefix of the candidates")
        if n == 0:
            raise DecodeError(f"slate {b}: no candidates (item_mask all False)")
    out = np.full(mask.shape, -1, dtype=np.int64)
    for b, order in enumerate(decode_batch(scores, n_items)):
        out[b, : len(order)] = order
    return out


class TritonPythonModel:
    """Triton Python-backend entry point (``initialize`` / ``execute`` / ``finalize``)."""

    def initialize(self, args: dict) -> None:
        import triton_python_backend_utils as pb_utils  # provided by Triton's Python backend

        self.pb = pb_utils

    def execute(self, requests: list) -> list:
        """One response per request, in order; a request that cannot be decoded gets an error response."""
        pb = self.pb
        responses = []
        for request in requests:
            try:
                scores = pb.get_input_tensor_by_name(request, SCORES).as_numpy()
                mask = pb.get_input_tensor_by_name(request, ITEM_MASK).as_numpy()
                ranking = rank_arrays(scores, mask)
                responses.append(pb.InferenceResponse(output_tensors=[pb.Tensor(RANKING, ranking)]))
            except Exception as e:  # noqa: BLE001 — one bad request must not fail the others
                responses.append(pb.InferenceResponse(output_tensors=[], error=pb.TritonError(f"hllm decode: {e}")))
        return responses

    def finalize(self) -> None:
        """Nothing to free."""
        self.pb = None
