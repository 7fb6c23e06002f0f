"""Lists longer than the head's K (or whose prompt is over max_seq_len) ranked in blocks (hllm.runtime.blocks)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hllm.errors import HllmError, SlateError
from hllm.runtime import Ranker
from hllm.runtime import blocks as blk
from hllm.runtime.prompt import PromptBuilder, PromptTooLong
from hllm.testing import tiny_slates
from hllm.verify.parity import kendall_tau

K = 8  # the tiny export's rank positions


def _long(n: int, seed: int = 0) -> dict:
    return tiny_slates(1, n, seed=seed)[0]


def _check(ranking, n: int) -> None:
    assert sorted(ranking.order) == list(range(n))
    assert len(ranking.scores) == n and len(ranking.relevance) == n
    rel = np.asarray(ranking.relevance)
    assert rel.min() >= 0 and rel.max() <= 1 and np.all(np.diff(rel) <= 0)


@pytest.mark.parametrize("n", [K + 1, 2 * K, 2 * K + 5])
def test_longer_than_k_ranks_in_blocks_deterministically(export_dir, n):
    """N = K+1, 2K, 2K+5: a permutation of every candidate, B = ⌈(N − a)/(K − a)⌉ blocks of the a = 5 anchors +
    strided candidates, B + 2 engine rows in 2 calls, and the same ranking twice."""
    slate = _long(n)
    with Ranker.from_path(export_dir) as r:
        row = r.encode(slate)
        assert isinstance(row, blk.BlockedSlate) and row.anchors == [0, 1, 2, 3, 4]
        b = -(-(n - 5) // (K - 5))
        assert len(row.blocks) == b and row.work == b + 1
        assert all(blk_[:5] == row.anchors and len(blk_) <= K for blk_ in row.blocks)
        assert sorted(i for blk_ in row.blocks for i in blk_[5:]) == list(range(5, n))
        first = r.rank([slate])
        again = r.rank([slate])
    got = first[0]
    _check(got, n)
    assert got.blocks == b and got.to_dict()["blocks"] == b
    assert got.item_ids == [slate["candidates"][i]["item_id"] for i in got.order]
    assert first.scores[0].shape == (n, K)
    assert got.order == again[0].order and got.relevance == again[0].relevance


def test_short_slates_rank_as_before_beside_a_long_one(export_dir):
    """A batch mixing N ≤ K slates and a long one: the short ones get exactly their one-pass ranking (no
    ``blocks`` key), the long one is ranked in blocks."""
    short = tiny_slates(3, (2, K), seed=4)
    with Ranker.from_path(export_dir, batch_size=4) as r:
        alone = r.rank_batch(short)
        mixed = r.rank_batch(short[:2] + [_long(2 * K)] + short[2:])
    got = [x for i, x in enumerate(mixed.rankings) if i != 2]
    assert [x.order for x in got] == [x.order for x in alone]
    assert [x.scores for x in got] == [x.scores for x in alone]
    assert all("blocks" not in x.to_dict() and x.blocks == 0 for x in alone)
    assert mixed[2].blocks == 4 and mixed.calls == 2  # 3 short + 4 blocks in one call, round B in another


def test_prompt_over_max_seq_len_ranks_in_blocks(export_dir):
    """N ≤ K but the prompt is one token over max_seq_len: ranked in blocks (was a SlateError); a slate of
    ONE candidate that does not fit is still refused."""
    base = Ranker.from_path(export_dir)
    slate = _long(K, seed=2)
    n_tokens = len(base.builder.encode_one(slate).ids)
    spec = dataclasses.replace(base.builder.spec, max_seq_len=n_tokens - 1)
    small = PromptBuilder(base.builder.tokenizer, spec, max_items=K)
    with pytest.raises(PromptTooLong):
        small.encode_one(slate)
    with Ranker(base.engine, small) as r:
        row = r.encode(slate)
        assert isinstance(row, blk.BlockedSlate) and len(row.blocks) == 2
        assert all(len(x.ids) <= n_tokens - 1 for x in row.rows)
        _check(r.rank([slate])[0], K)
        tight = PromptBuilder(base.builder.tokenizer, dataclasses.replace(spec, max_seq_len=3), max_items=K)
        with pytest.raises(SlateError, match="over max_seq_len=3"):
            Ranker(base.engine, tight).encode(_long(1))


def test_duplicate_documents_each_ranked_once(export_dir):
    """The same text 3K times (no item ids): every copy is ranked exactly once."""
    slate = {"history": ["x"], "candidates": [{"title": "the same document"} for _ in range(3 * K)]}
    with Ranker.from_path(export_dir) as r:
        got = r.rank([slate])[0]
    _check(got, 3 * K)
    assert got.item_ids == got.order


def test_max_documents_limit(export_dir):
    with Ranker.from_path(export_dir, blocks=blk.BlockOptions(max_documents=20)) as r:
        assert r.rank([_long(20)])[0].blocks == 5
        with pytest.raises(blk.TooManyDocuments, match="21 candidates, over the limit of 20 documents"):
            r.rank([_long(21)])
    with Ranker.from_path(export_dir) as r, pytest.raises(SlateError, match="limit of 1000 documents"):
        r.encode({"candidates": [{"title": "t"}] * 1001})
    with pytest.raises(HllmError, match="block method"):
        blk.BlockOptions(method="random")


class OracleEngine:
    """Scores candidate i by a hidden quality (its last token id): ``M[i, p] = q_i · (K − p)``, so one pass
    sorts by q exactly and a block's soft rank is monotone in q."""

    name = "oracle"
    num_positions = K

    def activate(self):
        return self

    def deactivate(self):
        pass

    def run(self, ids, pos, mask, context=None):
        q = np.take_along_axis(ids, pos, axis=1).astype(np.float32) / 1000.0
        return (q[..., None] * (K - np.arange(K, dtype=np.float32))) * mask[..., None]


