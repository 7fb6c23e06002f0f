"""``hllm train``: fit a scoring head (and LoRA) with the Sinkhorn distillation loss (paper §3.3, §4).

Modes (set by ``lora_rank`` and ``lora_layers``):

* **LoRA** (paper "Track 1"): peft LoRA of rank r on all linear projections of the decoder
  (q/k/v/o/gate/up/down) + head; every step runs the full backbone forward and backward.
* **LoRA on the top layers** (``lora_layers=t``): LoRA only on the last t decoder layers. The frozen
  lower layers run ONCE per slate (or come from a feature cache); each step runs only the top t
  layers, the final norm, readout and head — :meth:`hllm.model.hllm.HllmModel.forward_from`, the same
  maths as the full forward at ≈ t/L of its cost: what makes CPU training possible.
* **Frozen backbone** (paper "Track 2", ``lora_rank=0``): readout features ``[N, D]`` (and, for a
  head with the user-context readout, the context row) are computed once and only the head is trained.

Reproducible: the seed fixes head and LoRA init and the data order (one ``torch.randperm`` per
epoch); there is no dropout. Checkpoints are written atomically in the ``hllm.json`` format of
:mod:`hllm.formats.checkpoint`, plus the pickle-free training state of :mod:`hllm.training.state`,
from which ``resume=True`` continues to exactly the weights of an uninterrupted run. With
``val_slates`` the run records a learning curve (AUC, Recall@k on held-out slates) in the checkpoint.
The run computes on the GPU when there is one and in bf16 autocast where ``precision`` allows
(:mod:`hllm.training.precision`); the trainable tensors, the optimizer state and what is saved stay fp32.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch

from hllm.errors import CheckpointError, HllmError
from hllm.files import atomic_dir
from hllm.formats.architectures import backbone_dims, read_config
from hllm.formats.checkpoint import HeadSpec, manifest_dict, write_manifest
from hllm.formats.precision import Precision
from hllm.formats.prompt import PromptSpec
from hllm.model.heads import build_head
from hllm.model.hllm import HllmModel, load_backbone
from hllm.runtime.prompt import PromptBuilder, load_tokenizer
from hllm.training.config import TrainConfig
from hllm.training.data import collate, data_order, load_slates, pad_targets, prepare, to_device
from hllm.training.precision import Compute, no_autocast, resolve_compute
from hllm.training.sinkhorn import sinkhorn_loss
from hllm.training.state import STATE_JSON, STATE_TENSORS, TrainingState, load_state, save_state

__all__ = ["STATE_FILE", "TrainConfig", "TrainResult", "TrainableModel", "build_model", "train"]

#: The training-state file a checkpoint holds (its JSON twin is ``training_state.json``).
STATE_FILE = STATE_TENSORS


@dataclass
class TrainResult:
    """Outcome of :func:`train`: checkpoint path, steps done, per-step losses, timings, learning curve."""

    out_dir: str
    steps: int
    losses: list[float]
    train_slates: int
    cache_s: float
    train_s: float
    validation: list[dict] = field(default_factory=list)


class TrainableModel(torch.nn.Module):
    """An :class:`HllmModel` and the first decoder layer that is trained (``start_layer``; L = frozen
    backbone). ``full`` / ``upper`` / ``scores`` are the forwards training uses."""

    def __init__(self, model: HllmModel, start_layer: int):
        super().__init__()
        self.model = model
        self.start_layer = start_layer

    @property
    def backbone(self):
        return self.model.backbone

    @property
    def head(self):
        return self.model.head

    def full(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Final hidden states of the whole backbone ``[B, S, D]``."""
        return self.model.hidden_states(input_ids)

    def upper(self, h: torch.Tensor) -> torch.Tensor:
        """Final hidden states from the state entering ``start_layer``."""
        return self.model.upper(h, self.start_layer)

    def scores(self, batch: dict) -> torch.Tensor:
        """Score matrices ``[B, N, K]`` of a :func:`hllm.training.data.collate` batch."""
        if batch["items"] is not None:
            return self.model.head(batch["items"], batch["mask"], batch["context_vec"])
        if batch["ids"] is not None:
            return self.model(batch["ids"], batch["readout"], batch["mask"], batch["context"])
        return self.model.forward_from(batch["hidden"], self.start_layer, batch["readout"], batch["mask"],
                                       batch["context"])


