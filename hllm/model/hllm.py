"""The PyTorch reference hLLM: backbone prefill → readout gather → scoring head (paper §3).

    input_ids [B, S] int64 ──backbone (one causal forward, no KV cache)──► hidden [B, S, D]
    hidden, readout_positions [B, N] ──gather──► items [B, N, D]
    hidden, context_positions [B] ──gather──► user [B, D]          (only for a head with "context": true)
    items, item_mask [B, N] (, user) ──head──► scores M [B, N, K] float32

Inputs are right-padded, so plain causal attention with no attention mask gives real tokens exactly
the hidden states they would have unpadded (pads come after every real token and real positions keep
their position ids).
"""

from __future__ import annotations

import os

import torch
from torch import nn

from hllm.formats.checkpoint import Manifest, load_manifest
from hllm.errors import CheckpointError
from hllm.model.adapter import attach_adapter, unwrap
from hllm.model.heads import build_head


def gather_readout(hidden: torch.Tensor, readout_positions: torch.Tensor) -> torch.Tensor:
    """``hidden [B, S, D]``, ``readout_positions [B, N] int64`` → ``[B, N, D]`` (hidden at each position)."""
    idx = readout_positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
    return torch.gather(hidden, 1, idx)


def gather_context(hidden: torch.Tensor, context_positions: torch.Tensor | None) -> torch.Tensor | None:
    """``hidden [B, S, D]``, ``context_positions [B] int64`` → the user-context vector ``[B, D]`` (None → None)."""
    if context_positions is None:
        return None
    return gather_readout(hidden, context_positions.unsqueeze(1))[:, 0]


def base_model(backbone: nn.Module) -> nn.Module:
    """The HF base decoder inside a (possibly peft-wrapped) backbone: has ``embed_tokens``, ``layers``,
    ``norm`` and ``rotary_emb`` (:func:`hllm.model.adapter.unwrap`)."""
    return unwrap(backbone)


