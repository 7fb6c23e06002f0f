"""Log-domain Sinkhorn operator and loss (paper §3.3)."""

import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from hllm.training.sinkhorn import log_sinkhorn, sinkhorn_loss
from hllm.training.targets import click_target, clicks_then_teacher, permutation_target


def test_rows_and_columns_sum_to_one_with_masking():
    g = torch.Generator().manual_seed(0)
    m = torch.randn(3, 6, 8, generator=g)
    n = torch.tensor([6, 4, 1])  # N < K and different N per slate
    s = log_sinkhorn(m, n, tau=1.0, iters=30).exp()
    for b, k in enumerate(n.tolist()):
        block = s[b, :k, :k]
        assert torch.allclose(block.sum(1), torch.ones(k), atol=1e-4)
        assert torch.allclose(block.sum(0), torch.ones(k), atol=1e-4)
        assert float(s[b].sum()) == pytest.approx(k, abs=1e-4)  # no mass outside the block


def test_no_overflow_at_tiny_tau():
    m = torch.randn(1, 5, 5) * 100
    s = log_sinkhorn(m, torch.tensor([5]), tau=1e-4, iters=5)
    assert torch.isfinite(s).all()


def test_approaches_max_weight_permutation_as_tau_shrinks():
    rng = np.random.default_rng(1)
    m = rng.normal(size=(7, 7))
    rows, cols = linear_sum_assignment(m, maximize=True)
    perm = np.zeros((7, 7))
    perm[rows, cols] = 1
    errs = []
    for tau in (1.0, 0.1, 0.01):
        s = log_sinkhorn(torch.tensor(m)[None].float(), torch.tensor([7]), tau=tau, iters=2000).exp()[0].numpy()
        errs.append(np.abs(s - perm).max())
    assert errs[0] > errs[1] > errs[2]
    assert errs[2] < 0.1
    assert (s.argmax(1) == cols).all()


def test_loss_falls_on_a_learnable_problem():
    torch.manual_seed(0)
    n, k = 5, 6
    m = torch.zeros(2, n, k, requires_grad=True)
    target = torch.zeros(2, n, k)
    target[0, :5, :5] = torch.from_numpy(permutation_target([3, 1, 4, 0, 2], 5))
    target[1, :3, :3] = torch.from_numpy(permutation_target([2, 0, 1], 3))
    n_items = torch.tensor([5, 3])
    opt = torch.optim.Adam([m], lr=0.1)
    first = None
    for _ in range(100):
        opt.zero_grad()
        loss = sinkhorn_loss(m, target, n_items, tau=1.0, iters=10)
        loss.backward()
        assert torch.isfinite(m.grad).all()
        first = float(loss) if first is None else first
        opt.step()
    assert float(loss) < 0.2 * first
    assert m.grad[1, 3:].abs().sum() == 0  # padding rows get no gradient


def test_loss_rejects_target_outside_block():
    t = torch.zeros(1, 3, 3)
    t[0, 2, 2] = 1
    with pytest.raises(ValueError, match="outside"):
        sinkhorn_loss(torch.zeros(1, 3, 3), t, torch.tensor([2]))


def test_click_target_is_doubly_stochastic_and_puts_clicks_on_top():
    p = click_target([0, 1, 0, 1, 0])
    assert np.allclose(p.sum(0), 1) and np.allclose(p.sum(1), 1)
    assert np.allclose(p[1, :2], 0.5) and np.allclose(p[1, 2:], 0)
    assert np.allclose(p[0, 2:], 1 / 3) and np.allclose(p[0, :2], 0)
    assert click_target([0, 0, 0]) is None and click_target([1, 1]) is None


def test_clicks_then_teacher_order():
    assert clicks_then_teacher([0, 1, 0, 1], [2, 3, 0, 1]) == [3, 1, 2, 0]
    assert clicks_then_teacher([0, 0], [1, 0]) is None