@pytest.mark.parametrize("method", ["anchors", "jointrank"])
def test_blocks_recover_an_oracle_order(export_dir, method):
    """With scores that are a known quality, both methods put the best candidate first and order the list
    nearly as the quality does (Kendall tau > 0.8); round B makes the top K exact for the shipped method."""
    base = Ranker.from_path(export_dir)
    words = [f"thing {w}" for w in ("apple", "river", "stone", "cloud", "flame", "grape", "night", "sugar", "tiger",
                                    "violet", "amber", "bread", "coral", "delta", "eagle", "frost", "glass", "honey",
                                    "ivory", "jelly", "koala", "lemon", "mango", "noble", "olive")]
    last = {w: base.builder.tokenizer.encode(w, add_special_tokens=False).ids[-1] for w in words}
    words = list({last[w]: w for w in words}.values())  # distinct qualities
    slate = {"history": ["h"], "candidates": [{"title": w} for w in words]}
    truth = sorted(range(len(words)), key=lambda i: -last[words[i]])
    r = Ranker(OracleEngine(), base.builder, blocks=blk.BlockOptions(method=method))
    got = r.rank([slate])[0]
    _check(got, len(words))
    assert got.blocks >= 2 and got.order[0] == truth[0]
    assert kendall_tau(np.array(got.order), np.array(truth)) > 0.8
    if method == "anchors":
        assert got.order[:K] == truth[:K]


def test_jointrank_blocks_overlap():
    """JointRank plan: each candidate in `replication` blocks (twice at most once per block), blocks ≤ K."""
    lengths = [5] * 30
    anchors, blocks = blk._plan(blk.BlockOptions(method="jointrank"), 30, K, lengths, 10_000)
    assert anchors == [] and all(len(b) <= K for b in blocks)
    counts = np.bincount([i for b in blocks for i in b], minlength=30)
    assert counts.min() >= 1 and counts.max() <= 2 and counts.sum() >= 55


def test_a_head_that_reads_the_user_context_ranks_blocks_with_its_context(context_export_dir):
    """Every block carries the user context: with a context-reading head, each block row's context position is
    the last user-context token of its own prompt, and the long slate ranks as a permutation, twice the same."""
    slate = _long(2 * K + 3, seed=5)
    with Ranker.from_path(context_export_dir) as r:
        row = r.encode(slate)
        assert isinstance(row, blk.BlockedSlate) and len(row.blocks) >= 2
        ends = {enc.context_end for enc in row.rows}
        assert len(ends) == 1 and all(enc.ids[: enc.context_end + 1] == row.rows[0].ids[: enc.context_end + 1]
                                      for enc in row.rows)  # the same user context, read at the same token
        got, again = r.rank([slate])[0], r.rank([slate])[0]
    _check(got, 2 * K + 3)
    assert got.order == again.order