def run_layers(backbone: nn.Module, h_or_ids: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Run decoder layers ``start..stop-1`` of a (possibly peft-wrapped) HF decoder.

    ``h_or_ids``: ``input_ids [B, S]`` int64 (embedded first; then ``start`` must be 0), or the float
    hidden state ``[B, S, D]`` entering ``start``. Causal attention, no padding mask (right-padded rows
    or batch 1), position ids ``0..S-1``. Returns the hidden state entering ``stop`` ``[B, S, D]`` (no
    final norm). Splitting a forward at any layer gives the full forward's result (tested).
    """
    base = base_model(backbone)
    h = h_or_ids if h_or_ids.is_floating_point() else base.embed_tokens(h_or_ids)
    pos = torch.arange(h.shape[1])[None]
    pe = base.rotary_emb(h, position_ids=pos)
    for layer in base.layers[start:stop]:
        h = layer(h, attention_mask=None, position_ids=pos, position_embeddings=pe)
    return h


class HllmModel(nn.Module):
    """Backbone + readout + head. ``forward(input_ids, readout_positions, item_mask[, context_positions]) → scores``.

    The forward can also start at any decoder layer (:meth:`forward_from`), from a cached hidden
    state: training and evaluation from a feature cache use the same code as the full forward.

    Args:
        backbone: a Hugging Face base decoder (``AutoModel``; or a PEFT-wrapped one) whose output has
            ``last_hidden_state [B, S, D]``.
        head: a scoring head from :mod:`hllm.model.heads`.
    """

    def __init__(self, backbone: nn.Module, head: nn.Module):
        super().__init__()
        self.backbone = backbone
        self.head = head

    @property
    def num_layers(self) -> int:
        return len(base_model(self.backbone).layers)

    def hidden_states(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Final hidden states ``[B, S, D]`` from one causal prefill (no cache, no attention mask)."""
        return self.backbone(input_ids=input_ids, use_cache=False).last_hidden_state

    def upper(self, h: torch.Tensor, start: int) -> torch.Tensor:
        """Layers ``start..L-1`` + final norm on the hidden state ``h [B, S, D]`` entering ``start``
        (``start = L``: the norm only) → final hidden states ``[B, S, D]``."""
        return base_model(self.backbone).norm(run_layers(self.backbone, h, start, self.num_layers))

    @property
    def reads_context(self) -> bool:
        """Whether the head reads the user context (the graph then has ``context_positions``)."""
        return getattr(self.head, "context", None) is not None

    def score_hidden(self, hidden: torch.Tensor, readout_positions: torch.Tensor, item_mask: torch.Tensor,
                     context_positions: torch.Tensor | None = None) -> torch.Tensor:
        """Readout + head on final hidden states: ``[B, S, D]`` → scores ``[B, N, K]`` float32.

        ``context_positions [B]`` is used only by a head that reads the user context (ignored otherwise).
        """
        ctx = gather_context(hidden, context_positions) if self.reads_context else None
        return self.head(gather_readout(hidden, readout_positions), item_mask, ctx)

    def forward(self, input_ids: torch.Tensor, readout_positions: torch.Tensor, item_mask: torch.Tensor,
                context_positions: torch.Tensor | None = None) -> torch.Tensor:
        return self.score_hidden(self.hidden_states(input_ids), readout_positions, item_mask, context_positions)

    def forward_from(self, h: torch.Tensor, start: int, readout_positions: torch.Tensor,
                     item_mask: torch.Tensor, context_positions: torch.Tensor | None = None) -> torch.Tensor:
        """Scores from the hidden state entering layer ``start`` (a feature cache): same maths as
        :meth:`forward` on the prompt, at ``(L - start) / L`` of its cost."""
        return self.score_hidden(self.upper(h, start), readout_positions, item_mask, context_positions)


def load_backbone(path: str | os.PathLike, dtype: torch.dtype = torch.float32) -> nn.Module:
    """Load a Hugging Face base decoder (Qwen3 / Qwen2 / Llama) with ``AutoModel`` on CPU, eval mode.

    Only ``*.safetensors`` weights are read (``use_safetensors=True``): a ``pytorch_model.bin`` is a pickle
    and is never loaded. Every weight of the architecture must be in the files (transformers would
    otherwise initialise the missing ones at random, silently).

    Raises: CheckpointError naming the directory if transformers cannot load it (no safetensors weights,
        a corrupt file, missing tensors).
    """
    import pickle

    from safetensors import SafetensorError
    from transformers import AutoModel

    try:
        model, info = AutoModel.from_pretrained(str(path), dtype=dtype, attn_implementation="sdpa",
                                                use_safetensors=True, output_loading_info=True)
    except (OSError, ValueError, SafetensorError, pickle.UnpicklingError, EOFError, RuntimeError) as e:
        raise CheckpointError(f"cannot load backbone {path} (only *.safetensors weights are read): "
                              f"{type(e).__name__}: {e}") from None
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        raise CheckpointError(f"backbone {path}: the weights lack {len(missing)} tensors of the architecture "
                              f"(first: {missing[0]}); they would be random")
    return model.eval()


def load_head(manifest: Manifest) -> nn.Module:
    """Build the head of ``manifest`` and load ``head.safetensors`` (strict).

    Raises: CheckpointError naming the file: not a readable safetensors file (empty, truncated, a corrupt
        header), or missing/unexpected/mis-shaped tensors.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    head = build_head(manifest.head)
    try:
        state = load_file(str(manifest.head_path))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"cannot read head weights {manifest.head_path}: {e}") from None
    try:
        head.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"head weights {manifest.head_path} do not match the head spec: {e}") from None
    return head.eval()


def load_model(ckpt: str | os.PathLike | Manifest, merge: bool = False, dtype: torch.dtype = torch.float32) -> HllmModel:
    """Load the reference model of a checkpoint.

    Args:
        ckpt: checkpoint directory or a loaded :class:`Manifest`.
        merge: with an adapter, merge LoRA into the backbone (peft ``merge_and_unload``) instead of
            running it as an adapter; the backbone is then the bare decoder.
        dtype: weights dtype (float32 for the reference).
    Returns: :class:`HllmModel` in eval mode on CPU.
    Raises: CheckpointError (see :func:`hllm.formats.checkpoint.load_manifest`; an adapter that does not
        land whole: :func:`hllm.model.adapter.attach_adapter`).
    """
    m = ckpt if isinstance(ckpt, Manifest) else load_manifest(ckpt)
    backbone = load_backbone(m.backbone_path, dtype)
    if m.adapter_path is not None:
        backbone = attach_adapter(backbone, m.adapter_path, m.adapter_layout)
        if merge:
            backbone = unwrap(backbone.merge_and_unload())
    model = HllmModel(backbone, load_head(m).to(dtype))
    return model.eval()

