"""On-disk cache of frozen backbone hidden states, so a CPU can train and evaluate many heads.

With the lower decoder layers frozen (top-layer LoRA or the paper's frozen-backbone "Track 2"), the
hidden state entering layer ``c`` of a slate's prompt never changes. ``hllm features`` runs layers
``0..c-1`` once per slate and stores that state; training (``hllm train --features``) and evaluation
(``hllm eval --features``) then run only layers ``c..L-1``, the final norm, readout and head. The
maths is the full forward split in two (checked against it in the tests), at ``(L-c)/L`` of its cost.

Layout of a cache directory::

    meta.json            version, backbone fingerprint, layer c, prompt spec, slate ids, slates_digest, rows_only, precision
                         (written last)
    00000.npz ...        per slate: ``hidden [S, D]`` float32, ``readout [N]`` int64, ``context`` int64 scalar

Each slate file is written atomically, so an interrupted run resumes where it stopped; ``meta.json``
marks a complete cache. Size: S·D·4 bytes per slate (≈3 MB for a 1,300-token slate at D=576).

A **rows-only** cache (``rows_only``: made from another cache with ``source=``) keeps only the rows a
head reads — the N readout rows then the context row, ``readout = 0..N-1``, ``context = N`` — about
115 KB per slate. Decoder layers mix tokens, so a rows-only cache is only valid at ``layer = L``
(after the last layer: only the per-token final norm is left), the frozen-backbone case.
Version-1 caches (no ``context`` key) still load; their context position is recomputed from the prompt.

``precision`` (``fp32``, or ``bf16``: the layers ran under bf16 autocast, :mod:`hllm.training.precision`)
says how the states were computed; they are stored as float32 either way. A cache without the key is
fp32. A bf16 cache is for training speed: ``hllm eval --features`` from it is not the fp32 PyTorch
reference.
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
VERSION = 2
READABLE = (1, 2)


@dataclass(frozen=True)
class CachedSlate:
    """One cached slate: ``hidden [S, D]`` (or ``[N + 1, D]`` rows-only) float32 entering the cache's
    layer, ``readout [N]`` int64 positions into it, ``context`` the user-context row (None in a
    version-1 cache: recompute it from the prompt)."""

    hidden: np.ndarray
    readout: np.ndarray
    context: int | None


def _backbone_config(backbone: str | os.PathLike) -> dict:
    from hllm.reading import read_json

    cfg = read_json(Path(backbone) / "config.json", CheckpointError)
    return cfg if isinstance(cfg, dict) else {}


def backbone_hidden_size(backbone: str | os.PathLike) -> int | None:
    """``hidden_size`` of the backbone's ``config.json`` (None when absent): the D a cache must hold."""
    v = _backbone_config(backbone).get("hidden_size")
    return v if type(v) is int else None


def backbone_fingerprint(backbone: str | os.PathLike) -> str:
    """sha256 of the backbone's ``config.json`` and weight file sizes: a cheap identity check that a
    cache was made from the same backbone (not a proof of identical weights)."""
    root = Path(backbone)
    h = hashlib.sha256((root / "config.json").read_bytes())
    for p in sorted(root.glob("*.safetensors")):
        h.update(f"{p.name}:{p.stat().st_size}".encode())
    return h.hexdigest()


def slates_digest(slates: Sequence[dict], prompt: dict) -> str:
    """sha256 of what the prompt reads from each slate, in order: its history and the candidate fields the
    prompt's ``candidate_template`` names (canonical JSON, one slate at a time). Two runs over slates with the
    same ids but other texts differ here (the ids alone made an edited slate file reuse stale rows)."""
    from hllm.formats.prompt import candidate_fields

    fields = candidate_fields(prompt.get("candidate_template", "{index}. {title}"))
    h = hashlib.sha256()
    for s in slates:
        part = [s.get("history") or [], [{f: c.get(f) for f in fields} for c in s.get("candidates") or []]]
        h.update(json.dumps(part, sort_keys=True, ensure_ascii=False).encode("utf-8", "surrogatepass") + b"\n")
    return h.hexdigest()


