"""A candidate template may name any string field of a candidate (``{brand}``); a candidate without it is
refused naming the field, and the field's text is bounded like the title's."""

from __future__ import annotations

import re

import pytest

from hllm.errors import CheckpointError, SlateError
from hllm.formats.prompt import PromptSpec
from hllm.runtime.prompt import PromptBuilder, load_tokenizer


@pytest.fixture(scope="module")
def builder(qwen3_backbone):
    spec = PromptSpec(candidate_template="{index}. {title} by {brand}", candidate_token_budget=16)
    return PromptBuilder(load_tokenizer(qwen3_backbone), spec)


def _slate(**fields):
    return {"slate_id": "s", "history": ["argan oil"], "candidates": [{"title": "hair serum", **fields},
                                                                         {"title": "nail polish", **fields}]}


def test_field_reaches_the_prompt(builder):
    a = builder.encode_one(_slate(brand="rose"))
    b = builder.encode_one(_slate(brand="lavender"))
    assert a.ids != b.ids and len(a.readout) == 2
    text = builder.tokenizer.decode(a.ids[a.context_end + 1: a.readout[0] + 1])
    assert text == "1. hair serum by rose"


@pytest.mark.parametrize("fields,word", [({}, "lacks field 'brand'"), ({"brand": 3}, "non-string (int) field 'brand'")])
def test_missing_or_non_string_field_is_named(builder, fields, word):
    with pytest.raises(SlateError, match=re.escape(word)):
        builder.encode_one(_slate(**fields))


def test_long_field_is_cut_and_recorded(builder):
    enc = builder.encode_one(_slate(brand="shimmer " * 100_000))
    assert enc.truncated == [0, 1] and len(enc.ids) < 200


def test_other_templates_keep_their_placeholders():
    with pytest.raises(CheckpointError, match="unknown placeholder"):
        PromptSpec(history_item_template="- {title} by {brand}\n")
    with pytest.raises(CheckpointError, match="format spec"):
        PromptSpec(candidate_template="{title} {brand:>999}")
