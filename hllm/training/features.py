"""On-disk cache of frozen backbone hidden states, so a CPU can train and evaluate many heads.

With the lower decoder layers frozen (top-layer LoRA or the paper's frozen-backbone "Track 2"), the
hidden state entering layer ``c`` of a slate's prompt never changes. ``hllm features`` runs layers
``0..c-1`` once per slate and stores that state; training (``hllm train --features``) and evaluation
(``hllm eval --features``) then run only layers ``c..L-1``, the final norm, readout and head. The
maths is the full forward split in two (checked against it in the tests), at ``(L-c)/L`` of its cost.

Layout of a cache directory::

    meta.json            backbone config hash, layer c, prompt spec, slate ids (written last)
    00000.npz ...        per slate: ``hidden [S, D]`` float32, ``readout [N]`` int64

Each slate file is written atomically, so an interrupted run resumes where it stopped; ``meta.json``
marks a complete cache. Size: S·D·4 bytes per slate (≈3 MB for a 1,300-token slate at D=576).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from hllm.errors import CheckpointError, HllmError
from hllm.files import atomic_path, atomic_write_json

META = "meta.json"
VERSION = 1


def backbone_fingerprint(backbone: str | os.PathLike) -> str:
    """sha256 of the backbone's ``config.json`` and weight file sizes: a cheap identity check that a
    cache was made from the same backbone (not a proof of identical weights)."""
    root = Path(backbone)
    h = hashlib.sha256((root / "config.json").read_bytes())
    for p in sorted(root.glob("*.safetensors")):
        h.update(f"{p.name}:{p.stat().st_size}".encode())
    return h.hexdigest()


@dataclass
class FeatureCache:
    """A complete cache directory (see module doc), opened read-only.

    Attributes: root, layer (hidden state entering this decoder layer), num_layers (L of the
    backbone), prompt (PromptSpec dict), slate_ids (file order), fingerprint.
    """

    root: Path
    layer: int
    num_layers: int
    prompt: dict
    slate_ids: list[str]
    fingerprint: str

    @classmethod
    def open(cls, root: str | os.PathLike) -> "FeatureCache":
        """Open ``root``. Raises CheckpointError when it is missing, incomplete or of another version."""
        root = Path(root)
        meta_path = root / META
        if not meta_path.is_file():
            raise CheckpointError(f"{root} is not a complete feature cache (no {META}; rerun `hllm features` to finish it)")
        meta = json.loads(meta_path.read_text())
        if meta.get("version") != VERSION:
            raise CheckpointError(f"{meta_path}: feature cache version {meta.get('version')} (this hllm reads {VERSION})")
        return cls(root, int(meta["layer"]), int(meta["num_layers"]), meta["prompt"], list(meta["slate_ids"]),
                   meta["fingerprint"])

    def __len__(self) -> int:
        return len(self.slate_ids)

    def get(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Slate ``i``: (hidden ``[S, D]`` float32, readout positions ``[N]`` int64)."""
        with np.load(self.root / f"{i:05d}.npz") as z:
            return z["hidden"], z["readout"]

    def check(self, backbone: str | os.PathLike, prompt: dict, slate_ids: Sequence[str]) -> list[int]:
        """Indices in this cache of ``slate_ids``; raise CheckpointError unless the cache matches this
        backbone and prompt spec and holds every one of the slates."""
        if self.fingerprint != backbone_fingerprint(backbone):
            raise CheckpointError(f"feature cache {self.root} was made from another backbone than {backbone}")
        if self.prompt != prompt:
            raise CheckpointError(f"feature cache {self.root} used prompt {self.prompt}, not {prompt}")
        where = {sid: i for i, sid in enumerate(self.slate_ids)}
        missing = [str(s) for s in slate_ids if str(s) not in where]
        if missing:
            raise CheckpointError(f"feature cache {self.root} lacks {len(missing)} of the {len(slate_ids)} slates "
                                  f"(first: {missing[0]}): cache the slates you train or evaluate on")
        return [where[str(s)] for s in slate_ids]


