"""The sequential gate: passes early once every bound clears its margin, fails early by futility, otherwise
uses every slate; the report says how many slates it needed. Synthetic score matrices, no engine."""

from __future__ import annotations

import numpy as np

from hllm.verify.gate import GateThresholds
from hllm.verify.sequential import SEQUENTIAL_LOOKS, look_thresholds, sequential_gate


def _slates(n: int, items: int = 8, seed: int = 0):
    """``n`` labelled slates and reference matrices ``[items, K=items]`` whose optimal assignment ranks
    the positive first (so the reference's quality is high and a broken graph's is low)."""
    rng = np.random.default_rng(seed)
    slates, ref = [], []
    for i in range(n):
        labels = [0] * items
        labels[int(rng.integers(items))] = 1
        m = rng.normal(0.0, 1.0, (items, items)).astype(np.float32)
        m[labels.index(1), 0] += 6.0  # the positive's score at rank 1 dominates
        slates.append({"slate_id": f"s{i}", "candidates": [f"c{j}" for j in range(items)], "labels": labels})
        ref.append(m)
    return slates, ref


class _Scorer:
    """Scores slates by index through ``fn(i, ref_i)``; counts the slates it was asked for."""

    def __init__(self, slates, ref, fn):
        self.index = {s["slate_id"]: i for i, s in enumerate(slates)}
        self.ref, self.fn, self.calls = ref, fn, 0

    def __call__(self, part):
        self.calls += len(part)
        return [self.fn(self.index[s["slate_id"]], self.ref[self.index[s["slate_id"]]]) for s in part]


def test_an_identical_candidate_passes_at_the_first_look_with_a_quarter_of_the_slates():
    slates, ref = _slates(200)
    scorer = _Scorer(slates, ref, lambda i, m: m.copy())
    rep = sequential_gate(ref, scorer, slates, GateThresholds(), block=10)
    seq = rep.to_dict()["sequential"]
    assert rep.passed and seq["decision"] == "pass-early"
    assert seq["slates_needed"] == scorer.calls == 50 and seq["slates_available"] == 200
    assert seq["looks"] == [50, 100, 150, 200]
    assert abs(seq["confidence_per_look"] - (1 - 0.05 / len(SEQUENTIAL_LOOKS))) < 1e-12
    assert len(rep.records) == 50 and "slates_scored" not in {c.name for c in rep.criteria_report()}


def test_a_broken_candidate_fails_early_and_says_why():
    slates, ref = _slates(200, seed=1)
    rng = np.random.default_rng(9)
    scorer = _Scorer(slates, ref, lambda i, m: rng.normal(0, 1, m.shape).astype(np.float32))
    rep = sequential_gate(ref, scorer, slates, GateThresholds(), block=10)
    seq = rep.to_dict()["sequential"]
    assert not rep.passed and seq["decision"] == "fail-early" and scorer.calls == seq["slates_needed"] < 200
    assert rep.stop_reason and ("tau" in rep.stop_reason or "regret" in rep.stop_reason)


def test_a_candidate_that_never_clears_a_bound_uses_every_slate():
    """Too few labelled slates for the bounds at any look (the first 190 are unlabelled): no early pass;
    the tested graph agrees everywhere, so no futility either: it runs to the last slate."""
    slates, ref = _slates(200, seed=2)
    for s in slates[:190]:
        s.pop("labels")
    scorer = _Scorer(slates, ref, lambda i, m: m.copy())
    rep = sequential_gate(ref, scorer, slates, GateThresholds(), block=10)
    seq = rep.to_dict()["sequential"]
    assert seq["decision"] == "all-slates" and seq["slates_needed"] == scorer.calls == 200 and rep.passed


def test_the_margins_and_the_floor_are_unchanged_only_the_per_look_confidence_moves():
    th = GateThresholds(auc_margin=0.004, min_tau=0.8, max_regret_p95=2e-3)
    lt = look_thresholds(th, 4)
    assert (lt.auc_margin, lt.ndcg10_margin, lt.recall10_margin, lt.min_tau, lt.max_regret_p95) == (
        0.004, 0.01, 0.01, 0.8, 2e-3)
    assert abs(lt.confidence - 0.9875) < 1e-12


def test_strict_mode_keeps_the_fail_fast_stream():
    slates, ref = _slates(40, seed=3)
    scorer = _Scorer(slates, ref, lambda i, m: m.copy())
    rep = sequential_gate(ref, scorer, slates, GateThresholds(mode="strict"), block=10)
    assert rep.passed and scorer.calls == 40 and "sequential" not in rep.to_dict()
