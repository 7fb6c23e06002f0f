"""Prompt builder: exact readout positions, truncation, padding, errors."""

import numpy as np
import pytest

from hllm.errors import CheckpointError, SlateError
from hllm.runtime.prompt import PromptBuilder, load_tokenizer
from hllm.formats.prompt import PromptSpec


@pytest.fixture(scope="module")
def tok(qwen3_backbone):
    return load_tokenizer(qwen3_backbone)


def slate(titles, history=("shea butter cream",), sid="s"):
    return {"slate_id": sid, "history": list(history), "candidates": [{"item_id": f"i{i}", "title": t} for i, t in enumerate(titles)]}


def test_readout_is_last_token_of_each_candidate(tok):
    spec = PromptSpec()
    b = PromptBuilder(tok, spec).encode([slate(["argan oil", "nail polish top coat", "mascara"])])
    ids = b.input_ids[0].tolist()
    for i, title in enumerate(["argan oil", "nail polish top coat", "mascara"]):
        cand = tok.encode(spec.candidate_template.format(index=i + 1, title=title), add_special_tokens=False).ids
        end = int(b.readout_positions[0, i])
        assert ids[end - len(cand) + 1 : end + 1] == cand
    # separator follows each candidate
    sep = tok.encode(spec.separator, add_special_tokens=False).ids
    end = int(b.readout_positions[0, 0])
    assert ids[end + 1 : end + 1 + len(sep)] == sep


def test_right_padding_and_masks(tok):
    b = PromptBuilder(tok, PromptSpec()).encode([slate(["a b c"] * 3), slate(["rose lotion"], history=())])
    assert b.input_ids.shape[0] == 2 and b.item_mask.tolist() == [[True] * 3, [True, False, False]]
    short = int(b.lengths[1])
    assert short < b.input_ids.shape[1]
    assert (b.input_ids[1, short:] == PromptBuilder(tok, PromptSpec()).pad_id).all()
    assert b.readout_positions[1, 1:].tolist() == [0, 0]
    assert b.readout_positions.dtype == np.int64 and b.item_mask.dtype == bool


def test_long_candidate_truncated_not_dropped(tok):
    spec = PromptSpec(candidate_token_budget=4)
    long = " ".join(["organic coconut shampoo"] * 10)
    b = PromptBuilder(tok, spec).encode([slate(["mask", long, "gloss"])])
    assert b.n_items.tolist() == [3]
    assert b.truncated == [[1]]
    assert b.readout_positions[0, 2] - b.readout_positions[0, 1] <= 4 + 2  # at most budget + separator


@pytest.mark.parametrize("budget", [1, 2])
def test_a_budget_the_template_prefix_fills_is_refused(tok, budget):
    """A budget of 1-2 (the rerank API's max_tokens_per_doc) would keep only "1." of every document: the
    documents' text would vanish and any documents would rank the same. Refused, naming the budget."""
    prefix = len(tok.encode("1. ", add_special_tokens=False).ids)
    assert prefix >= budget  # the prefix alone fills the budget
    with pytest.raises(SlateError, match=f"budget of {budget} keeps no token of candidate 0's text"):
        PromptBuilder(tok, PromptSpec(candidate_token_budget=budget)).encode([slate(["argan oil hair serum"])])
    enc = PromptBuilder(tok, PromptSpec(candidate_token_budget=prefix + 1)).encode_one(slate(["argan oil hair serum"]))
    assert enc.truncated == [0] and len(enc.ids) - enc.context_end - 2 == prefix + 1  # one title token kept (+ separator)


def test_history_dropped_oldest_first(tok):
    spec = PromptSpec(history_token_budget=20)
    hist = [f"old item {i} serum cream lotion" for i in range(8)]
    b = PromptBuilder(tok, spec).encode([slate(["x"], history=hist)])
    assert b.history_dropped[0] > 0
    assert b.readout_positions[0, 0] < 20 + 10


def test_too_long_prompt_is_clear_error(tok):
    spec = PromptSpec(max_seq_len=30)
    with pytest.raises(SlateError, match="max_seq_len=30"):
        PromptBuilder(tok, spec).encode([slate(["argan oil hair"] * 20)])


def test_more_candidates_than_k(tok):
    with pytest.raises(SlateError, match="K=2"):
        PromptBuilder(tok, PromptSpec(), max_items=2).encode([slate(["a", "b", "c"])])


def test_empty_slate(tok):
    with pytest.raises(SlateError, match="empty slate"):
        PromptBuilder(tok, PromptSpec()).encode([slate([])])
    with pytest.raises(SlateError):
        PromptBuilder(tok, PromptSpec()).encode([])


def test_spec_validation():
    with pytest.raises(CheckpointError, match="unknown keys"):
        PromptSpec.from_dict({"bogus": 1})
    with pytest.raises(CheckpointError, match="candidate_token_budget"):
        PromptSpec.from_dict({"candidate_token_budget": 0})
    assert PromptSpec.from_dict(PromptSpec().to_dict()) == PromptSpec()


def test_unknown_bos_token(tok):
    with pytest.raises(CheckpointError, match="bos_token"):
        PromptBuilder(tok, PromptSpec(bos_token="<nope>"))
