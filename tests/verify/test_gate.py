"""The gate: quality non-inferiority (paired bootstrap), the fidelity floor (Kendall tau, assignment regret,
finite scores), the strict agreement rule, and the sequential fail-fast — on planted score matrices."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hllm.verify.gate import GateThresholds, assignment_regret, gate_scores
from hllm.verify.sequential import gate_stream, hopeless

N_ITEMS = 20


def _slates(n: int, seed: int = 0):
    """Planted slates: reference scores ``M[i, p] = q_i · w_p`` (the optimum sorts items by quality q),
    the positive item at reference rank 2..4, and near-ties: the top two items, and the two items just
    below the positive, differ in q by 1e-5."""
    rng = np.random.default_rng(seed)
    w = np.linspace(1.0, 0.05, N_ITEMS)
    slates, refs, ranks = [], [], []
    for s in range(n):
        q = np.linspace(1.0, 0.0, N_ITEMS)
        q[1] = q[0] - 1e-5
        r = int(rng.integers(2, 5))  # the positive's rank
        for j in (r + 1, r + 2):  # near-ties right below the positive
            q[j] = q[r] - 1e-5 * (j - r)
        perm = rng.permutation(N_ITEMS)  # item perm[k] has the k-th best quality
        qi = np.empty(N_ITEMS)
        qi[perm] = q
        labels = [0] * N_ITEMS
        labels[int(perm[r])] = 1
        slates.append({"slate_id": f"s{s}", "labels": labels})
        refs.append(np.outer(qi, w).astype(np.float32))
        ranks.append(perm)
    return slates, refs, ranks


def _swap_rows(m: np.ndarray, a: int, b: int) -> np.ndarray:
    out = m.copy()
    out[[a, b]] = out[[b, a]]
    return out


def _broken(refs, seed=1):
    """An engine that breaks rankings: each slate's rows shuffled."""
    rng = np.random.default_rng(seed)
    return [m[rng.permutation(m.shape[0])] for m in refs]


def _tie_flipper(refs, ranks):
    """Swaps the two near-tied top items on every slate: the top item changes, the ranking is as good."""
    return [_swap_rows(m, int(p[0]), int(p[1])) for m, p in zip(refs, ranks)]


def _degrader(refs, ranks, slates):
    """Demotes the positive two places, below the near-tied items under it: few discordant pairs and
    little objective lost (tau high, regret tiny), but the labelled item drops on every slate."""
    out = []
    for m, p, s in zip(refs, ranks, slates):
        r = int(np.flatnonzero(np.asarray(s["labels"])[p])[0])
        out.append(_swap_rows(m, int(p[r]), int(p[r + 2])))
    return out


def _by_name(rep):
    return {c["name"]: c for c in rep.to_dict()["criteria"]}


def test_regret_by_hand():
    m = np.array([[3.0, 1.0, 0.0], [2.0, 2.0, 1.0], [0.0, 1.0, 2.0]])
    best = [0, 1, 2]  # J = 3 + 2 + 2 = 7; mean over the 6 permutations = 12 / 3 = 4
    assert assignment_regret(m, best, best) == 0.0
    assert assignment_regret(m, best, [1, 0, 2]) == pytest.approx((7 - (2 + 1 + 2)) / (7 - 4))
    assert assignment_regret(m, best, [2, 1, 0]) == pytest.approx((7 - (0 + 2 + 0)) / 3)  # worse than random: > 1
    assert assignment_regret(m, best, None) == float("inf")
    assert assignment_regret(np.ones((3, 3)), best, [2, 1, 0]) == 0.0  # every permutation is optimal


def test_identical_scores_pass_both_modes():
    slates, refs, _ = _slates(40)
    for mode in ("quality", "strict"):
        rep = gate_scores(refs, [m.copy() for m in refs], slates, GateThresholds(mode=mode))
        d = rep.to_dict()
        assert rep.passed and d["strict_passed"] and d["failures"] == [], d["failures"]
        assert d["fidelity"]["regret_p95"] == 0.0 and d["kendall_tau_mean"] == 1.0
        assert d["quality"]["auc"]["interval"] == [0.0, 0.0]
    json.dumps(d, allow_nan=False)


