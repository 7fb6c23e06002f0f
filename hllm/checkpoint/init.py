"""``hllm init``: an untrained checkpoint from a backbone directory (seeded head, optional LoRA).

Training (``hllm train``) is separate; deployment can be exercised on an untrained checkpoint. With
``lora_rank`` the adapter gets small *non-zero* B matrices (peft initialises B to zero, which would
make merging a no-op), so ``hllm merge`` is really exercised.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from hllm.formats.architectures import LINEAR_PROJECTIONS, backbone_dims, read_config
from hllm.formats.checkpoint import HeadSpec, manifest_dict, write_manifest
from hllm.errors import CheckpointError
from hllm.files import atomic_dir
from hllm.model.heads import build_head
from hllm.formats.prompt import PromptSpec


def lora_config(rank: int, alpha: int | None = None, dropout: float = 0.0):
    """peft ``LoraConfig`` on all linear projections of the decoder (paper: r=64, all projections)."""
    from peft import LoraConfig

    return LoraConfig(
        r=rank,
        lora_alpha=alpha if alpha is not None else rank,
        lora_dropout=dropout,
        target_modules=list(LINEAR_PROJECTIONS),
        bias="none",
    )


def init_checkpoint(
    backbone: str | os.PathLike,
    out_dir: str | os.PathLike,
    head_kind: str = "self_attention",
    num_positions: int = 50,
    seed: int = 0,
    lora_rank: int | None = None,
    lora_init_std: float = 0.02,
    prompt: PromptSpec | None = None,
    overwrite: bool = False,
    head_kwargs: dict | None = None,
) -> Path:
    """Write an untrained checkpoint to ``out_dir`` (atomic) and return it.

    Args:
        backbone: Hugging Face model directory (Qwen3/Qwen2/Llama) with tokenizer.json.
        head_kind: ``linear`` | ``self_attention`` | ``slot_query``.
        num_positions: K.
        seed: seeds head and adapter init.
        lora_rank: if set, also write a LoRA adapter of this rank with non-zero weights
            (B ~ N(0, lora_init_std)).
        prompt: prompt spec (default :class:`PromptSpec`).
        head_kwargs: overrides of :class:`HeadSpec` sizes (d_model, num_layers, num_heads, ff_dim).
    Raises: CheckpointError (bad backbone; a value no checkpoint reader would accept, naming it:
        ``num_positions``/head sizes not positive integers, unknown head kind, ``lora_rank`` not a
        positive integer, ``lora_init_std`` negative or not finite, a prompt spec that does not
        validate), FileExistsError (out_dir exists, no overwrite). All checked before any work.
    """
    from safetensors.torch import save_file

    _check_init_values(lora_rank, lora_init_std, seed, prompt)
    backbone = Path(backbone).resolve()
    dims = backbone_dims(read_config(backbone))
    if not (backbone / "tokenizer.json").is_file():
        raise CheckpointError(f"backbone {backbone} has no tokenizer.json")
    spec = HeadSpec.from_dict({"kind": head_kind, "input_dim": dims.hidden_size, "num_positions": num_positions,
                               **(head_kwargs or {})})
    spec.validate()
    out_dir = Path(out_dir).resolve()
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        head = build_head(spec, seed=seed)
        save_file({k: v.contiguous() for k, v in head.state_dict().items()}, str(tmp / spec.file))
        adapter = None
        if lora_rank:
            from peft import get_peft_model

            from hllm.model.hllm import load_backbone

            with torch.random.fork_rng(devices=[]):  # peft draws lora_A from the global generator: seed it here
                torch.manual_seed(seed + 1)
                model = get_peft_model(load_backbone(backbone), lora_config(lora_rank))
            gen = torch.Generator().manual_seed(seed + 1)
            with torch.no_grad():
                for name, p in model.named_parameters():
                    if "lora_B" in name:
                        p.copy_(torch.randn(p.shape, generator=gen) * lora_init_std)
            model.save_pretrained(str(tmp / "adapter"))
            adapter = "adapter"
        rel_backbone = os.path.relpath(backbone, out_dir)
        extra = {"provenance": {"created_by": "hllm init", "seed": seed, "trained": False}}
        write_manifest(tmp, manifest_dict(rel_backbone, spec, prompt or PromptSpec(), adapter, extra))
    return out_dir


def _check_init_values(lora_rank, lora_init_std, seed, prompt) -> None:
    """The options of :func:`init_checkpoint` that HeadSpec / PromptSpec do not check themselves."""
    import math

    if lora_rank is not None and (isinstance(lora_rank, bool) or not isinstance(lora_rank, int) or lora_rank < 1):
        raise CheckpointError(f"lora_rank must be a positive integer (or none for no adapter), got {lora_rank!r}")
    if isinstance(lora_init_std, bool) or not isinstance(lora_init_std, (int, float)) or not math.isfinite(lora_init_std) \
            or lora_init_std < 0:
        raise CheckpointError(f"lora_init_std must be a finite number ≥ 0, got {lora_init_std!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise CheckpointError(f"seed must be a non-negative integer, got {seed!r}")
    if prompt is not None:
        if not isinstance(prompt, PromptSpec):
            raise CheckpointError(f"prompt must be a PromptSpec, got {type(prompt).__name__}")
        prompt.validate()


def copy_tokenizer_files(src: Path, dst: Path) -> None:
    """Copy tokenizer files (tokenizer.json, tokenizer_config.json, special tokens, chat template)."""
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