@dataclass
class FeatureCache:
    """A complete cache directory (see module doc), opened read-only.

    Attributes: root, layer (hidden state entering this decoder layer), num_layers (L of the
    backbone), prompt (PromptSpec dict), slate_ids (file order), fingerprint, rows_only, precision
    (``fp32`` | ``bf16``: how the states were computed).
    """

    root: Path
    layer: int
    num_layers: int
    prompt: dict
    slate_ids: list[str]
    fingerprint: str
    rows_only: bool = False
    precision: str = "fp32"

    @classmethod
    def open(cls, root: str | os.PathLike) -> "FeatureCache":
        """Open ``root``. Raises CheckpointError when it is missing, incomplete, of another version, or its
        ``meta.json`` is unreadable (not UTF-8, malformed, nested too deeply) or of the wrong types
        (``0 ≤ layer ≤ num_layers`` integers, ``slate_ids`` a list, ``prompt`` an object)."""
        from hllm.reading import read_json

        root = Path(root)
        meta_path = root / META
        if not meta_path.is_file():
            raise CheckpointError(f"{root} is not a complete feature cache (no {META}; rerun `hllm features` to finish it)")
        meta = read_json(meta_path, CheckpointError, "{path} is not a feature cache manifest: {reason}")
        if not isinstance(meta, dict):
            raise CheckpointError(f"{meta_path} is not a feature cache manifest (a JSON {type(meta).__name__})")
        if meta.get("version") not in READABLE:
            raise CheckpointError(f"{meta_path}: feature cache version {meta.get('version')} (this hllm reads {READABLE})")
        layer, n = meta.get("layer"), meta.get("num_layers")
        if not all(type(v) is int for v in (layer, n)) or not 0 <= layer <= n:
            raise CheckpointError(f"{meta_path}: layer and num_layers must be integers with 0 ≤ layer ≤ num_layers, "
                                  f"got layer {layer!r}, num_layers {n!r}")
        if not isinstance(meta.get("slate_ids"), list) or not isinstance(meta.get("prompt"), dict):
            raise CheckpointError(f"{meta_path} is not a feature cache manifest (slate_ids a list, prompt an object)")
        return cls(root, layer, n, meta["prompt"], [str(s) for s in meta["slate_ids"]], str(meta.get("fingerprint")),
                   bool(meta.get("rows_only")), str(meta.get("precision", "fp32")))

    def __len__(self) -> int:
        return len(self.slate_ids)

    def get(self, i: int, hidden_size: int | None = None) -> CachedSlate:
        """Slate ``i`` (file order), checked: ``hidden [S, D]`` floating point (D = ``hidden_size`` when
        given), ``readout [N]`` integers within ``0..S-1``, ``context`` within ``0..S-1``; each array's
        header is checked before it is read (:class:`hllm.formats.npz.CheckedNpz`).

        Raises CheckpointError for a missing, unreadable or inconsistent slate file.
        """
        from hllm.formats.npz import CheckedNpz

        path = self.root / f"{i:05d}.npz"
        if not path.is_file():
            raise CheckpointError(f"feature cache {self.root}: slate file {path.name} is missing")
        with CheckedNpz(path, CheckpointError) as z:
            hidden = z.get("hidden", (None, hidden_size))
            readout = z.get("readout", ndim=1)
            context = int(z.get("context", ndim=0)) if "context" in z else None
        s = hidden.shape[0] if hidden.ndim == 2 else 0
        if hidden.ndim != 2 or not np.issubdtype(hidden.dtype, np.floating):
            raise CheckpointError(f"{path}: hidden must be a [S, D] float array, got {hidden.dtype} {hidden.shape}")
        if not np.issubdtype(readout.dtype, np.integer) or (readout.size and not (0 <= readout.min() <= readout.max() < s)):
            raise CheckpointError(f"{path}: readout positions must be integers within 0..{s - 1} (the hidden rows)")
        if context is not None and not 0 <= context < s:
            raise CheckpointError(f"{path}: context position {context} is outside 0..{s - 1}")
        return CachedSlate(hidden, readout, context)

    def check(self, backbone: str | os.PathLike, prompt: dict, slate_ids: Sequence[str]) -> list[int]:
        """Indices in this cache of ``slate_ids``; raise CheckpointError unless the cache matches this
        backbone and prompt spec and holds every one of the slates."""
        if self.fingerprint != backbone_fingerprint(backbone):
            raise CheckpointError(f"feature cache {self.root} was made from another backbone than {backbone}")
        cfg = _backbone_config(backbone)
        if cfg.get("num_hidden_layers") not in (None, self.num_layers):
            raise CheckpointError(f"feature cache {self.root} says num_layers {self.num_layers}, the backbone {backbone} "
                                  f"has {cfg.get('num_hidden_layers')}")
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
                on_progress: Callable[[int, int], None] | None = None,
                source: FeatureCache | None = None, precision: str = "fp32", device: str = "auto") -> FeatureCache:
    """Store the hidden state entering decoder layer ``layer`` of each slate's prompt (float32, batch 1, no
    padding); resumes an interrupted run.

    Without ``source`` the prompt runs through layers ``0..layer-1``. With ``source`` (a cache of the
    same backbone, prompt and slates at a lower layer) only layers ``source.layer..layer-1`` run, and the
    result is rows-only (module doc): ``layer`` must then be L.

    Args:
        backbone: HF model directory. slates: validated slate dicts. out_dir: cache directory.
        layer: 0 ≤ layer ≤ L (L = after the last layer, before the final norm).
        prompt: PromptSpec dict. max_items: K (slates with more candidates are refused).
        threads: torch intra-op threads. on_progress: called with (slates done, total).
        precision / device: ``fp32`` | ``bf16`` | ``auto`` and ``auto`` | ``cpu`` | ``cuda``
            (:func:`hllm.training.precision.resolve_compute`); the resolved precision is recorded in
            ``meta.json``, and resuming with another one is refused.
    Raises: HllmError for a bad layer or a precision the device lacks; CheckpointError when ``out_dir``
        holds a different cache (or an unfinished one of another precision) or ``source`` does not match.
    """
    from hllm.training.precision import resolve_compute
    import torch

    from hllm.formats.architectures import backbone_dims, read_config
    from hllm.model.hllm import load_backbone
    from hllm.model.threads import torch_threads

    n_layers = backbone_dims(read_config(Path(backbone))).num_layers
    if not 0 <= layer <= n_layers:
        raise HllmError(f"layer must be in 0..{n_layers}, got {layer}")
    if source is not None and (layer != n_layers or source.layer > layer):
        raise HllmError(f"a cache made from another cache keeps only the readout rows: --layer must be {n_layers} "
                        f"(all layers) and ≥ the source's layer {source.layer}")
    compute = resolve_compute(precision, device)
    out = Path(out_dir)
    ids = [str(s.get("slate_id", i)) for i, s in enumerate(slates)]
    meta = {"version": VERSION, "layer": layer, "num_layers": n_layers, "prompt": prompt, "slate_ids": ids,
            "fingerprint": backbone_fingerprint(backbone), "rows_only": source is not None,
            "precision": compute.precision, "backbone": str(Path(backbone).resolve()),
            "slates_digest": slates_digest(slates, prompt)}
    done = _open_or_start(out, meta)
    if done is not None:
        return done
    index = source.check(backbone, prompt, ids) if source is not None else None
    encode = _encoder(backbone, prompt, max_items)
    model = load_backbone(backbone).to(compute.device).requires_grad_(False)
    compute.cast_frozen(model)  # bf16: the weights autocast would convert at every call, converted once
    with torch_threads(threads), torch.inference_mode(), compute.autocast():
        for i, s in enumerate(slates):
            path = out / f"{i:05d}.npz"
            if not path.is_file():
                src = None if source is None else (source.get(index[i], backbone_hidden_size(backbone)), source.layer)
                row = _cache_one(model, encode(s), layer, src, compute.device)
                with atomic_path(path) as tmp:
                    with open(tmp, "wb") as f:
                        np.savez(f, **row)
            if on_progress:
                on_progress(i + 1, len(slates))
    atomic_write_json(out / META, meta)
    (out / "partial.json").unlink()
    return FeatureCache.open(out)