def test_engine_that_breaks_rankings_fails_the_fidelity_floor():
    slates, refs, _ = _slates(40)
    rep = gate_scores(refs, _broken(refs), slates)
    c = _by_name(rep)
    assert not rep.passed
    assert c["kendall_tau_mean"]["passed"] is False and c["kendall_tau_mean"]["value"] < 0.5
    assert c["regret_p95"]["passed"] is False and c["regret_p95"]["value"] > 0.3
    assert c["regret_p95"]["missed_by"] == pytest.approx(c["regret_p95"]["value"] - 1e-3)
    failed = {f["criterion"] for f in rep.to_dict()["failures"]}
    assert {"kendall_tau_mean", "regret_p95"} <= failed


def test_tie_flipper_passes_the_quality_gate_and_fails_strict_agreement():
    slates, refs, ranks = _slates(40)
    flipped = _tie_flipper(refs, ranks)
    rep = gate_scores(refs, flipped, slates)
    d, c = rep.to_dict(), _by_name(rep)
    assert rep.passed, d["failures"]
    assert c["kendall_tau_mean"]["passed"] and c["kendall_tau_mean"]["value"] == pytest.approx(1 - 2 / 190)
    assert c["regret_p95"]["passed"] and 0 < c["regret_p95"]["value"] < 1e-4
    # (c) is reported in quality mode, not required: top-1 and permutations all differ
    assert c["top1_agreement"]["value"] == 0.0 and c["top1_agreement"]["passed"] is False
    assert not c["top1_agreement"]["required"] and d["perm_match_rate"] == 0.0 and d["strict_passed"] is False
    strict = gate_scores(refs, flipped, slates, GateThresholds(mode="strict"))
    assert not strict.passed
    assert [f.criterion for f in strict.failures()] == ["top1_agreement"]
    assert strict.failures()[0].missed_by == pytest.approx(0.97)


def test_quality_degrader_with_high_tau_fails_non_inferiority():
    slates, refs, ranks = _slates(60)
    rep = gate_scores(refs, _degrader(refs, ranks, slates), slates)
    d, c = rep.to_dict(), _by_name(rep)
    assert not rep.passed
    assert c["kendall_tau_mean"]["passed"] and c["kendall_tau_mean"]["value"] > 0.95  # (b) holds
    assert c["regret_p95"]["passed"] and c["nonfinite"]["passed"]
    for m, margin in (("auc", 0.005), ("ndcg@10", 0.01)):
        q = c[f"{m}_delta"]
        lo, hi = q["interval"]
        assert q["passed"] is False and q["required"] and q["tested"] == lo and lo - 1e-12 <= q["value"] <= hi + 1e-12
        assert q["value"] < -margin and q["missed_by"] == pytest.approx(-margin - lo)
    assert d["quality"]["auc"]["delta"] == pytest.approx(-2 / 19)  # two negatives now rank above the positive
    assert {f["criterion"] for f in d["failures"]} >= {"auc_delta", "ndcg@10_delta"}


def test_non_finite_scores_fail_and_are_json_safe():
    slates, refs, _ = _slates(12)
    bad = [m.copy() for m in refs]
    bad[3][0, 0] = np.nan
    rep = gate_scores(refs, bad, slates)
    d = rep.to_dict()
    assert not rep.passed and d["nonfinite"] == 1 and "nonfinite" in {f["criterion"] for f in d["failures"]}
    assert d["fidelity"]["regret_max"] is None or d["fidelity"]["regret_max"] > 1e300  # +inf → finite max or None
    json.dumps(d, allow_nan=False)


def test_few_labelled_slates_leave_quality_unchecked():
    slates, refs, ranks = _slates(8)
    rep = gate_scores(refs, _degrader(refs, ranks, slates), slates)
    c = _by_name(rep)
    assert c["auc_delta"]["passed"] is None and not c["auc_delta"]["required"] and "needs 10" in c["auc_delta"]["note"]
    assert rep.to_dict()["quality"] == {}


