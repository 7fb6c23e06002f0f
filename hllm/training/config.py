"""The configuration of a training run (stored in the checkpoint's ``provenance.config``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hllm.errors import HllmError
from hllm.formats.prompt import PromptSpec

LR_SCHEDULES = ("constant", "cosine")


@dataclass
class TrainConfig:
    """Everything that determines a training run.

    Attributes:
        backbone: HF model directory.
        slates: training JSONL[.gz] with labels (clicks) and/or ids matching ``teacher``.
        out_dir: checkpoint directory to write.
        target: ``clicks`` | ``teacher`` | ``clicks+teacher`` (see :mod:`hllm.training.targets`).
        teacher: teacher permutations JSONL (for the teacher targets).
        max_slates: use the first this many slates of ``slates`` (None = all).
        val_slates: hold out the LAST this many of them (not trained on) and measure AUC / Recall@k on
            them every ``val_every`` steps: the learning curve recorded in the checkpoint.
        sample_items: train on sub-slates of this many candidates: every clicked item plus seeded
            random unclicked ones, shuffled (cheaper prompts; N < K is handled by masking). None =
            whole slates. Applied before targets are built; teacher orders are restricted to it.
        head_kind / num_positions / head_kwargs: the head (HeadSpec sizes; ``context: True`` adds the
            user-context readout).
        lora_rank: LoRA rank r (0 = frozen backbone, Track 2); lora_alpha = r.
        lora_layers: LoRA on the last this many layers only (None = all layers).
        steps: optimizer steps. batch_size: slates per forward. accum: forwards per step.
        lr / lr_schedule / warmup_steps / min_lr_ratio: AdamW peak learning rate; ``constant`` or
            ``cosine`` (linear warm-up over ``warmup_steps``, then cosine decay to ``min_lr_ratio · lr``).
        weight_decay: AdamW weight decay.
        tau / sinkhorn_iters: Sinkhorn temperature τ and iterations L.
        seed: init + data order.
        save_every: write the checkpoint every this many steps (and at the end).
        prompt: PromptSpec dict.
        threads: torch intra-op threads (None = default).
        features: a :mod:`hllm.training.features` cache holding these slates (same backbone and
            prompt, layer ≤ the first trained layer): the frozen layers below it are not run again.
        init_head: a checkpoint directory whose head (same kind and sizes) is the starting point instead
            of a random init: train the head on a frozen backbone first, then LoRA + head from it
            ("linear probing then fine-tuning", Kumar et al., ICLR 2022).
        precision: ``fp32`` | ``bf16`` | ``auto`` (bf16 autocast where the device has bf16 matrix
            instructions; :mod:`hllm.training.precision`). The CLI defaults to ``auto``; this dataclass to
            ``fp32``, so the Python API keeps exact fp32 maths unless asked. The trained tensors are fp32 either way.
        device: ``auto`` (CUDA when torch sees a GPU) | ``cpu`` | ``cuda``.
        Like ``threads``, ``precision`` and ``device`` say how a run computes, not what it trains: a
        resumed run may change them.
    """

    backbone: str
    slates: str
    out_dir: str
    target: str = "clicks"
    teacher: str | None = None
    max_slates: int | None = None
    val_slates: int = 0
    val_every: int = 50
    sample_items: int | None = None
    head_kind: str = "self_attention"
    num_positions: int = 50
    head_kwargs: dict = field(default_factory=dict)
    lora_rank: int = 8
    lora_layers: int | None = None
    steps: int = 100
    batch_size: int = 1
    accum: int = 8
    lr: float = 1e-4
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    tau: float = 1.0
    sinkhorn_iters: int = 20
    seed: int = 0
    save_every: int = 50
    prompt: dict = field(default_factory=lambda: PromptSpec().to_dict())
    threads: int | None = None
    features: str | None = None
    init_head: str | None = None
    precision: str = "fp32"
    device: str = "auto"

    def validate(self) -> None:
        """Raise HllmError for out-of-range options, naming them."""
        for name in ("steps", "batch_size", "accum", "sinkhorn_iters", "save_every", "num_positions", "val_every"):
            if getattr(self, name) < 1:
                raise HllmError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        if self.lora_rank < 0 or (self.lora_layers is not None and self.lora_layers < 1):
            raise HllmError("lora_rank must be ≥ 0 and lora_layers ≥ 1 (or unset)")
        if not (self.tau > 0 and self.lr > 0 and math.isfinite(self.tau) and math.isfinite(self.lr)):
            raise HllmError("tau and lr must be finite and > 0")
        if self.lr_schedule not in LR_SCHEDULES:
            raise HllmError(f"lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
        if self.warmup_steps < 0 or not 0.0 <= self.min_lr_ratio <= 1.0 or self.val_slates < 0:
            raise HllmError("warmup_steps and val_slates must be ≥ 0 and min_lr_ratio in [0, 1]")
        if self.features and self.sample_items:
            raise HllmError("--features caches whole slates; it cannot be combined with --sample-items")
        from hllm.training.precision import DEVICES, PRECISIONS

        if self.precision not in PRECISIONS or self.device not in DEVICES:
            raise HllmError(f"precision must be one of {PRECISIONS} and device one of {DEVICES}, "
                            f"got {self.precision!r}, {self.device!r}")
        if self.features and self.lora_rank and self.lora_layers is None:
            raise HllmError("--features needs a frozen lower part: --lora-layers N (fewer than the backbone's "
                            "layers) or --lora-rank 0")

    def lr_at(self, step: int) -> float:
        """Learning rate of optimizer step ``step`` (0-based) under :attr:`lr_schedule`."""
        if self.lr_schedule == "constant":
            return self.lr
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        span = max(1, self.steps - self.warmup_steps)
        frac = min(1.0, (step - self.warmup_steps) / span)
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))
