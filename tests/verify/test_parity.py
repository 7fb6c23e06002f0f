"""Parity metrics on hand-made score matrices."""

import numpy as np
import pytest

from hllm.verify.parity import ParityReport, Thresholds, compare_slate, kendall_tau


def test_kendall_tau_values():
    a = np.array([0, 1, 2, 3])
    assert kendall_tau(a, a) == pytest.approx(1.0)
    assert kendall_tau(a, a[::-1]) == pytest.approx(-1.0)
    # one adjacent swap among 4 items: 1 discordant pair of 6 → tau = (5-1)/6
    assert kendall_tau(a, np.array([1, 0, 2, 3])) == pytest.approx(4 / 6)
    assert kendall_tau(np.array([0]), np.array([0])) == 1.0


def test_compare_identical_and_swapped():
    ref = np.eye(4) * 3
    rec = compare_slate(ref, ref.copy(), "s")
    assert rec["perm_match"] and rec["max_abs_diff"] == 0 and rec["top1_match"]
    swapped = ref[[1, 0, 2, 3]]
    rec = compare_slate(ref, swapped)
    assert not rec["perm_match"] and not rec["top1_match"]
    assert rec["max_abs_diff"] == pytest.approx(3.0)
    assert rec["top10_overlap"] == 1.0


def test_nonfinite_counted_and_fails():
    ref = np.eye(3)
    bad = ref.copy()
    bad[0, 1] = np.nan
    rec = compare_slate(ref, bad)
    assert rec["nonfinite"] == 1 and rec["test_order"] is None and not rec["perm_match"]
    rep = ParityReport([rec], Thresholds())
    assert not rep.passed
    names = {f["criterion"] for f in rep.failures()}
    assert {"nonfinite", "perm_match_rate"} <= names


def test_report_says_by_how_much():
    ref = np.eye(3)
    rec = compare_slate(ref, ref + 0.01)
    rep = ParityReport([rec], Thresholds(atol=1e-3))
    (f,) = rep.failures()
    assert f["criterion"] == "max_abs_diff" and f["missed_by"] == pytest.approx(0.009)
    assert ParityReport([rec], Thresholds(atol=0.02)).passed
