"""The autoregressive teacher: output parser/repair, the constrained ordinal grammar, and greedy
decoding on a tiny random causal LM (a random model emits garbage: the parser must repair it, the
constrained mode must still produce a valid permutation)."""

import pytest

from hllm.teacher import OrdinalGrammar, parse_ordinals
from hllm.teacher.constrain import GrammarState


def test_parser_clean_output():
    p = parse_ordinals("3, 1, 2", 3)
    assert p.order == [2, 0, 1] and p.valid
    assert (p.invalid, p.repeated, p.missing) == (0, 0, 0)


def test_parser_survives_garbage_repeats_out_of_range_missing():
    p = parse_ordinals("Sure! Ranking: 4, 4, 9, 0, 07, banana 2", 5)
    assert p.order == [3, 1, 0, 2, 4]  # 4, 2, then missing 1, 3, 5 in original order
    assert p.repeated == 1
    assert p.invalid == 3  # 9 out of range, 0, leading zero 07
    assert p.missing == 3
    assert not p.valid


def test_parser_empty_output_is_original_order():
    p = parse_ordinals("I cannot help with that.", 4)
    assert p.order == [0, 1, 2, 3] and p.missing == 4 and not p.valid


def _feed(g, text):
    st = GrammarState()
    for ch in text:
        st = g.advance(st, ch)
        if st is None:
            return None
    return st


def test_grammar_accepts_only_valid_prefixes():
    g = OrdinalGrammar(12)
    assert _feed(g, "12, 3,4") is not None
    assert _feed(g, " 1") is not None
    assert _feed(g, "13") is None  # out of range
    assert _feed(g, "1,1") is not None  # "1" may still become 10, 11 or 12
    assert _feed(g, "1,1,") is None  # repeat
    assert _feed(g, "5,5") is None  # repeat, no longer ordinal starts with 5
    assert _feed(g, "0") is None
    assert _feed(g, "1,,2") is None
    assert _feed(g, "1 2") is None
    st = _feed(g, "1")
    assert g.advance(st, "2") is not None  # "12" still possible
    assert not g.can_end(st)


def test_grammar_ends_only_when_all_out():
    g = OrdinalGrammar(3)
    st = _feed(g, "2, 3, 1")
    assert g.can_end(st)
    assert g.advance(st, ",") is None  # no comma after the last ordinal
    assert not g.can_end(_feed(g, "2, 3"))


@pytest.fixture(scope="module")
def tiny_teacher(backbones):
    from hllm.teacher import ArRanker

    return ArRanker(backbones["llama"], threads=1)


def test_constrained_decoding_gives_valid_permutation(tiny_teacher, slates):
    for s in slates[:3]:
        r = tiny_teacher.rank(s, constrained=True)
        n = len(s["candidates"])
        assert sorted(r.order) == list(range(n))
        assert r.valid, r.raw_text
        assert r.decode_passes >= n  # at least one token per ordinal
        assert r.prefill_tokens > 0 and r.wall_s > 0


def test_batched_constrained_decoding_equals_one_by_one(tiny_teacher, slates):
    batch = sorted(slates, key=lambda x: len(x["candidates"]))[:2] + [max(slates, key=lambda x: len(x["candidates"]))]
    assert len({len(s["candidates"]) for s in batch}) > 1  # different N, so different prompt lengths
    together = tiny_teacher.rank_batch(batch, constrained=True)
    for s, r in zip(batch, together):
        one = tiny_teacher.rank(s, constrained=True)
        assert r.valid and sorted(r.order) == list(range(len(s["candidates"])))
        assert (r.order, r.raw_text, r.decode_passes, r.prefill_tokens) == (one.order, one.raw_text, one.decode_passes,
                                                                           one.prefill_tokens)
    assert [r.slate_id for r in tiny_teacher.rank_all(batch, batch_size=2)] == [s["slate_id"] for s in batch]


def test_batched_free_decoding_keeps_each_rows_own_cap(tiny_teacher, slates):
    small = min(slates, key=lambda x: len(x["candidates"]))
    big = max(slates, key=lambda x: len(x["candidates"]))
    alone = tiny_teacher.rank(small, constrained=False)
    together = tiny_teacher.rank_batch([small, big], constrained=False)[0]
    assert (together.order, together.raw_text, together.decode_passes) == (alone.order, alone.raw_text,
                                                                          alone.decode_passes)
    assert together.decode_passes <= OrdinalGrammar(len(small["candidates"])).max_tokens()


def test_unconstrained_decoding_is_repaired(tiny_teacher, slates):
    s = max(slates, key=lambda x: len(x["candidates"]))
    r = tiny_teacher.rank(s, constrained=False)
    n = len(s["candidates"])
    assert sorted(r.order) == list(range(n))  # repaired into a permutation whatever was generated
    assert r.missing == n - len({int(t) for t in __import__("re").findall(r"\d+", r.raw_text)
                                 if not t.startswith("0") and 1 <= int(t) <= n})
    assert 1 <= r.decode_passes <= OrdinalGrammar(n).max_tokens()


def test_embedding_teacher_ranks_by_similarity(tmp_path):
    import numpy as np

    from hllm.errors import HllmError
    from hllm.teacher.embedding import EmbeddingRanker
    from hllm.testing import tiny_encoder, tiny_slates

    enc = tiny_encoder(tmp_path / "enc")
    slate = tiny_slates(1, 6, seed=3)[0]
    slate["candidates"][4]["title"] = slate["history"][1]  # an exact repeat of a history item
    r = EmbeddingRanker(enc, agg="max", threads=1)
    e = r.embed([slate["history"][1], "rose shimmer", slate["history"][1]])
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(e[0], e[2])
    res = r.rank(slate)
    assert res.order[0] == 4 and res.scores[4] == pytest.approx(1.0, abs=1e-5)  # cosine 1 with itself
    assert sorted(res.order) == list(range(6))
    assert all(res.scores[a] >= res.scores[b] for a, b in zip(res.order, res.order[1:]))
    # each aggregation is what it says: max and mean over the candidate × history cosine matrix
    cands = [c["title"] for c in slate["candidates"]]
    sim = r.embed(cands) @ r.embed(slate["history"]).T
    np.testing.assert_allclose(r.scores(slate), sim.max(1), atol=1e-6)
    r.agg = "mean"
    np.testing.assert_allclose(r.scores(slate), sim.mean(1), atol=1e-6)
    with pytest.raises(HllmError, match="needs a history"):
        r.rank(dict(slate, history=[]))
    with pytest.raises(HllmError, match="unknown aggregation"):
        EmbeddingRanker(enc, agg="sum")