def test_thresholds_refuse_unknown_mode_and_out_of_range_limits():
    for kw in ({"mode": "loose"}, {"auc_margin": -0.1}, {"max_regret_p95": 2.0}, {"confidence": 0.4},
               {"futility_alpha": 0.0}, {"resamples": 10}, {"min_tau": 1.5}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            GateThresholds(**kw)


# -- sequential fail-fast ------------------------------------------------------------------------------

def _stream(refs, test, slates, th=None, chunk=5):
    calls = []

    def score(part):
        i = sum(calls)
        calls.append(len(part))
        return [test[i + j] for j in range(len(part))]

    rep = gate_stream(refs, score, slates, th, fail_fast=True, chunk=chunk)
    return rep, sum(calls)


def test_fail_fast_stops_a_broken_engine_after_one_chunk_and_never_stops_a_passing_one():
    slates, refs, ranks = _slates(80)
    rep, scored = _stream(refs, _broken(refs), slates)
    d = rep.to_dict()
    assert scored == 5 and not rep.passed and d["stopped_after"] == 5 and "p95 regret" in d["stop_reason"]
    assert "slates_scored" in {f["criterion"] for f in d["failures"]}
    rep, scored = _stream(refs, _tie_flipper(refs, ranks), slates)
    assert scored == 80 and rep.passed
    # strict: one top-1 miss of 80 allowed at 0.97 × 80 → the second miss (slate 2) stops it
    rep, scored = _stream(refs, _tie_flipper(refs, ranks), slates, GateThresholds(mode="strict"))
    assert scored == 5 and "top-1" in rep.stop_reason and not rep.passed


def test_fail_fast_futility_look_stops_a_quality_degrader_early():
    slates, refs, ranks = _slates(80)
    rep, scored = _stream(refs, _degrader(refs, ranks, slates), slates)
    assert scored == 20 and rep.stop_reason.startswith("futility") and not rep.passed  # the 25% look
    # the exact rules never use the bootstrap: the same engine scored in full fails (a) the same way
    full = gate_scores(refs, _degrader(refs, ranks, slates), slates)
    assert not full.passed and {f.criterion for f in full.failures()} >= {"auc_delta"}


def test_hopeless_exact_regret_rule_counts_the_remaining_slates_as_perfect():
    slates, refs, _ = _slates(20)
    rep = gate_scores(refs[:2], _broken(refs[:2]), slates[:2], GateThresholds(min_tau=None))
    # 2 slates with large regret out of 20: p95 over 18 zeros + 2 large is still above 1e-3
    assert "p95 regret" in hopeless(rep, 20)
    # out of 100 planned slates, 2 bad ones can still sit above the 95th percentile
    assert hopeless(rep, 100) is None


def test_frontier_table_shows_the_gate_verdict_bounds_regret_and_strict_figures():
    from hllm.bench.frontier import gate_summary, markdown_table

    slates, refs, ranks = _slates(40)
    g = gate_scores(refs, _tie_flipper(refs, ranks), slates).to_dict()
    s = gate_summary(g)
    assert s["gate"] == "quality" and s["passed"] is True and s["strict_passed"] is False
    assert s["auc_lb"] == g["quality"]["auc"]["lower_bound"] and s["top1_agreement"] == 0.0
    assert gate_summary({"top1_agreement": "high", "passed": 1}) == {**gate_summary(None)}  # not numbers → None
    doc = {"rows": [{"name": "bf16", "s_per_slate": 0.5, "vs_torch_fp32": 2.0, "dtype": "bf16",
                     "gemm_peak_fraction": None, "gate": g}]}
    row = markdown_table(doc).splitlines()[-1].split(" | ")
    assert row[3] == "—"  # no ONNX Runtime fp32 contender to compare with
    assert row[5:] == ["quality pass", "+0.0000", "+0.0000", f"{1 - 2 / 190:.3f}", f"{s['regret_p95']:.2g}", "0.00 ✗ |"]