def trainable_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """``{name: parameter}`` of the parameters of ``model`` that require a gradient (what the optimizer updates)."""
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def build_model(cfg: TrainConfig) -> tuple[TrainableModel, HeadSpec, int]:
    """Backbone (+ LoRA) and head, seeded. Returns (model, head spec, number of decoder layers)."""
    dims = backbone_dims(read_config(Path(cfg.backbone)))
    spec = HeadSpec.from_dict({"kind": cfg.head_kind, "input_dim": dims.hidden_size, "num_positions": cfg.num_positions,
                               **cfg.head_kwargs})
    spec.validate()
    backbone = load_backbone(cfg.backbone)
    for p in backbone.parameters():
        p.requires_grad_(False)
    n_layers = dims.num_layers
    if cfg.lora_layers is not None and cfg.lora_layers > n_layers:
        raise HllmError(f"lora_layers={cfg.lora_layers} but the backbone has {n_layers} layers")
    if cfg.features and cfg.lora_rank and (cfg.lora_layers or n_layers) >= n_layers:
        raise HllmError(f"--features {cfg.features}: --lora-layers {cfg.lora_layers} trains all {n_layers} layers, "
                        "so no frozen layer below them could come from the cache; train fewer layers or drop --features")
    start = n_layers  # frozen: everything below the head is computed once
    if cfg.lora_rank:
        from peft import get_peft_model

        from hllm.checkpoint.init import lora_config

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
    head = _initial_head(cfg, spec)
    return TrainableModel(HllmModel(backbone, head), start), spec, n_layers


def _initial_head(cfg: TrainConfig, spec: HeadSpec):
    """A seeded random head, or (``cfg.init_head``) the trained head of that checkpoint.

    Raises: CheckpointError if that checkpoint's head differs from ``spec`` in kind or size (the message
        names the first difference), or its weights cannot be read.
    """
    if not cfg.init_head:
        return build_head(spec, seed=cfg.seed)
    from hllm.formats.checkpoint import load_manifest
    from hllm.model.hllm import load_head

    m = load_manifest(Path(cfg.init_head))
    want, got = asdict(spec), asdict(m.head)
    diff = [k for k in sorted(set(want) | set(got)) if k != "file" and want.get(k) != got.get(k)]
    if diff:
        raise CheckpointError(f"--init-head {cfg.init_head}: its head differs in {diff[0]} "
                              f"({got.get(diff[0])!r}, this run {want.get(diff[0])!r})")
    return load_head(m).train()


def save_checkpoint(model: TrainableModel, spec: HeadSpec, cfg: TrainConfig, state: TrainingState,
                    optimizer: torch.optim.Optimizer, extra: dict | None = None) -> Path:
    """Write the checkpoint (manifest, head, adapter, training state) atomically to ``cfg.out_dir``."""
    from safetensors.torch import save_file

    out = Path(cfg.out_dir).resolve()
    with atomic_dir(out, overwrite=True) as tmp:
        save_file({k: v.detach().to("cpu").contiguous() for k, v in model.head.state_dict().items()}, str(tmp / spec.file))
        adapter = None
        if cfg.lora_rank:
            model.backbone.save_pretrained(str(tmp / "adapter"))
            adapter = "adapter"
        save_state(tmp, state, trainable_parameters(model), optimizer)
        training = {"created_by": "hllm train", "trained": True, "step": state.step, "seed": cfg.seed,
                    "final_loss": state.losses[-1] if state.losses else None, "config": asdict(cfg),
                    "validation": state.validation}
        training.update(extra or {})
        rel = os.path.relpath(Path(cfg.backbone).resolve(), out)
        write_manifest(tmp, manifest_dict(rel, spec, PromptSpec.from_dict(cfg.prompt), adapter, {"provenance": training}))
    return out


