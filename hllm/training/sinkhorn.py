"""Sinkhorn relaxation of the score matrix and the distillation loss (paper §3.3), log domain.

    S⁽⁰⁾ = exp(M / τ);  S⁽ˡ⁺¹⁾ = col_norm(row_norm(S⁽ˡ⁾)), l < L;  loss = −Σ P ⊙ log S⁽ᴸ⁾

Everything runs on ``log S`` with ``logsumexp`` (Mena et al. 2018, "Learning latent permutations
with Gumbel-Sinkhorn networks"), so no exp can overflow however small τ is.

Masking: a slate with n real items uses only the square block ``[:n, :n]`` of its ``[N, K]`` score
matrix (items beyond n are padding; rank positions beyond n cannot be filled when N < K). Entries
outside the block are held at a large negative finite value (not -inf, which would give NaN
gradients through logsumexp of an empty row), so they carry zero mass and the real block becomes
doubly stochastic.
"""

from __future__ import annotations

import torch

_NEG = -1e9


def block_mask(n_items: torch.Tensor, num_rows: int, num_cols: int) -> torch.Tensor:
    """``[B, N, K]`` bool: True where row < n and column < n (the real n×n block of each slate).

    Args: n_items ``[B]`` int, real items per slate; num_rows N; num_cols K (n ≤ min(N, K)).
    """
    rows = torch.arange(num_rows, device=n_items.device)[None, :, None] < n_items[:, None, None]
    cols = torch.arange(num_cols, device=n_items.device)[None, None, :] < n_items[:, None, None]
    return rows & cols


def log_sinkhorn(scores: torch.Tensor, n_items: torch.Tensor, tau: float = 1.0, iters: int = 20) -> torch.Tensor:
    """Log of the Sinkhorn-normalised matrix.

    Args:
        scores: M ``[B, N, K]`` float (padding rows arbitrary).
        n_items: ``[B]`` int64, real items per slate (1 ≤ n ≤ min(N, K)).
        tau: temperature τ > 0 (τ → 0 approaches the max-weight permutation).
        iters: L, row+column normalisation rounds (≥ 1).
    Returns: ``log S`` ``[B, N, K]`` float32; inside each real n×n block ``exp`` has rows and columns
        summing to 1 (after the final column step columns are exact, rows converge with L);
        outside the block the value is -1e9.
    Raises: ValueError for τ ≤ 0, iters < 1, or n outside 1..min(N, K).
    """
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    if iters < 1:
        raise ValueError(f"iters must be ≥ 1, got {iters}")
    b, n_rows, n_cols = scores.shape
    if n_items.numel() != b or int(n_items.min()) < 1 or int(n_items.max()) > min(n_rows, n_cols):
        raise ValueError(f"n_items must hold B={b} values in 1..{min(n_rows, n_cols)}, got {n_items.tolist()}")
    mask = block_mask(n_items, n_rows, n_cols)
    x = torch.where(mask, scores.float() / tau, torch.full((), _NEG))
    for _ in range(iters):
        x = x - torch.logsumexp(x, dim=2, keepdim=True)
        x = torch.where(mask, x, torch.full((), _NEG))
        x = x - torch.logsumexp(x, dim=1, keepdim=True)
        x = torch.where(mask, x, torch.full((), _NEG))
    return x


def sinkhorn_loss(scores: torch.Tensor, target: torch.Tensor, n_items: torch.Tensor, tau: float = 1.0,
                  iters: int = 20) -> torch.Tensor:
    """Distillation loss ``−Σ P ⊙ log S⁽ᴸ⁾`` per slate divided by n, averaged over the batch.

    Args:
        scores: M ``[B, N, K]``.
        target: P ``[B, N, K]`` float, zero outside each real n×n block; rows of the block sum to 1
            (a permutation matrix, or the doubly-stochastic click target of
            :func:`hllm.training.targets.click_target`).
        n_items: ``[B]`` int64.
        tau, iters: see :func:`log_sinkhorn`.
    Returns: scalar float32 loss (mean cross-entropy per item, nats).
    Raises: ValueError if shapes differ or ``target`` has mass outside the real block.
    """
    if target.shape != scores.shape:
        raise ValueError(f"target shape {tuple(target.shape)} ≠ scores shape {tuple(scores.shape)}")
    log_s = log_sinkhorn(scores, n_items, tau, iters)
    mask = block_mask(n_items, scores.shape[1], scores.shape[2])
    if bool((target.masked_select(~mask) != 0).any()):
        raise ValueError("target has mass outside the real n×n block of its slate")
    per_slate = -(target * torch.where(mask, log_s, torch.zeros(()))).sum(dim=(1, 2)) / n_items.float()
    return per_slate.mean()