def _open_or_start(out: Path, meta: dict) -> "FeatureCache | None":
    """The finished cache at ``out`` if it is this one; None after marking an (un)started run of it.

    A cache directory carries its own manifest: ``meta.json`` when finished, ``partial.json`` (the same
    record: backbone fingerprint, slate ids, :func:`slates_digest`, layer, prompt, precision) from the moment a run starts. A
    directory holding neither is written into only when it is empty or absent: a slate file left there by
    anything else (a stray ``00000.npz``) would count as cached.

    Raises CheckpointError when ``out`` holds another cache, another unfinished run, an unreadable
    manifest, or files of a directory ``hllm features`` did not make.
    """
    pmeta = {k: v for k, v in meta.items() if k != "backbone"}
    if (out / META).is_file():
        old = _manifest(out / META)
        if {k: v for k, v in old.items() if k != "backbone"} != _as_old(pmeta, old):
            raise CheckpointError(f"{out} already holds a different feature cache"
                                  f"{_why_different(old, pmeta)}")
        return FeatureCache.open(out)
    partial = out / "partial.json"  # what an unfinished run was making: refuse to mix runs
    if partial.is_file():
        old = _manifest(partial)
        if old != _as_old(pmeta, old):
            raise CheckpointError(f"{out} holds an unfinished cache of other slates/options; remove it first")
    elif out.is_dir():
        stray = sorted(p.name for p in out.iterdir())
        if stray:
            raise CheckpointError(f"{out} is not a feature cache: it holds {', '.join(stray[:3])}"
                                  f"{'…' if len(stray) > 3 else ''} and no {META} or partial.json; give a new or "
                                  "empty directory")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(partial, pmeta)
    return None


