"""Ranking metrics against values computed by hand on tiny slates."""

import math

import pytest

from hllm.errors import HllmError, SlateError
from hllm.verify.metrics import evaluate, order_from_scores, slate_metrics


def test_perfect_ranking():
    m = slate_metrics([2, 0, 1, 3], [0, 0, 1, 0])
    assert m == {"auc": 1.0, "recall@1": 1.0, "recall@10": 1.0, "ndcg@1": 1.0, "ndcg@10": 1.0}


def test_worst_ranking():
    m = slate_metrics([0, 1, 3, 2], [0, 0, 1, 0])
    assert m["auc"] == 0.0 and m["recall@1"] == 0.0 and m["ndcg@1"] == 0.0
    assert m["recall@10"] == 1.0  # 4 candidates: all in the top 10
    assert m["ndcg@10"] == pytest.approx(1 / math.log2(5))  # positive at 0-based position 3


def test_hand_computed_two_positives():
    # labels: items 1 and 3 positive; order puts item 1 first, item 3 fourth (of 5).
    order, labels = [1, 0, 2, 3, 4], [0, 1, 0, 1, 0]
    m = slate_metrics(order, labels)
    # pairs (pos, neg): item1 above all 3 negatives; item3 above only item4 → 4/6
    assert m["auc"] == pytest.approx(4 / 6)
    assert m["recall@1"] == pytest.approx(0.5)
    assert m["ndcg@1"] == pytest.approx(1.0)
    dcg = 1 / math.log2(2) + 1 / math.log2(5)
    idcg = 1 / math.log2(2) + 1 / math.log2(3)
    assert m["ndcg@10"] == pytest.approx(dcg / idcg)


def test_tied_scores_keep_original_order():
    order = order_from_scores([0.5, 0.5, 0.5, 0.5])
    assert order == [0, 1, 2, 3]
    m = slate_metrics(order, [0, 0, 1, 0])  # positive third: above one of three negatives
    assert m["auc"] == pytest.approx(1 / 3)
    assert m["ndcg@10"] == pytest.approx(1 / math.log2(4))
    assert order_from_scores([0.1, 0.9, 0.9, 0.2]) == [1, 2, 3, 0]


def test_recall_at_10_cuts_long_slates():
    labels = [0] * 20
    labels[15] = 1
    m = slate_metrics(list(range(20)), labels)
    assert m["recall@10"] == 0.0 and m["ndcg@10"] == 0.0
    assert m["auc"] == pytest.approx(4 / 19)


def test_evaluate_means_and_skips():
    rep = evaluate([[0, 1], [1, 0], [0, 1]], [[1, 0], [1, 0], [0, 0]])
    assert rep.slates == 2 and rep.skipped == 1
    assert rep.values["auc"] == pytest.approx(0.5)
    assert rep.to_dict()["recall@1"] == pytest.approx(0.5)


def test_bad_ranking_is_named():
    with pytest.raises(SlateError, match="permutation"):
        slate_metrics([0, 0, 1], [1, 0, 0])


def test_paired_difference_by_hand_and_its_interval():
    from hllm.verify.metrics import paired_difference

    labels = [[0, 0, 1, 0], [0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]]  # the last slate has no positive
    a = [[0, 1, 3, 2], [1, 0, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3]]       # AUC 0, 1, 1
    b = [[2, 0, 1, 3], [0, 1, 2, 3], [0, 1, 2, 3], [3, 2, 1, 0]]       # AUC 1, 2/3, 1
    d = paired_difference(a * 4, b * 4, labels * 4, resamples=500)  # 12 comparable slates
    assert d.slates == 12
    assert d.delta["auc"] == pytest.approx((1 + (2 / 3 - 1) + 0) / 3)
    assert d.delta["recall@1"] == pytest.approx((1 - 1 + 0) / 3)
    lo, hi = d.ci95["auc"]
    assert -1 / 3 <= lo <= d.delta["auc"] <= hi <= 1.0
    same = paired_difference(a * 4, a * 4, labels * 4)  # a ranker against itself: exactly 0, interval [0, 0]
    assert same.delta["auc"] == 0.0 and same.ci95["auc"] == (0.0, 0.0)
    few = paired_difference(a, b, labels)  # 3 slates: the mean, but no interval to over-read
    assert few.slates == 3 and few.delta["auc"] == pytest.approx(d.delta["auc"]) and few.ci95 is None
    with pytest.raises(SlateError, match="same slates"):
        paired_difference(a, b[:2], labels)
    none = paired_difference(a[3:], b[3:], labels[3:]).to_dict()  # no slate with a positive and a negative
    assert none == {"delta": dict.fromkeys(none["delta"]), "slates": 0, "ci95": None}


def test_eval_pairs_every_ranker_with_the_first(tmp_path):
    import json

    from hllm.testing import tiny_slates
    from hllm.training.eval import evaluate_rankers

    slates = tiny_slates(30, 6, seed=3)
    best = tmp_path / "best.jsonl"  # positives first: AUC 1 on every slate
    best.write_text("".join(json.dumps({"slate_id": s["slate_id"], "order": sorted(range(6), key=lambda i: -s["labels"][i])})
                            + "\n" for s in slates))
    res = evaluate_rankers(["r0=random", "same=random", f"best={best}"], slates, seed=1)
    with pytest.raises(HllmError, match="'r0' is given more than once"):
        evaluate_rankers(["r0=random", f"r0={best}"], slates)
    assert "paired_vs_first" not in res["rankers"]["r0"]
    same = res["rankers"]["same"]["paired_vs_first"]  # same seed → same orders → exactly zero
    assert same["baseline"] == "r0" and same["slates"] == 30 and same["delta"]["auc"] == 0.0
    pair = res["rankers"]["best"]["paired_vs_first"]
    assert res["rankers"]["best"]["auc"] == 1.0 and res["rankers"]["r0"]["auc"] < 0.8
    assert pair["delta"]["auc"] == pytest.approx(1.0 - res["rankers"]["r0"]["auc"], abs=1e-5)
    assert 0 < pair["ci95"]["auc"][0] <= pair["delta"]["auc"] <= pair["ci95"]["auc"][1]