def validate_model(model: TrainableModel, examples, slates, pad_id: int, batch_size: int = 8,
                   compute: Compute | None = None) -> dict:
    """AUC / Recall@k / NDCG@k of the model's rankings on held-out examples (eval mode, no grad; on
    ``compute``'s device and autocast, None = CPU fp32)."""
    from hllm.runtime.decode import decode
    from hllm.verify.metrics import evaluate

    model.eval()
    orders = []
    compute = compute or Compute("cpu", Precision.FP32, "")
    with torch.no_grad(), compute.autocast():
        for i in range(0, len(examples), batch_size):
            chunk = examples[i : i + batch_size]
            m = model.scores(to_device(collate(chunk, pad_id), compute.device)).float().cpu().numpy()
            orders += [decode(m[j], len(x.readout)).tolist() for j, x in enumerate(chunk)]
    model.train()
    rep = evaluate(orders, [s.get("labels") or [0] * len(s["candidates"]) for s in slates], resamples=0)
    return {k: v for k, v in rep.to_dict().items() if k != "ci95"}


def train_step(model, opt, cfg: TrainConfig, examples, targets, order: list[int], pad_id: int, lr: float,
          compute: Compute) -> float:
    """One optimizer step over ``accum`` forwards of ``batch_size`` slates; returns the summed loss.
    The forward runs under ``compute``'s autocast, the Sinkhorn loss in fp32."""
    for g in opt.param_groups:
        g["lr"] = lr
    opt.zero_grad(set_to_none=True)
    total = 0.0
    for m in range(cfg.accum):
        idx = order[m * cfg.batch_size:(m + 1) * cfg.batch_size]
        batch = to_device(collate([examples[i] for i in idx], pad_id), compute.device)
        n_items = batch["mask"].sum(1)
        target = pad_targets([targets[i] for i in idx], batch["mask"].shape[1], cfg.num_positions).to(compute.device)
        with compute.autocast():
            scores = model.scores(batch)
        with no_autocast(compute.device):
            loss = sinkhorn_loss(scores.float(), target, n_items, cfg.tau, cfg.sinkhorn_iters) / cfg.accum
        loss.backward()
        total += loss.item()
    opt.step()
    return total


#: The TrainConfig fields that name files or directories: stored resolved (absolute) by :func:`train`.
PATH_FIELDS = ("backbone", "slates", "out_dir", "teacher", "features", "init_head")


