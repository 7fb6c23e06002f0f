"""Export-time patches of transformers (reversible context managers, in the style of Optimum's
``ModelPatcher``: https://github.com/huggingface/optimum/blob/main/optimum/exporters/onnx/model_patcher.py).

:func:`causal_sdpa_export` — why it is needed. Under ``torch.export`` transformers never lets SDPA use
its ``is_causal`` flag: ``masking_utils._ignore_causal_mask_sdpa`` returns False while exporting (the
exported graph would hard-code ``is_causal=True``, "in general wrong" for decoding with a cache, see
https://github.com/pytorch/pytorch/issues/108108), and ``find_packed_sequence_indices`` cannot tell a
packed batch from a plain one while tracing. So the graph materialises a boolean ``[B, 1, S, S]`` mask
built from the position ids (CumSum / Equal / And …) and the exporter lowers SDPA-with-a-boolean-mask
to ``Where(mask, 0, min)`` + ``Softmax`` + ``Where(IsNaN(p), 0, p)`` (the NaN guard for fully masked
rows added in https://github.com/microsoft/onnxscript/pull/2479). That guard is one more pass over
every ``[B, H, S, S]`` probability tensor and it hides the attention pattern from ONNX Runtime's and
OpenVINO's fusions.

For hLLM the hard-coding is exactly right: the backbone runs one causal prefill with no cache, no
attention mask and position ids ``0..S-1`` (right padding: pads come after every real token), so no
row is ever fully masked and no sequence is packed. Inside the context manager the two decisions are
made the way transformers makes them outside export for such a call (mask skipped → SDPA with
``is_causal=True``), which the exporter lowers to a float causal mask (``Trilu``) + ``Softmax`` with
no NaN guard. Calls with a padding mask, a cache offset or a sliding window keep the original code.
"""

from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def causal_sdpa_export() -> Iterator[None]:
    """Within the block, a transformers decoder called without attention mask and without cache
    builds no mask: SDPA runs with ``is_causal=True`` (see the module docstring for why and when).

    Restores ``transformers.masking_utils`` on exit, also on error. Not thread-safe (module globals).
    Source: ``transformers.masking_utils`` (``sdpa_mask``, ``_preprocess_mask_arguments``), transformers 5.x.
    """
    from transformers import masking_utils as mu

    original_ignore = mu._ignore_causal_mask_sdpa
    original_packed = mu.find_packed_sequence_indices

    def ignore_causal_mask(padding_mask, q_length, kv_length, q_offset, kv_offset, local_attention_size=None):
        plain_prefill = (padding_mask is None and local_attention_size is None and isinstance(q_offset, int)
                         and q_offset == 0 and kv_offset == 0 and kv_length is q_length)
        if plain_prefill:
            return True
        return original_ignore(padding_mask, q_length, kv_length, q_offset, kv_offset, local_attention_size)

    def no_packed_sequences(position_ids):
        return None  # the backbone builds position ids 0..S-1 itself: one sequence per row

    mu._ignore_causal_mask_sdpa = ignore_causal_mask
    mu.find_packed_sequence_indices = no_packed_sequences
    try:
        yield
    finally:
        mu._ignore_causal_mask_sdpa = original_ignore
        mu.find_packed_sequence_indices = original_packed
