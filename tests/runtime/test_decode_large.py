"""LAPJV decode is optimal at any finite magnitude.

``lap.lapjv`` used on raw costs of magnitude ≥ 1e6 returned non-optimal assignments (its internal
"infinity" is 1e6); decode scales each slate by a power of two first. Property test against
``scipy.optimize.linear_sum_assignment`` over seeded random matrices of several structures and
magnitudes 1e-30 … 1e300 (no hypothesis in the venv: seeded numpy loops).
"""

import numpy as np
import pytest

from hllm.runtime.decode import assignment_scores, check_permutation, decode, decode_batch

scipy_optimize = pytest.importorskip("scipy.optimize", reason="scipy is the reference solver of this test")

MAGNITUDES = (1e-30, 1e-10, 1e-3, 1.0, 1e3, 1e6, 1e9, 1e12, 1e100, 1e300)
KINDS = ("normal", "integer", "rank1", "offset")


def _matrix(rng: np.random.Generator, kind: str, n: int, mag: float) -> np.ndarray:
    if kind == "normal":
        return rng.standard_normal((n, n)) * mag
    if kind == "integer":  # many exact ties
        return rng.integers(-3, 4, (n, n)).astype(np.float64) * mag
    if kind == "rank1":  # item quality × position weight: near-degenerate
        return np.outer(rng.random(n), np.sort(rng.random(n))[::-1]) * mag
    return mag + rng.standard_normal((n, n)) * (mag * 1e-6)  # large common offset, small differences


def _best_total(m: np.ndarray) -> float:
    rows, cols = scipy_optimize.linear_sum_assignment(m, maximize=True)
    return float(m[rows, cols].sum())


def _tolerance(m: np.ndarray) -> float:
    # rounding of an n-term float64 sum of values up to max|m|
    return 8 * m.shape[0] * np.finfo(np.float64).eps * float(np.abs(m).max())


def test_scores_in_the_millions_are_decoded_optimally():
    """The reported 2×2 case: the identity earns 0 + 2e6, the swap 3e6 − 5e6; the identity must win."""
    m = np.array([[0.0, 3e6], [-5e6, 2e6]])
    ranking = decode(m)
    assert ranking.tolist() == [0, 1]
    assert assignment_scores(m, ranking).sum() == 2e6


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mag", MAGNITUDES)
def test_optimal_against_scipy_at_every_magnitude(kind, mag):
    rng = np.random.default_rng(100 * KINDS.index(kind) + MAGNITUDES.index(mag))
    for _ in range(40):
        n = int(rng.integers(2, 25))
        m = _matrix(rng, kind, n, mag)
        ranking = decode(m)
        check_permutation(ranking, n)
        got = float(assignment_scores(m, ranking).sum())
        assert got >= _best_total(m) - _tolerance(m), (kind, mag, n)


@pytest.mark.parametrize("mag", (1e-30, 1.0, 1e6, 1e12))
def test_batch_path_scales_each_slate_on_its_own(mag):
    """Slates of very different magnitudes in one batch: each is optimal (per-slate scale)."""
    rng = np.random.default_rng(7)
    n, k = 6, 8
    mags = [mag, 1.0, mag * 1e6, 1e-6]
    scores = np.stack([rng.standard_normal((n, k)) * s for s in mags])
    rankings = decode_batch(scores, [n] * len(mags))
    for b, r in enumerate(rankings):
        m = scores[b, :n, :n]
        assert float(assignment_scores(m, r).sum()) >= _best_total(m) - _tolerance(m)
        assert r.tolist() == decode(scores[b], n).tolist()


def test_float32_engine_scores_large():
    rng = np.random.default_rng(3)
    for _ in range(30):
        m = (rng.standard_normal((10, 12)) * 1e7).astype(np.float32)
        r = decode(m, 10)
        m64 = m[:10, :10].astype(np.float64)
        assert float(assignment_scores(m64, r).sum()) >= _best_total(m64) - _tolerance(m64)


def test_extremes_do_not_overflow():
    m = np.array([[1.7e308, -1.7e308], [-1.7e308, 1.7e308]])
    assert decode(m).tolist() == [0, 1]
    assert decode(np.zeros((3, 3))).tolist() in ([0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0])