def _resolved(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with its :data:`PATH_FIELDS` made absolute (symbolic links resolved), so that a resumed run
    names the same files however (and from whichever directory) they are spelled."""
    return replace(cfg, **{k: str(Path(v).resolve()) for k in PATH_FIELDS if (v := getattr(cfg, k))})


def _same_option(key: str, saved, new) -> bool:
    if key in PATH_FIELDS and isinstance(saved, str) and isinstance(new, str):
        return Path(saved).resolve() == Path(new).resolve()  # a run saved before paths were stored resolved
    return saved == new


def _resume_state(cfg: TrainConfig, params, opt) -> TrainingState:
    state = load_state(Path(cfg.out_dir), params, opt)
    new = asdict(cfg)
    free = ("steps", "save_every", "threads", "val_every", "precision", "device")  # how it computes, not what
    diff = [k for k in new if k not in free and not _same_option(k, state.config.get(k), new[k])]
    if diff:
        raise CheckpointError(f"cannot resume {cfg.out_dir}: options differ from the saved run: {diff}")
    state.config = new  # the steps, threads, precision... of this run: what the next save records
    return state


def _saved_compute(out: Path) -> dict:
    """``{precision, device}`` of the previous run from the checkpoint's provenance (fp32 / cpu if absent)."""
    from hllm.training.status import read_provenance

    c = read_provenance(out / "hllm.json").get("compute", {}) if (out / "hllm.json").is_file() else {}
    return {"precision": "bf16" if c.get("precision") == "bf16" else "fp32",
            "device": "cuda" if c.get("device") == "cuda" else "cpu"}


def train(cfg: TrainConfig, resume: bool = False, on_step: Callable[[int, float], None] | None = None,
          on_cache: Callable[[int, int], None] | None = None,
          on_validation: Callable[[dict], None] | None = None) -> TrainResult:
    """Run (or resume) a training run; returns :class:`TrainResult`.

    Args:
        cfg: the run's configuration.
        resume: continue from the training state in ``cfg.out_dir`` (must exist and be well-formed,
            :func:`hllm.training.state.read_state_json`, checked before any work; its config must match
            except ``steps``, ``save_every``, ``val_every``, ``threads``, ``precision`` and ``device``;
            paths are compared resolved). Each run's compute is recorded in the state's ``runs`` and the
            provenance's ``compute_runs``.
        on_step: called after each optimizer step with (step, loss). on_cache: while preparing the
            frozen part, with (done, total). on_validation: with each learning-curve record.
    Raises: HllmError / CheckpointError / SlateError naming the problem (HllmError for ``precision``
        ``bf16`` where the device has no bf16 instructions, before any work).
    """
    from hllm.model.threads import torch_threads

    cfg.validate()
    cfg = _resolved(cfg)
    compute = resolve_compute(cfg.precision, cfg.device)
    if resume:
        if not (Path(cfg.out_dir) / STATE_JSON).is_file():
            raise CheckpointError(f"cannot resume: {Path(cfg.out_dir) / STATE_JSON} not found")
        load_state(Path(cfg.out_dir))  # readable, before any expensive work
    with torch_threads(cfg.threads):
        return _train(cfg, resume, on_step, on_cache, on_validation, compute)


def _train(cfg, resume, on_step, on_cache, on_validation, compute: Compute) -> TrainResult:
    slates, targets = load_slates(cfg)
    n_val = min(cfg.val_slates, len(slates) - 1)
    model, spec, _ = build_model(cfg)
    model.to(compute.device)
    compute.cast_frozen(model.backbone)  # bf16: frozen weights converted once, not at every autocast call
    builder = PromptBuilder(load_tokenizer(cfg.backbone), PromptSpec.from_dict(cfg.prompt), max_items=cfg.num_positions)
    params = trainable_parameters(model)
    opt = torch.optim.AdamW(params.values(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    state = _resume_state(cfg, params, opt) if resume else TrainingState(0, [], asdict(cfg))
    if state.step < cfg.steps:
        run = {"from_step": state.step, "precision": str(compute.precision), "device": compute.device}
        if state.step and not state.runs:  # saved before runs were recorded: the first run's is unknown
            state.runs.append({"from_step": 0, **_saved_compute(Path(cfg.out_dir))})
        if not state.runs or {**state.runs[-1], "from_step": state.step} != run:
            state.runs.append(run)
    t0 = time.perf_counter()
    examples = prepare(model, slates, builder, cfg, on_cache, compute) if state.step < cfg.steps else []
    cache_s = time.perf_counter() - t0
    n_train = len(slates) - n_val
    t1 = mark = time.perf_counter()
    per_step = cfg.batch_size * cfg.accum
    model.train()
    while state.step < cfg.steps:
        order = data_order(n_train, cfg.seed, per_step, start=state.step * per_step)
        state.losses.append(train_step(model, opt, cfg, examples, targets, order, builder.pad_id, cfg.lr_at(state.step),
                                  compute))
        state.step += 1
        if on_step:
            on_step(state.step, state.losses[-1])
        if n_val and (state.step % cfg.val_every == 0 or state.step == cfg.steps):
            rec = {"step": state.step, **validate_model(model, examples[n_train:], slates[n_train:], builder.pad_id,
                                                        compute=compute)}
            state.validation.append(rec)
            if on_validation:
                on_validation(rec)
        if state.step % cfg.save_every == 0 or state.step == cfg.steps:
            now = time.perf_counter()
            state.train_s, mark = state.train_s + now - mark, now
            save_checkpoint(model, spec, cfg, state, opt,
                            {"train_slates": n_train, "val_slates": n_val, "cache_s": round(cache_s, 1),
                             "train_s": round(time.perf_counter() - t1, 1), "compute": compute.to_dict(),
                             "compute_runs": state.runs})
    return TrainResult(str(Path(cfg.out_dir).resolve()), state.step, state.losses, n_train, cache_s,
                       time.perf_counter() - t1, state.validation)
