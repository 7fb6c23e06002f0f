"""Decode errors name the slate: its slate_id, or — without one — its index in the
whole input, not its position inside an engine batch."""

from __future__ import annotations

import numpy as np
import pytest

from hllm.engines.base import Engine
from hllm.errors import DecodeError
from hllm.formats.prompt import PromptSpec
from hllm.runtime.prompt import PromptBuilder, load_tokenizer
from hllm.runtime.ranker import Ranker


class NanForThree(Engine):
    """Scores are the item index on the diagonal; a slate of exactly 3 candidates gets NaN scores."""

    name = "nan-for-three"

    def _activate(self):
        pass

    def _deactivate(self):
        pass

    def _run(self, input_ids, readout_positions, item_mask, context_positions=None):
        b, n = item_mask.shape
        scores = np.tile(np.eye(n, self.num_positions, dtype=np.float32), (b, 1, 1))
        scores[item_mask.sum(axis=1) == 3] = np.nan
        return scores


@pytest.fixture
def ranker(qwen3_backbone):
    builder = PromptBuilder(load_tokenizer(qwen3_backbone), PromptSpec(), max_items=8)
    return Ranker(NanForThree(8), builder, batch_size=2)


def _slates(sizes, ids=False):
    return [{**({"slate_id": f"s-{i}"} if ids else {}), "history": [],
             "candidates": [{"title": f"item {j}"} for j in range(n)]} for i, n in enumerate(sizes)]


def test_slate_without_id_is_named_by_its_index_in_the_whole_input(ranker):
    with pytest.raises(DecodeError, match=r"^slate 2: score matrix has 9 non-finite"):
        ranker.rank(_slates([2, 2, 3, 2]))  # the bad slate is first in the second engine batch


def test_slate_with_id_is_named_by_it(ranker):
    with pytest.raises(DecodeError, match=r"^slate s-3: "):
        ranker.rank(_slates([2, 2, 2, 3], ids=True))


def test_rankings_without_ids_carry_the_global_index(ranker):
    res = ranker.rank(_slates([2, 2, 2, 2, 2]))
    assert [r.slate_id for r in res] == ["0", "1", "2", "3", "4"]


def test_candidates_without_item_id_are_named_by_plain_int_indices(ranker):
    """(was: numpy int64 in ``item_ids`` → "not JSON serializable", an internal error in rank and serve)"""
    import json

    (r,) = ranker.rank(_slates([3 - 1]))
    assert r.item_ids == r.order and all(type(i) is int for i in r.item_ids)
    json.dumps(r.to_dict())
