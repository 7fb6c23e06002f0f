"""The three scoring heads of the paper (§3.3), one interface:

    forward(items [B, N, D] float, item_mask [B, N] bool, context [B, D] float | None) → scores M [B, N, K] float32

Rows of masked (padding) items are set to 0. With ``HeadSpec.context`` every head also reads the user
context vector (the final hidden state at the last user-context token): the self-attention and
slot-query heads see it as one more key/value token, the linear probe adds its projection to each
item's. Attention is written with explicit reshapes and
``torch.nn.functional.scaled_dot_product_attention`` rather than ``nn.MultiheadAttention`` so that
N stays dynamic under every ONNX exporter (the legacy exporter bakes N into
``nn.TransformerEncoder``). Attention masks are boolean (True = may attend); every slate has at
least one real item, so no attention row is fully masked. LayerNorm and softmax run in float32.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from hllm.formats.checkpoint import HeadSpec


class _Attention(nn.Module):
    """Multi-head attention: queries ``[B, Q, d]`` over keys/values ``[B, N, d]`` with key mask ``[B, N]``."""

    def __init__(self, d_model: int, num_heads: int):
        super().__init__()
        self.h = num_heads
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.o = nn.Linear(d_model, d_model)

    def forward(self, x_q: torch.Tensor, x_kv: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        b, nq, d = x_q.shape
        nk = x_kv.shape[1]
        dh = d // self.h
        q = self.q(x_q).reshape(b, nq, self.h, dh).transpose(1, 2)
        k = self.k(x_kv).reshape(b, nk, self.h, dh).transpose(1, 2)
        v = self.v(x_kv).reshape(b, nk, self.h, dh).transpose(1, 2)
        mask = key_mask[:, None, None, :]  # [B, 1, 1, N] bool, broadcast over heads and queries
        a = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask).to(x_q.dtype)
        return self.o(a.transpose(1, 2).reshape(b, nq, d))


#: ``HeadSpec.act`` → the function (GELU exact, as ``nn.TransformerEncoderLayer(activation="gelu")``).
ACTIVATION_FNS = {"none": lambda x: x, "relu": F.relu, "gelu": F.gelu, "silu": F.silu}


class _Block(nn.Module):
    """Transformer block: attention + MLP, both residual. Pre-LayerNorm (``norm_first``, hllm's own):
    ``x + attn(ln1(x)); x + ff(ln2(x))``; post-LayerNorm (``nn.TransformerEncoderLayer``'s default):
    ``ln1(x + attn(x)); ln2(x + ff(x))``. With ``kv`` (slot-query) the attention reads ``kv`` unnormalised."""

    def __init__(self, spec: HeadSpec):
        super().__init__()
        self.norm_first = spec.norm_first
        self.act = ACTIVATION_FNS[spec.act]
        self.norm1 = nn.LayerNorm(spec.d_model)
        self.attn = _Attention(spec.d_model, spec.num_heads)
        self.norm2 = nn.LayerNorm(spec.d_model)
        self.ff1 = nn.Linear(spec.d_model, spec.ff_dim)
        self.ff2 = nn.Linear(spec.ff_dim, spec.d_model)

    def forward(self, x: torch.Tensor, kv: torch.Tensor | None, key_mask: torch.Tensor) -> torch.Tensor:
        if not self.norm_first:
            x = _ln(self.norm1, x + self.attn(x, x if kv is None else kv, key_mask))
            return _ln(self.norm2, x + self.ff2(self.act(self.ff1(x))))
        h = _ln(self.norm1, x)
        x = x + self.attn(h, h if kv is None else kv, key_mask)
        return x + self.ff2(self.act(self.ff1(_ln(self.norm2, x))))


def _ln(norm: nn.LayerNorm | None, x: torch.Tensor) -> torch.Tensor:
    """LayerNorm computed in float32 (FP16 statistics overflow), cast back to x's dtype; None: x itself."""
    if norm is None:
        return x
    return F.layer_norm(x.float(), norm.normalized_shape, norm.weight.float(), norm.bias.float(), norm.eps).to(x.dtype)


def _mask_rows(scores: torch.Tensor, item_mask: torch.Tensor) -> torch.Tensor:
    return torch.where(item_mask[..., None], scores.float(), torch.zeros((), dtype=torch.float32))


class _ContextToken(nn.Module):
    """Projects the user-context vector ``[B, D]`` to a ``[B, 1, d]`` token and prepends it to a key set."""

    def __init__(self, spec: HeadSpec):
        super().__init__()
        self.proj = nn.Linear(spec.input_dim, spec.d_model)

    def prepend(self, x: torch.Tensor, mask: torch.Tensor, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tok = self.proj(context).to(x.dtype).unsqueeze(1)
        return torch.cat([tok, x], 1), torch.cat([torch.ones_like(mask[:, :1]), mask], 1)


def _context_of(head: nn.Module, context: torch.Tensor | None) -> torch.Tensor | None:
    if getattr(head, "context", None) is None:
        return None
    if context is None:
        raise ValueError("this head reads the user context: pass context [B, D] (graph input context_positions)")
    return context


class ProbeHead(nn.Module):
    """The plainest head: ``M = out(items)``, one Linear(D, K) per item (parameters ``out.weight [K, D]``,
    ``out.bias [K]``). No interaction between items."""

    def __init__(self, spec: HeadSpec):
        super().__init__()
        self.out = nn.Linear(spec.input_dim, spec.num_positions)
        self.context = None

    def forward(self, items: torch.Tensor, item_mask: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        return _mask_rows(self.out(items), item_mask)


class LinearHead(nn.Module):
    """Per item Linear(D, d) → activation (``none`` by default: a linear probe; relu/gelu/silu: an MLP
    head) → Linear(d, K). No interaction between items. With the user context its projection is added
    to each item's before the activation."""

    def __init__(self, spec: HeadSpec):
        super().__init__()
        self.proj = nn.Linear(spec.input_dim, spec.d_model)
        self.out = nn.Linear(spec.d_model, spec.num_positions)
        self.act = ACTIVATION_FNS[spec.act]
        self.context = _ContextToken(spec) if spec.context else None

    def forward(self, items: torch.Tensor, item_mask: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        x = self.proj(items)
        ctx = _context_of(self, context)
        if ctx is not None:
            x = x + self.context.proj(ctx).to(x.dtype).unsqueeze(1)
        return _mask_rows(self.out(self.act(x)), item_mask)


class SelfAttentionHead(nn.Module):
    """Linear(D, d) → ``num_layers`` self-attention blocks over the N items (key padding mask)
    → LayerNorm (``final_norm``) → Linear(d, K). The paper's default head."""

    def __init__(self, spec: HeadSpec):
        super().__init__()
        self.proj = nn.Linear(spec.input_dim, spec.d_model)
        self.blocks = nn.ModuleList(_Block(spec) for _ in range(spec.num_layers))
        self.norm = nn.LayerNorm(spec.d_model) if spec.final_norm else None
        self.out = nn.Linear(spec.d_model, spec.num_positions)
        self.context = _ContextToken(spec) if spec.context else None

    def forward(self, items: torch.Tensor, item_mask: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        x, mask = self.proj(items), item_mask
        ctx = _context_of(self, context)
        if ctx is not None:
            x, mask = self.context.prepend(x, mask, ctx)
        for blk in self.blocks:
            x = blk(x, None, mask)
        if ctx is not None:
            x = x[:, 1:]
        return _mask_rows(self.out(_ln(self.norm, x)), item_mask)


class SlotQueryHead(nn.Module):
    """K learned rank-position queries cross-attend over the items (``num_layers`` blocks);
    ``M[b, i, k] = ⟨item_i, query_k⟩ / √d``."""

    def __init__(self, spec: HeadSpec):
        super().__init__()
        self.proj = nn.Linear(spec.input_dim, spec.d_model)
        self.queries = nn.Parameter(torch.randn(spec.num_positions, spec.d_model) * 0.02)
        self.blocks = nn.ModuleList(_Block(spec) for _ in range(spec.num_layers))
        self.norm = nn.LayerNorm(spec.d_model) if spec.final_norm else None
        self.context = _ContextToken(spec) if spec.context else None

    def forward(self, items: torch.Tensor, item_mask: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        x = self.proj(items)  # [B, N, d]
        q = self.queries.to(x.dtype).unsqueeze(0).expand(x.shape[0], -1, -1)  # [B, K, d]
        kv, mask = x, item_mask
        ctx = _context_of(self, context)
        if ctx is not None:
            kv, mask = self.context.prepend(x, item_mask, ctx)
        for blk in self.blocks:
            q = blk(q, kv, mask)
        q = _ln(self.norm, q)
        scores = torch.matmul(x.float(), q.float().transpose(1, 2)) / math.sqrt(x.shape[-1])
        return _mask_rows(scores, item_mask)


HEADS = {"probe": ProbeHead, "linear": LinearHead, "self_attention": SelfAttentionHead, "slot_query": SlotQueryHead}


def build_head(spec: HeadSpec, seed: int | None = None) -> nn.Module:
    """Instantiate a head from its spec (random init; seeded when ``seed`` is given)."""
    spec.validate()
    if seed is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return HEADS[spec.kind](spec)
    return HEADS[spec.kind](spec)