def build_cache(backbone: str | os.PathLike, slates: Sequence[dict], out_dir: str | os.PathLike, layer: int,
                prompt: dict, max_items: int, threads: int | None = None,
                on_progress: Callable[[int, int], None] | None = None) -> FeatureCache:
    """Run decoder layers ``0..layer-1`` of ``backbone`` (fp32, batch 1, no padding) on each slate's
    prompt and store the hidden state entering ``layer``; resumes an interrupted run.

    Args:
        backbone: HF model directory. slates: validated slate dicts. out_dir: cache directory.
        layer: 0 ≤ layer ≤ L (L = after the last layer, before the final norm).
        prompt: PromptSpec dict. max_items: K (slates with more candidates are refused).
        threads: torch intra-op threads. on_progress: called with (slates done, total).
    Raises: HllmError for a bad layer; CheckpointError when ``out_dir`` holds a different cache.
    """
    import torch

    from hllm.formats.architectures import backbone_dims, read_config
    from hllm.formats.prompt import PromptSpec
    from hllm.model.hllm import load_backbone, run_layers
    from hllm.model.threads import torch_threads
    from hllm.runtime.prompt import PromptBuilder, load_tokenizer

    n_layers = backbone_dims(read_config(Path(backbone))).num_layers
    if not 0 <= layer <= n_layers:
        raise HllmError(f"layer must be in 0..{n_layers}, got {layer}")
    out = Path(out_dir)
    ids = [str(s.get("slate_id", i)) for i, s in enumerate(slates)]
    meta = {"version": VERSION, "layer": layer, "num_layers": n_layers, "prompt": prompt, "slate_ids": ids,
            "fingerprint": backbone_fingerprint(backbone), "backbone": str(Path(backbone).resolve())}
    if (out / META).is_file():
        old = json.loads((out / META).read_text())
        if {k: v for k, v in old.items() if k != "backbone"} != {k: v for k, v in meta.items() if k != "backbone"}:
            raise CheckpointError(f"{out} already holds a different feature cache")
        return FeatureCache.open(out)
    out.mkdir(parents=True, exist_ok=True)
    partial = out / "partial.json"  # what an unfinished run was making: refuse to mix runs
    pmeta = {k: v for k, v in meta.items() if k != "backbone"}
    if partial.is_file() and json.loads(partial.read_text()) != pmeta:
        raise CheckpointError(f"{out} holds an unfinished cache of other slates/options; remove it first")
    atomic_write_json(partial, pmeta)
    builder = PromptBuilder(load_tokenizer(backbone), PromptSpec.from_dict(prompt), max_items=max_items)
    model = load_backbone(backbone)
    model.eval()
    with torch_threads(threads), torch.inference_mode():
        for i, s in enumerate(slates):
            path = out / f"{i:05d}.npz"
            if not path.is_file():
                b = builder.encode([s])
                h = run_layers(model, torch.from_numpy(b.input_ids), 0, layer)
                with atomic_path(path) as tmp:
                    with open(tmp, "wb") as f:
                        np.savez(f, hidden=h[0].numpy(), readout=b.readout_positions[0].astype(np.int64))
            if on_progress:
                on_progress(i + 1, len(slates))
    atomic_write_json(out / META, meta)
    partial.unlink()
    return FeatureCache.open(out)


def _adapted_layers(backbone) -> set[int]:
    """Indices of decoder layers that hold LoRA modules (peft ``lora_A``) in a peft-wrapped model."""
    import re

    out = set()
    for name, _ in backbone.named_modules():
        m = re.search(r"layers\.(\d+)\..*lora_A", name)
        if m:
            out.add(int(m.group(1)))
    return out


def scores_from_cache(ckpt: str | os.PathLike, cache: FeatureCache, slate_ids: Sequence[str],
                      threads: int | None = None, on_progress: Callable[[int, int], None] | None = None):
    """Score matrices of a checkpoint on cached slates: layers ``cache.layer..L-1`` (with the adapter
    unmerged, as the PyTorch reference), final norm, readout, head. Same maths as the checkpoint's
    full forward (checked in the tests); at ``(L-c)/L`` of its cost.

    Args:
        ckpt: checkpoint directory. cache: an open cache holding the slates ``slate_ids``.
    Yields: per slate, ``[N, K]`` float32 score matrix (numpy).
    Raises: CheckpointError when the cache does not match the checkpoint's backbone or prompt, or the
        adapter changes a layer below ``cache.layer`` (those layers were cached without it).
    """
    import torch

    from hllm.formats.checkpoint import load_manifest
    from hllm.model.hllm import load_model
    from hllm.model.threads import torch_threads

    manifest = load_manifest(ckpt)
    index = cache.check(manifest.backbone_path, manifest.prompt.to_dict(), slate_ids)
    model = load_model(manifest)
    below = sorted(i for i in _adapted_layers(model.backbone) if i < cache.layer)
    if below:
        raise CheckpointError(f"{ckpt}: the adapter changes layers {below[:5]}…, below the cached layer {cache.layer}")
    for done, i in enumerate(index, 1):
        h_np, pos_np = cache.get(i)
        with torch_threads(threads), torch.inference_mode():
            mask = torch.ones(1, len(pos_np), dtype=torch.bool)
            m = model.forward_from(torch.from_numpy(h_np)[None], cache.layer, torch.from_numpy(pos_np)[None], mask)
        yield m[0].numpy()
        if on_progress:
            on_progress(done, len(slate_ids))