def _as_old(meta: dict, old: dict) -> dict:
    """``meta`` without ``slates_digest`` when the manifest ``old`` predates the key (compared on the rest)."""
    return meta if "slates_digest" in old else {k: v for k, v in meta.items() if k != "slates_digest"}


def _why_different(old: dict, meta: dict) -> str:
    """" (different X)" naming the first manifest field of ``meta`` that ``old`` holds otherwise ("" if none)."""
    diff = [k for k in meta if k in old and old[k] != meta[k]]
    labels = {"slate_ids": "slate ids", "slates_digest": "slate texts under the same ids", "fingerprint": "backbone",
              "rows_only": "source (--from)"}
    return f" (different {labels.get(diff[0], diff[0].replace('_', ' '))})" if diff else ""


def _manifest(path: Path) -> dict:
    """A cache manifest (``meta.json`` / ``partial.json``) as a dict, ``precision`` defaulting to ``fp32``
    (caches older than the key). Raises CheckpointError when it is unreadable or not a JSON object."""
    from hllm.reading import read_json

    d = read_json(path, CheckpointError, "{path} is not a feature cache manifest: {reason}")
    if not isinstance(d, dict):
        raise CheckpointError(f"{path} is not a feature cache manifest (a JSON {type(d).__name__})")
    return {"precision": "fp32", **d}


def _encoder(backbone, prompt: dict, max_items: int):
    from hllm.formats.prompt import PromptSpec
    from hllm.runtime.prompt import PromptBuilder, load_tokenizer

    builder = PromptBuilder(load_tokenizer(backbone), PromptSpec.from_dict(prompt), max_items=max_items)
    return builder.encode_one


def _cache_one(model, enc, layer: int, src: tuple[CachedSlate, int] | None, device: str = "cpu") -> dict:
    """The arrays stored for one encoded slate (float32 whatever the autocast): the full sequence, or
    rows-only from ``src`` = (the slate in the source cache, the source's layer)."""
    import torch

    from hllm.model.hllm import run_layers

    if src is None:
        h = run_layers(model, torch.tensor([enc.ids], device=device), 0, layer)[0].to("cpu", torch.float32).numpy()
        return {"hidden": h, "readout": np.asarray(enc.readout, np.int64), "context": np.int64(enc.context_end)}
    cached, start = src
    if cached.readout.tolist() != enc.readout or cached.hidden.shape[0] != len(enc.ids):
        raise CheckpointError("the source cache's slate does not match its prompt (other tokenizer or prompt?)")
    h = run_layers(model, torch.from_numpy(cached.hidden)[None].to(device), start, layer)[0].to("cpu", torch.float32).numpy()
    rows = list(enc.readout) + [enc.context_end]
    n = len(enc.readout)
    return {"hidden": h[rows], "readout": np.arange(n, dtype=np.int64), "context": np.int64(n)}


