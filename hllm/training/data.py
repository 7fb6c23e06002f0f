"""What a training run iterates over: slates with their targets, and per slate the input of the
trained part of the model (token ids, a cached hidden state, or frozen readout features)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from hllm.errors import HllmError
from hllm.training.config import TrainConfig
from hllm.training.targets import build_target, read_teacher


@dataclass
class Example:
    """One training slate's input to the trained part.

    ``kind``: ``ids`` (full LoRA: the token ids are run), ``hidden`` (top-layer LoRA: ``hidden`` is the
    state entering the first trained layer ``[S, D]``) or ``items`` (frozen backbone: ``hidden`` is the
    final readout features ``[N, D]`` and ``context_vec [D]`` the final user-context row).
    ``readout [N]`` and ``context`` index into ``hidden``/``ids`` (``context`` None when the head does
    not read it). ``cached`` = (feature cache, index in it, hidden size): ``hidden`` is read from the
    cache when a batch needs it (:meth:`hidden_state`) instead of being held in memory, so a run over
    thousands of cached slates (3 MB each at layer c) needs memory for one batch only.
    """

    kind: str
    ids: list[int] | None
    hidden: torch.Tensor | None
    readout: torch.Tensor
    context: int | None
    context_vec: torch.Tensor | None = None
    cached: tuple | None = None

    def hidden_state(self) -> torch.Tensor:
        """``hidden`` (float32), read from the feature cache for a cached example.

        Raises: CheckpointError when the cached slate's readout positions differ from the prompt's.
        """
        if self.cached is None:
            return self.hidden
        from hllm.errors import CheckpointError

        cache, index, size = self.cached
        c = cache.get(index, size)
        if c.readout.tolist() != self.readout.tolist():
            raise CheckpointError(f"feature cache {cache.root}: slate {index} has other readout positions than its "
                                  "prompt (another tokenizer or prompt?)")
        return torch.from_numpy(np.ascontiguousarray(c.hidden, dtype=np.float32))


def load_slates(cfg: TrainConfig) -> tuple[list[dict], list[np.ndarray]]:
    """The run's slates (first ``max_slates``; sub-slates with ``sample_items``) and their target
    matrices; slates without a usable target are dropped.

    Raises: HllmError (a teacher target without ``--teacher``, a slate over K, no usable slate).
    """
    from hllm.runtime.slates import read_slates, sample_subslate

    slates = read_slates(cfg.slates, limit=cfg.max_slates)
    teacher = read_teacher(cfg.teacher) if cfg.teacher else None
    if cfg.target != "clicks" and teacher is None:
        raise HllmError(f"target {cfg.target!r} needs --teacher (a teacher permutations JSONL)")
    if cfg.sample_items:
        sampled = []
        for i, s in enumerate(slates):
            sub, keep = sample_subslate(s, cfg.sample_items, cfg.seed * 7919 + i)
            sid = str(s.get("slate_id", "?"))
            if teacher is not None and sid in teacher and len(keep) < len(s["candidates"]):
                where = {c: j for j, c in enumerate(keep)}
                teacher[sid] = [where[i] for i in teacher[sid] if i in where]
            sampled.append(sub)
        slates = sampled
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


def prepare(model, slates: Sequence[dict], builder, cfg: TrainConfig,
            on_progress: Callable[[int, int], None] | None = None, compute=None) -> list[Example]:
    """Per slate, the input of the trained part (see :class:`Example`): computed once from the prompt
    or from the run's feature cache (running only layers ``cache.layer..start_layer-1``).

    ``model`` is a :class:`hllm.training.trainer.TrainableModel` on ``compute.device``; ``compute`` (a
    :class:`hllm.training.precision.Compute`, None = CPU fp32) sets the device and the autocast of the
    frozen forward. The stored tensors are float32 on the CPU whatever the precision.
    Raises HllmError for a cache whose layer is above the first trained layer; CheckpointError for a
    cache of other slates / prompt.
    """
    import contextlib
    from hllm.model.hllm import gather_context, gather_readout, run_layers
    from hllm.training.features import FeatureCache, backbone_hidden_size, context_positions

    reads_ctx = model.model.reads_context
    encoded = [builder.encode_one(s) for s in slates]
    if model.start_layer == 0 and cfg.lora_rank:
        return [Example("ids", e.ids, None, torch.tensor(e.readout), e.context_end if reads_ctx else None)
                for e in encoded]
    cache = index = None
    if cfg.features:
        cache = FeatureCache.open(cfg.features)
        index = cache.check(cfg.backbone, cfg.prompt, [str(s.get("slate_id", i)) for i, s in enumerate(slates)])
        if cache.layer > model.start_layer:
            raise HllmError(f"feature cache {cfg.features} holds layer {cache.layer}, but training starts at "
                            f"layer {model.start_layer}: cache a lower layer or train fewer --lora-layers")
    out = []
    frozen = model.start_layer >= model.model.num_layers
    if cache is not None and cache.layer == model.start_layer and not frozen:  # nothing to run: read when needed
        size = backbone_hidden_size(cfg.backbone)
        for i, e in enumerate(encoded):
            out.append(Example("hidden", None, None, torch.tensor(e.readout), e.context_end if reads_ctx else None,
                               cached=(cache, index[i], size)))
            if on_progress:
                on_progress(i + 1, len(slates))
        return out
    dev = compute.device if compute is not None else "cpu"
    cast = compute.autocast() if compute is not None else contextlib.nullcontext()
    with torch.inference_mode(), cast:
        for i, (s, e) in enumerate(zip(slates, encoded)):
            if cache is not None:
                c = cache.get(index[i], backbone_hidden_size(cfg.backbone))
                h, start, readout = torch.from_numpy(c.hidden)[None], cache.layer, torch.from_numpy(c.readout)
                ctx = context_positions(cache, [c], [s])[0]
            else:
                h, start, readout, ctx = torch.tensor([e.ids]), 0, torch.tensor(e.readout), e.context_end
            h = run_layers(model.backbone, h.to(dev), start, model.start_layer)
            if frozen:
                final = model.model.upper(h, model.start_layer)
                vec = _cpu32(gather_context(final, torch.tensor([ctx], device=dev))[0]) if reads_ctx else None
                items = _cpu32(gather_readout(final, readout[None].to(dev))[0])
                out.append(Example("items", None, items, torch.arange(len(readout)), None, vec))
            else:
                out.append(Example("hidden", None, _cpu32(h[0]), readout, ctx if reads_ctx else None))
            if on_progress:
                on_progress(i + 1, len(slates))
    return out


def _cpu32(t: torch.Tensor) -> torch.Tensor:
    """A float32 CPU copy of ``t`` (an example outlives the autocast region and the device)."""
    return t.detach().to("cpu", torch.float32).clone()


def to_device(batch: dict, device: str) -> dict:
    """A :func:`collate` batch with every tensor on ``device`` (None entries stay None)."""
    return {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in batch.items()}


def collate(examples: Sequence[Example], pad_id: int) -> dict:
    """Right-pad a batch of examples into the tensors the trained part takes: ``ids`` or ``hidden``
    ``[B, S, D]`` / ``items [B, N, D]``, ``readout [B, N]``, ``mask [B, N]``, ``context [B]`` or
    ``context_vec [B, D]`` (None when unused)."""
    n = [len(x.readout) for x in examples]
    n_max = max(n)
    mask = torch.arange(n_max)[None] < torch.tensor(n)[:, None]
    readout = torch.zeros(len(examples), n_max, dtype=torch.long)
    for j, x in enumerate(examples):
        readout[j, : n[j]] = x.readout
    ctx = None if examples[0].context is None else torch.tensor([x.context for x in examples])
    vec = None if examples[0].context_vec is None else torch.stack([x.context_vec for x in examples])
    out = {"readout": readout, "mask": mask, "context": ctx, "context_vec": vec, "ids": None, "hidden": None,
           "items": None}
    kind = examples[0].kind
    if kind == "ids":
        s_max = max(len(x.ids) for x in examples)
        ids = torch.full((len(examples), s_max), pad_id, dtype=torch.long)
        for j, x in enumerate(examples):
            ids[j, : len(x.ids)] = torch.tensor(x.ids)
        out["ids"] = ids
    elif kind == "items":
        out["items"] = _pad([x.hidden for x in examples], n_max)
    else:
        hidden = [x.hidden_state() for x in examples]
        out["hidden"] = _pad(hidden, max(h.shape[0] for h in hidden))
    return out


def _pad(rows: Sequence[torch.Tensor], length: int) -> torch.Tensor:
    out = torch.zeros(len(rows), length, rows[0].shape[-1])
    for j, r in enumerate(rows):
        out[j, : r.shape[0]] = r
    return out


def data_order(n: int, seed: int, count: int, start: int = 0) -> list[int]:
    """Indices ``start..start+count`` of the infinite sequence of per-epoch permutations of ``range(n)``
    (one seeded ``torch.randperm`` per epoch): the same order whether a run is resumed or not."""
    out: list[int] = []
    epoch = start // n
    pos = start % n
    while len(out) < count:
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100003 + epoch)).tolist()
        out.extend(perm[pos:])
        epoch, pos = epoch + 1, 0
    return out[:count]


def pad_targets(targets: Sequence[np.ndarray], n_max: int, k: int) -> torch.Tensor:
    """Target matrices ``[n_i, n_i]`` zero-padded into one ``[B, n_max, K]`` float32 tensor."""
    out = torch.zeros(len(targets), n_max, k)
    for i, t in enumerate(targets):
        out[i, : t.shape[0], : t.shape[1]] = torch.from_numpy(t)
    return out
