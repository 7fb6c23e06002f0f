"""LAPJV decode: N=1, ties, N<K, non-finite, optimality against brute force."""

import itertools

import numpy as np
import pytest

from hllm.errors import DecodeError
from hllm.runtime.decode import assignment_scores, check_permutation, decode, decode_batch


def brute_force_best(m: np.ndarray) -> float:
    n = m.shape[0]
    return max(sum(m[p[j], j] for j in range(n)) for p in itertools.permutations(range(n)))


def test_single_item():
    assert decode(np.array([[3.0, -1.0]]), 1).tolist() == [0]


def test_identity_when_diagonal_dominates():
    m = np.eye(5) * 10
    assert decode(m).tolist() == [0, 1, 2, 3, 4]


def test_reads_positions_not_rows():
    # item 2 belongs at position 0, item 0 at position 1, item 1 at position 2
    m = np.zeros((3, 3))
    m[2, 0] = m[0, 1] = m[1, 2] = 5.0
    assert decode(m).tolist() == [2, 0, 1]


@pytest.mark.parametrize("n", [2, 3, 5, 6])
def test_optimal_against_brute_force(n):
    rng = np.random.default_rng(n)
    m = rng.normal(size=(n, n)).astype(np.float32)
    order = decode(m)
    check_permutation(order, n)
    assert assignment_scores(m, order).sum() == pytest.approx(brute_force_best(m.astype(np.float64)), abs=1e-5)


def test_n_less_than_k_uses_first_n_columns():
    rng = np.random.default_rng(0)
    m = rng.normal(size=(4, 10))
    m[:, 4:] = 100.0  # huge scores in unused positions must not matter
    order = decode(m, 4)
    assert sorted(order.tolist()) == [0, 1, 2, 3]
    assert assignment_scores(m, order).sum() == pytest.approx(brute_force_best(m[:, :4]))


def test_padding_rows_ignored():
    m = np.full((6, 6), np.nan)
    m[:3, :3] = np.eye(3)
    assert decode(m, 3).tolist() == [0, 1, 2]


def test_ties_are_deterministic_permutations():
    m = np.ones((5, 5))
    a, b = decode(m), decode(m.copy())
    check_permutation(a, 5)
    assert a.tolist() == b.tolist()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_refused(bad):
    m = np.zeros((3, 3))
    m[1, 2] = bad
    with pytest.raises(DecodeError, match="non-finite"):
        decode(m)


def test_more_items_than_positions_refused():
    with pytest.raises(DecodeError, match="rank positions"):
        decode(np.zeros((5, 3)), 5)


def test_bad_shapes_refused():
    with pytest.raises(DecodeError):
        decode(np.zeros(3))
    with pytest.raises(DecodeError):
        decode(np.zeros((3, 3)), 0)


def test_batch_names_failing_slate():
    s = np.zeros((2, 3, 3))
    s[1, 0, 0] = np.nan
    with pytest.raises(DecodeError, match="batch position 1"):
        decode_batch(s, [3, 3])
    out = decode_batch(np.stack([np.eye(3), np.eye(3)[::-1]]), [3, 2])
    assert out[0].tolist() == [0, 1, 2] and sorted(out[1].tolist()) == [0, 1]
