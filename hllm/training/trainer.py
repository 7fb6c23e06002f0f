"""``hllm train``: fit a scoring head (and LoRA) with the Sinkhorn distillation loss (paper §3.3, §4).

Modes (set by ``lora_rank`` and ``lora_layers``):

* **LoRA** (paper "Track 1"): peft LoRA of rank r on all linear projections of the decoder
  (q/k/v/o/gate/up/down) + head; every step runs the full backbone forward and backward.
* **LoRA on the top layers** (``lora_layers=t``): LoRA only on the last t decoder layers
  (peft ``layers_to_transform``). The frozen lower layers are run ONCE per slate and their output
  (the hidden state entering layer L−t, ``[S, D]``) is cached; each step runs only the top t layers,
  the final norm, readout and head. Identical maths to the full forward, ≈ t/L of its cost: what
  makes CPU training possible.
* **Frozen backbone** (paper "Track 2", ``lora_rank=0``): readout features ``[N, D]`` are cached once
  and only the head is trained.

Reproducible: the seed fixes head and LoRA init and the data order (one ``torch.randperm`` per
epoch); there is no dropout. Checkpoints are written atomically in the ``hllm.json`` format of
:mod:`hllm.formats.checkpoint`, plus ``training_state.pt`` (trainable tensors, AdamW state, step, losses)
from which ``resume=True`` continues to exactly the weights of an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from hllm.formats.architectures import backbone_dims, read_config
from hllm.formats.checkpoint import HeadSpec, manifest_dict, write_manifest
from hllm.errors import CheckpointError, HllmError
from hllm.files import atomic_dir
from hllm.model.heads import build_head
from hllm.model.hllm import gather_readout, load_backbone
from hllm.runtime.prompt import PromptBuilder, load_tokenizer
from hllm.formats.prompt import PromptSpec
from hllm.training.sinkhorn import sinkhorn_loss
from hllm.training.targets import build_target, read_teacher

STATE_FILE = "training_state.pt"


@dataclass
class TrainConfig:
    """Everything that determines a training run (stored in the checkpoint's ``training`` section).

    Attributes:
        backbone: HF model directory.
        slates: training JSONL[.gz] with labels (clicks) and/or ids matching ``teacher``.
        out_dir: checkpoint directory to write.
        target: ``clicks`` | ``teacher`` | ``clicks+teacher`` (see :mod:`hllm.training.targets`).
        teacher: teacher permutations JSONL (for the teacher targets).
        max_slates: use the first this many slates of ``slates`` (None = all).
        sample_items: train on sub-slates of this many candidates: every clicked item plus seeded
            random unclicked ones, shuffled (cheaper prompts; N < K is handled by masking). None =
            whole slates. Applied before targets are built; teacher orders are restricted to it.
        head_kind / num_positions / head_kwargs: the head (HeadSpec sizes).
        lora_rank: LoRA rank r (0 = frozen backbone, Track 2); lora_alpha = r.
        lora_layers: LoRA on the last this many layers only (None = all layers).
        steps: optimizer steps. batch_size: slates per forward. accum: forwards per step.
        lr: AdamW learning rate (constant); weight_decay: AdamW weight decay.
        tau / sinkhorn_iters: Sinkhorn temperature τ and iterations L.
        seed: init + data order.
        save_every: write the checkpoint every this many steps (and at the end).
        prompt: PromptSpec dict.
        threads: torch intra-op threads (None = default).
        features: a :mod:`hllm.training.features` cache holding these slates (same backbone and
            prompt, layer ≤ the first trained layer): the frozen layers below it are not run again.
    """

    backbone: str
    slates: str
    out_dir: str
    target: str = "clicks"
    teacher: str | None = None
    max_slates: int | None = None
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
    weight_decay: float = 0.0
    tau: float = 1.0
    sinkhorn_iters: int = 20
    seed: int = 0
    save_every: int = 50
    prompt: dict = field(default_factory=lambda: PromptSpec().to_dict())
    threads: int | None = None
    features: str | None = None

    def validate(self) -> None:
        """Raise HllmError for out-of-range options, naming them."""
        for name in ("steps", "batch_size", "accum", "sinkhorn_iters", "save_every", "num_positions"):
            if getattr(self, name) < 1:
                raise HllmError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        if self.lora_rank < 0 or (self.lora_layers is not None and self.lora_layers < 1):
            raise HllmError("lora_rank must be ≥ 0 and lora_layers ≥ 1 (or unset)")
        if self.tau <= 0 or self.lr <= 0:
            raise HllmError("tau and lr must be > 0")
        if self.features and self.sample_items:
            raise HllmError("--features caches whole slates; it cannot be combined with --sample-items")
        if self.features and self.lora_rank and self.lora_layers is None:
            raise HllmError("--features needs a frozen lower part: --lora-layers t or --lora-rank 0")


@dataclass
class TrainResult:
    """Outcome of :func:`train`: checkpoint path, steps done, per-step losses, timings."""

    out_dir: str
    steps: int
    losses: list[float]
    train_slates: int
    cache_s: float
    train_s: float


class _Model(torch.nn.Module):
    """Backbone (optionally peft-wrapped) + head with an entry point at any decoder layer."""

    def __init__(self, backbone, head, start_layer: int):
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.start_layer = start_layer

    def base(self):
        m = self.backbone
        if hasattr(m, "get_base_model"):
            m = m.get_base_model()
        return m

    def upper(self, h: torch.Tensor) -> torch.Tensor:
        """Layers ``start_layer..L-1`` + final norm on ``h [B, S, D]`` → last hidden ``[B, S, D]``."""
        from hllm.model.hllm import run_layers as lower_layers

        return self.base().norm(lower_layers(self.backbone, h, self.start_layer, len(self.base().layers)))

    def full(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.backbone(input_ids=input_ids, use_cache=False).last_hidden_state


def _trainable(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def build_model(cfg: TrainConfig) -> tuple[_Model, HeadSpec, int]:
    """Backbone (+ LoRA) and head, seeded. Returns (model, head spec, number of decoder layers)."""
    dims = backbone_dims(read_config(Path(cfg.backbone)))
    spec = HeadSpec(kind=cfg.head_kind, input_dim=dims.hidden_size, num_positions=cfg.num_positions, **cfg.head_kwargs)
    spec.validate()
    backbone = load_backbone(cfg.backbone)
    for p in backbone.parameters():
        p.requires_grad_(False)
    n_layers = dims.num_layers
    if cfg.lora_layers is not None and cfg.lora_layers > n_layers:
        raise HllmError(f"lora_layers={cfg.lora_layers} but the backbone has {n_layers} layers")
    if cfg.lora_rank:
        from peft import get_peft_model

        from hllm.build.init import lora_config

        lc = lora_config(cfg.lora_rank)
        if cfg.lora_layers is not None and cfg.lora_layers < n_layers:
            # A full-match regex (peft's layers_to_transform wants a prefix before "layers." that a
            # bare AutoModel lacks): the same linear projections, top layers only.
            top = "|".join(str(i) for i in range(n_layers - cfg.lora_layers, n_layers))
            projs = "|".join(sorted(lc.target_modules))
            lc.target_modules = rf"(.*\.)?layers\.({top})\.(.*\.)?({projs})"
        torch.manual_seed(cfg.seed + 1)
        backbone = get_peft_model(backbone, lc)
        start = n_layers - (cfg.lora_layers or n_layers)
    else:
        start = n_layers  # frozen: everything cached, readout features only
    head = build_head(spec, seed=cfg.seed)
    return _Model(backbone, head, start), spec, n_layers


def _load_items(cfg: TrainConfig) -> tuple[list[dict], list[np.ndarray]]:
    from hllm.runtime.slates import read_slates

    slates = read_slates(cfg.slates, limit=cfg.max_slates)
    teacher = read_teacher(cfg.teacher) if cfg.teacher else None
    if cfg.target != "clicks" and teacher is None:
        raise HllmError(f"target {cfg.target!r} needs --teacher (a teacher permutations JSONL)")
    if cfg.sample_items:
        slates = [_sample(s, cfg.sample_items, cfg.seed * 7919 + i, teacher) for i, s in enumerate(slates)]
    keep, targets = [], []
    for s in slates:
        t = build_target(cfg.target, s, teacher)
        if t is not None:
            if len(s["candidates"]) > cfg.num_positions:
                raise HllmError(f"slate {s.get('slate_id')} has {len(s['candidates'])} candidates > K={cfg.num_positions}")
            keep.append(s)
            targets.append(t)
    if not keep:
        raise HllmError(f"no training slate has a usable {cfg.target} target in {cfg.slates}")
    return keep, targets


def _sample(slate: dict, n: int, seed: int, teacher: dict | None) -> dict:
    """:func:`hllm.runtime.slates.sample_subslate`; a teacher order for the slate is restricted to the
    kept candidates (stored under the same id)."""
    from hllm.runtime.slates import sample_subslate

    out, keep = sample_subslate(slate, n, seed)
    sid = str(slate.get("slate_id", "?"))
    if teacher is not None and sid in teacher and len(keep) < len(slate["candidates"]):
        where = {c: j for j, c in enumerate(keep)}
        teacher[sid] = [where[i] for i in teacher[sid] if i in where]
    return out


def _frozen_part(model: _Model, slates: list[dict], builder: PromptBuilder, n_layers: int, cfg: TrainConfig,
                 on_cache: Callable[[int, int], None] | None) -> list:
    """Per slate, what the trainable part starts from: readout features ``[N, D]`` (frozen backbone)
    or (hidden state entering ``start_layer`` ``[S, D]``, readout positions ``[N]``). Computed from the
    prompt, or from a :class:`~hllm.training.features.FeatureCache` by running only layers
    ``cache.layer..start_layer-1``."""
    from hllm.training.features import FeatureCache
    from hllm.model.hllm import run_layers as lower_layers

    cache = None
    if cfg.features:
        cache = FeatureCache.open(cfg.features)
        index = cache.check(cfg.backbone, cfg.prompt, [str(s.get("slate_id", i)) for i, s in enumerate(slates)])
        if cache.layer > model.start_layer:
            raise HllmError(f"feature cache {cfg.features} holds layer {cache.layer}, but training starts at "
                            f"layer {model.start_layer}: cache a lower layer or train fewer --lora-layers")
    out = []
    model.eval()
    with torch.inference_mode():
        for i, s in enumerate(slates):
            if cache is not None:
                h_np, pos_np = cache.get(index[i])
                h = lower_layers(model.backbone, torch.from_numpy(h_np)[None], cache.layer, model.start_layer)
                pos = torch.from_numpy(pos_np)
            else:
                b = builder.encode([s])
                h = lower_layers(model.backbone, torch.from_numpy(b.input_ids), 0, model.start_layer)
                pos = torch.from_numpy(b.readout_positions[0])
            if model.start_layer >= n_layers:
                out.append(gather_readout(model.base().norm(h), pos[None])[0].clone())
            else:
                out.append((h[0].clone(), pos))
            if on_cache:
                on_cache(i + 1, len(slates))
    return out


def _data_order(n: int, seed: int, count: int, start: int = 0) -> list[int]:
    """Indices ``start..start+count`` of the infinite sequence of per-epoch permutations."""
    out: list[int] = []
    epoch = start // n
    pos = start % n
    while len(out) < count:
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100003 + epoch)).tolist()
        out.extend(perm[pos:])
        epoch, pos = epoch + 1, 0
    return out[:count]


def _pad_target(targets: Sequence[np.ndarray], n_max: int, k: int) -> torch.Tensor:
    out = torch.zeros(len(targets), n_max, k)
    for i, t in enumerate(targets):
        out[i, : t.shape[0], : t.shape[1]] = torch.from_numpy(t)
    return out


def save_checkpoint(model: _Model, spec: HeadSpec, cfg: TrainConfig, step: int, losses: list[float],
                    optimizer: torch.optim.Optimizer, extra: dict | None = None) -> Path:
    """Write the checkpoint (manifest, head, adapter, training state) atomically to ``cfg.out_dir``."""
    from safetensors.torch import save_file

    out = Path(cfg.out_dir).resolve()
    with atomic_dir(out, overwrite=True) as tmp:
        save_file({k: v.detach().contiguous() for k, v in model.head.state_dict().items()}, str(tmp / spec.file))
        adapter = None
        if cfg.lora_rank:
            model.backbone.save_pretrained(str(tmp / "adapter"))
            adapter = "adapter"
        torch.save(
            {"step": step, "losses": losses, "config": asdict(cfg),
             "trainable": {n: p.detach().clone() for n, p in _trainable(model).items()},
             "optimizer": optimizer.state_dict()},
            tmp / STATE_FILE,
        )
        training = {"created_by": "hllm train", "trained": True, "step": step, "seed": cfg.seed,
                    "final_loss": losses[-1] if losses else None, "config": asdict(cfg)}
        training.update(extra or {})
        rel = os.path.relpath(Path(cfg.backbone).resolve(), out)
        write_manifest(tmp, manifest_dict(rel, spec, PromptSpec.from_dict(cfg.prompt), adapter, {"provenance": training}))
    return out


def train(cfg: TrainConfig, resume: bool = False, on_step: Callable[[int, float], None] | None = None,
          on_cache: Callable[[int, int], None] | None = None) -> TrainResult:
    """Run (or resume) a training run; returns :class:`TrainResult`.

    Args:
        cfg: the run's configuration.
        resume: continue from ``cfg.out_dir/training_state.pt`` (must exist; its config must match
            except ``steps`` and ``save_every``).
        on_step: called after each optimizer step with (step, loss).
        on_cache: called while caching features with (done, total).
    Raises: HllmError / CheckpointError / SlateError naming the problem.
    """
    cfg.validate()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    state = None
    if resume:
        sp = Path(cfg.out_dir) / STATE_FILE
        if not sp.is_file():
            raise CheckpointError(f"cannot resume: {sp} not found")
        state = torch.load(sp, weights_only=False)
        old = dict(state["config"])
        new = asdict(cfg)
        diff = [k for k in new if k not in ("steps", "save_every", "threads") and old.get(k) != new[k]]
        if diff:
            raise CheckpointError(f"cannot resume {cfg.out_dir}: options differ from the saved run: {diff}")
    slates, targets = _load_items(cfg)
    model, spec, n_layers = build_model(cfg)
    prompt = PromptSpec.from_dict(cfg.prompt)
    builder = PromptBuilder(load_tokenizer(cfg.backbone), prompt, max_items=cfg.num_positions)
    params = _trainable(model)
    opt = torch.optim.AdamW(params.values(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    step, losses = 0, []
    if state is not None:
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(state["trainable"][n])
        opt.load_state_dict(state["optimizer"])
        step, losses = int(state["step"]), list(state["losses"])

    # Cache the frozen part once (top-layer LoRA and Track 2); full LoRA re-runs the backbone.
    t0 = time.perf_counter()
    cached = None
    full = cfg.lora_rank and model.start_layer == 0
    if not full and step < cfg.steps:
        cached = _frozen_part(model, slates, builder, n_layers, cfg, on_cache)
    cache_s = time.perf_counter() - t0

    t1 = time.perf_counter()
    per_step = cfg.batch_size * cfg.accum
    model.train()
    while step < cfg.steps:
        order = _data_order(len(slates), cfg.seed, per_step, start=step * per_step)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for m in range(cfg.accum):
            idx = order[m * cfg.batch_size:(m + 1) * cfg.batch_size]
            n_items = torch.tensor([targets[i].shape[0] for i in idx])
            n_max = int(n_items.max())
            mask = torch.arange(n_max)[None] < n_items[:, None]
            if cached is None:
                b = builder.encode([slates[i] for i in idx])
                items = gather_readout(model.full(torch.from_numpy(b.input_ids)), torch.from_numpy(b.readout_positions))
            elif model.start_layer >= n_layers:
                d = cached[idx[0]].shape[-1]
                items = torch.zeros(len(idx), n_max, d)
                for j, i in enumerate(idx):
                    items[j, : cached[i].shape[0]] = cached[i]
            else:
                s_max = max(cached[i][0].shape[0] for i in idx)
                h = torch.zeros(len(idx), s_max, cached[idx[0]][0].shape[-1])
                pos = torch.zeros(len(idx), n_max, dtype=torch.long)
                for j, i in enumerate(idx):
                    h[j, : cached[i][0].shape[0]] = cached[i][0]
                    pos[j, : cached[i][1].shape[0]] = cached[i][1]
                items = gather_readout(model.upper(h), pos)
            scores = model.head(items, mask)
            target = _pad_target([targets[i] for i in idx], n_max, cfg.num_positions)
            loss = sinkhorn_loss(scores, target, n_items, cfg.tau, cfg.sinkhorn_iters) / cfg.accum
            loss.backward()
            total += loss.item()
        opt.step()
        step += 1
        losses.append(total)
        if on_step:
            on_step(step, total)
        if step % cfg.save_every == 0 or step == cfg.steps:
            save_checkpoint(model, spec, cfg, step, losses, opt,
                            {"train_slates": len(slates), "cache_s": round(cache_s, 1),
                             "train_s": round(time.perf_counter() - t1, 1)})
    return TrainResult(str(Path(cfg.out_dir).resolve()), step, losses, len(slates), cache_s, time.perf_counter() - t1)
