"""docs/prompt-format.md is exact: an independent implementation of the page (plain `tokenizers` calls and
list operations, no hllm prompt code) reproduces PromptBuilder's arrays token for token, with candidate
truncation, history dropping, a BOS token, the context position and right padding."""

from __future__ import annotations

import numpy as np
import pytest

from hllm.formats.prompt import PromptSpec
from hllm.runtime.prompt import PromptBuilder, load_tokenizer
from hllm.testing import tiny_slates


def encode_as_documented(tok, spec: dict, slate: dict, k: int) -> tuple[list[int], list[int], int]:
    """One slate → (ids, readout positions, context position), following docs/prompt-format.md step by step."""
    enc = lambda text: tok.encode(text, add_special_tokens=False).ids  # noqa: E731
    cands = slate["candidates"]
    assert 1 <= len(cands) <= k
    ids = [tok.token_to_id(spec["bos_token"])] if spec["bos_token"] is not None else []
    hist = list(slate["history"])[-spec["max_history"]:] if spec["max_history"] else []
    while True:
        rendered = "".join(spec["history_item_template"].format(title=t, index=i) for i, t in enumerate(hist, 1))
        ctx = enc(spec["user_template"].format(history=rendered))
        if len(ctx) <= spec["history_token_budget"] or not hist:
            ctx = ctx[: spec["history_token_budget"]]
            break
        hist = hist[1:]
    ids += ctx
    context_position = max(0, len(ids) - 1)
    readout = []
    for j, c in enumerate(cands, 1):
        cid = enc(spec["candidate_template"].format(title=c["title"], index=j))[: spec["candidate_token_budget"]]
        assert cid
        ids += cid
        readout.append(len(ids) - 1)
        ids += enc(spec["separator"]) if spec["separator"] else []
    assert len(ids) <= spec["max_seq_len"]
    return ids, readout, context_position


@pytest.mark.parametrize("spec_kw", [
    {},  # defaults
    {"candidate_token_budget": 5, "history_token_budget": 14, "max_history": 4},  # truncation + dropping
    {"candidate_token_budget": 9, "history_token_budget": 3, "max_history": 0, "separator": "",
     "bos_token": "<|endoftext|>", "candidate_template": "[{index}] {title} {{x}}"},  # BOS, no history, braces
])
def test_documented_encoding_matches_prompt_builder(qwen3_backbone, spec_kw):
    tok = load_tokenizer(qwen3_backbone / "tokenizer.json")
    spec = PromptSpec(**spec_kw)
    builder = PromptBuilder(tok, spec, max_items=8)
    slates = tiny_slates(3, (1, 8), seed=11, history=6)
    batch = builder.encode(slates)
    docs = [encode_as_documented(tok, spec.to_dict(), s, 8) for s in slates]
    s_max, n_max = max(len(d[0]) for d in docs), max(len(d[1]) for d in docs)
    pad = tok.token_to_id("<|endoftext|>")
    want_ids = np.full((3, s_max), pad, dtype=np.int64)
    want_readout = np.zeros((3, n_max), dtype=np.int64)
    want_mask = np.zeros((3, n_max), dtype=bool)
    for b, (ids, readout, _) in enumerate(docs):
        want_ids[b, : len(ids)] = ids
        want_readout[b, : len(readout)] = readout
        want_mask[b, : len(readout)] = True
    np.testing.assert_array_equal(batch.input_ids, want_ids)
    np.testing.assert_array_equal(batch.readout_positions, want_readout)
    np.testing.assert_array_equal(batch.item_mask, want_mask)
    np.testing.assert_array_equal(batch.context_positions, [d[2] for d in docs])
    assert batch.input_ids.dtype == np.int64 and batch.item_mask.dtype == bool
    if spec_kw.get("candidate_token_budget") == 5:  # the case meant to exercise both rules really did
        assert any(batch.truncated) and any(batch.history_dropped)