def _adapted_layers(backbone) -> set[int]:
    """Indices of decoder layers that hold LoRA modules (peft ``lora_A``) in a peft-wrapped model."""
    import re

    out = set()
    for name, _ in backbone.named_modules():
        m = re.search(r"layers\.(\d+)\..*lora_A", name)
        if m:
            out.add(int(m.group(1)))
    return out


def check_adapter_above(model, cache: FeatureCache, ckpt: str | os.PathLike) -> None:
    """Refuse a cache taken above a layer the checkpoint's adapter changes: those layers ran without the
    adapter when the cache was made, so a forward from it would silently drop part of the adapter.

    Args: model: :class:`hllm.model.hllm.HllmModel` (peft-wrapped backbone or plain). cache: the open cache.
    Raises: CheckpointError naming the adapted layers below ``cache.layer``.
    """
    below = sorted(i for i in _adapted_layers(model.backbone) if i < cache.layer)
    if below:
        raise CheckpointError(f"{ckpt}: the adapter changes layers {below[:5]}…, below the cached layer {cache.layer}; "
                              f"cache a layer ≤ {below[0]}")


def context_positions(cache: FeatureCache, cached: Sequence[CachedSlate], slates: Sequence[dict] | None) -> list[int]:
    """The user-context row of each cached slate: stored (version 2) or recomputed from the slate's
    prompt (version 1). Raises CheckpointError when a version-1 entry has no slate to recompute from."""
    out, encode = [], None
    for j, c in enumerate(cached):
        if c.context is not None:
            out.append(c.context)
            continue
        if slates is None:
            raise CheckpointError(f"feature cache {cache.root} (version 1) stores no context position: pass the slates")
        if encode is None:
            from hllm.formats.prompt import PromptSpec
            from hllm.runtime.prompt import PromptBuilder, load_tokenizer

            backbone = json.loads((cache.root / META).read_text()).get("backbone")
            encode = PromptBuilder(load_tokenizer(backbone), PromptSpec.from_dict(cache.prompt)).encode_one
        out.append(encode(slates[j]).context_end)
    return out


def scores_from_cache(ckpt: str | os.PathLike, cache: FeatureCache, slate_ids: Sequence[str],
                      threads: int | None = None, on_progress: Callable[[int, int], None] | None = None,
                      slates: Sequence[dict] | None = None):
    """Score matrices of a checkpoint on cached slates: layers ``cache.layer..L-1`` (with the adapter
    unmerged, as the PyTorch reference), final norm, readout, (context), head. Same maths as the
    checkpoint's full forward (checked in the tests); at ``(L-c)/L`` of its cost.

    Args:
        ckpt: checkpoint directory. cache: an open cache holding the slates ``slate_ids``.
        slates: the slates themselves (needed only for a context-reading head on a version-1 cache).
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
    check_adapter_above(model, cache, ckpt)
    d = backbone_hidden_size(manifest.backbone_path)
    for done, i in enumerate(index, 1):
        c = cache.get(i, d)
        ctx = None
        if model.reads_context:
            ctx = torch.tensor(context_positions(cache, [c], None if slates is None else [slates[done - 1]]))
        with torch_threads(threads), torch.inference_mode():
            mask = torch.ones(1, len(c.readout), dtype=torch.bool)
            m = model.forward_from(torch.from_numpy(c.hidden)[None], cache.layer, torch.from_numpy(c.readout)[None],
                                   mask, ctx)
        yield m[0].numpy()
        if on_progress:
            on_progress(done, len(slate_ids))
