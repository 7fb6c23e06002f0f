"""The hLLM checkpoint format: a directory with a manifest ``hllm.json`` (torch-free).

Layout::

    CKPT/
      hllm.json           manifest (below)
      head.safetensors    scoring-head weights (file name set in the manifest)
      adapter/            optional PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors)

Manifest (``format_version`` 1)::

    {"format": "hllm-checkpoint", "format_version": 1,
     "backbone": {"path": "<HF model dir, absolute or relative to CKPT>"},
     "adapter": {"path": "adapter"} | null,
     "head": {"kind": "linear" | "self_attention" | "slot_query", "input_dim": D, "d_model": 512,
              "num_layers": 2, "num_heads": 8, "ff_dim": 1024, "num_positions": K,
              "file": "head.safetensors"},
     "prompt": {PromptSpec fields}}

:func:`load_manifest` validates everything it can without loading weights and names the problem:
missing files, unknown head kind, head input width ≠ backbone hidden size, an adapter whose LoRA
matrices do not fit the backbone's linear layers (i.e. trained on another base).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hllm.formats.architectures import BackboneDims, backbone_dims, read_config
from hllm.errors import CheckpointError
from hllm.files import atomic_write_json
from hllm.formats.prompt import PromptSpec

MANIFEST = "hllm.json"
FORMAT_VERSION = 1
HEAD_KINDS = ("linear", "self_attention", "slot_query")


@dataclass(frozen=True)
class HeadSpec:
    """Scoring head hyper-parameters (paper §3.3).

    Attributes:
        kind: ``linear`` (probe: Linear(D,d)→Linear(d,K) per item), ``self_attention``
            (Linear(D,d) → ``num_layers`` encoder layers over items → Linear(d,K)) or ``slot_query``
            (K learned position queries cross-attend to items; M = items · queriesᵀ).
        input_dim: D, the backbone hidden size.
        d_model: head width (paper 512).
        num_layers / num_heads / ff_dim: encoder geometry (self_attention; slot_query uses one
            cross-attention layer with ``num_heads``).
        num_positions: K, rank positions = the largest slate the head can rank.
        file: weights file inside the checkpoint directory.
        context: the head also reads the user context: the final hidden state at the last token of
            the user context (graph input ``context_positions``), projected to ``d_model`` and added
            as one more token the items attend to (beyond the paper; docs/training.md says what it buys).
    """

    kind: str
    input_dim: int
    num_positions: int
    d_model: int = 512
    num_layers: int = 2
    num_heads: int = 8
    ff_dim: int = 1024
    file: str = "head.safetensors"
    context: bool = False

    def validate(self) -> None:
        """Raise CheckpointError for an unknown kind or non-positive / inconsistent sizes."""
        if self.kind not in HEAD_KINDS:
            raise CheckpointError(f"unknown head kind {self.kind!r}; known: {', '.join(HEAD_KINDS)}")
        for name in ("input_dim", "num_positions", "d_model", "num_layers", "num_heads", "ff_dim"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise CheckpointError(f"head {name} must be a positive integer, got {v!r}")
        if not isinstance(self.context, bool):
            raise CheckpointError(f"head context must be true or false, got {self.context!r}")
        if self.d_model % self.num_heads:
            raise CheckpointError(f"head d_model={self.d_model} is not divisible by num_heads={self.num_heads}")


@dataclass
class Manifest:
    """A parsed, validated ``hllm.json``; paths are resolved to absolute paths.

    Attributes:
        root: the checkpoint directory.
        backbone_path: the Hugging Face model directory (config.json, weights, tokenizer.json).
        adapter_path: PEFT adapter directory or None.
        head: :class:`HeadSpec`.
        prompt: :class:`PromptSpec`.
        dims: backbone dimensions from its config.
        extra: other top-level keys (e.g. ``training`` provenance), kept on save.
    """

    root: Path
    backbone_path: Path
    adapter_path: Path | None
    head: HeadSpec
    prompt: PromptSpec
    dims: BackboneDims
    extra: dict = field(default_factory=dict)

    @property
    def head_path(self) -> Path:
        return self.root / self.head.file

    @property
    def tokenizer_path(self) -> Path:
        return self.backbone_path / "tokenizer.json"

    @property
    def num_positions(self) -> int:
        return self.head.num_positions


def _resolve(root: Path, p: str) -> Path:
    q = Path(p)
    return q if q.is_absolute() else (root / q).resolve()


def manifest_dict(
    backbone: str, head: HeadSpec, prompt: PromptSpec, adapter: str | None = None, extra: dict | None = None
) -> dict:
    """The JSON dict of a manifest (paths stored as given: relative to CKPT or absolute)."""
    d = {
        "format": "hllm-checkpoint",
        "format_version": FORMAT_VERSION,
        "backbone": {"path": str(backbone)},
        "adapter": {"path": str(adapter)} if adapter else None,
        "head": asdict(head),
        "prompt": prompt.to_dict(),
    }
    d.update(extra or {})
    return d


def write_manifest(ckpt_dir: str | os.PathLike, d: dict) -> Path:
    """Write ``hllm.json`` atomically into ``ckpt_dir``; returns its path."""
    return atomic_write_json(Path(ckpt_dir) / MANIFEST, d)


def load_manifest(ckpt_dir: str | os.PathLike) -> Manifest:
    """Read and validate a checkpoint manifest.

    Raises:
        CheckpointError: naming the problem — missing directory/manifest/head file/backbone/
            tokenizer, wrong format version, unknown head kind, head input_dim ≠ backbone hidden
            size, adapter missing or not matching the backbone.
    """
    root = Path(ckpt_dir).resolve()
    mpath = root / MANIFEST
    if not root.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {root}")
    if not mpath.is_file():
        raise CheckpointError(f"not an hllm checkpoint: {mpath} is missing")
    try:
        d = json.loads(mpath.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{mpath} is not valid JSON: {e}") from None
    if d.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{mpath}: format_version {d.get('format_version')!r} not supported (expected 1)")
    for key in ("backbone", "head", "prompt"):
        if not isinstance(d.get(key), dict):
            raise CheckpointError(f"{mpath}: section {key!r} is missing or not an object")
    backbone = _resolve(root, d["backbone"].get("path", ""))
    config = read_config(backbone)
    dims = backbone_dims(config)
    if not (backbone / "tokenizer.json").is_file():
        raise CheckpointError(f"backbone {backbone} has no tokenizer.json")
    try:
        head = HeadSpec(**d["head"])
    except TypeError as e:
        raise CheckpointError(f"{mpath}: bad head section: {e}") from None
    head.validate()
    if head.input_dim != dims.hidden_size:
        raise CheckpointError(
            f"head input_dim={head.input_dim} but backbone hidden_size={dims.hidden_size} ({backbone})"
        )
    if not (root / head.file).is_file():
        raise CheckpointError(f"head weights not found: {root / head.file}")
    prompt = PromptSpec.from_dict(d["prompt"])
    adapter = None
    if d.get("adapter"):
        adapter = _resolve(root, d["adapter"].get("path", ""))
        check_adapter(adapter, dims)
    known = {"format", "format_version", "backbone", "adapter", "head", "prompt"}
    extra = {k: v for k, v in d.items() if k not in known}
    return Manifest(root, backbone, adapter, head, prompt, dims, extra)


def check_adapter(adapter_dir: Path, dims: BackboneDims) -> None:
    """Check a PEFT LoRA adapter fits the backbone: every ``lora_A [r, in]`` / ``lora_B [out, r]``
    must match the in/out features of the linear layer it targets.

    Raises: CheckpointError naming the first mismatching tensor (adapter trained on another base).
    """
    cfg = adapter_dir / "adapter_config.json"
    weights = adapter_dir / "adapter_model.safetensors"
    for p in (cfg, weights):
        if not p.is_file():
            raise CheckpointError(f"adapter file not found: {p}")
    from safetensors import safe_open

    shapes = dims.linear_shapes()
    with safe_open(str(weights), framework="numpy") as f:
        for name in f.keys():
            proj = next((p for p in shapes if f".{p}." in name), None)
            if proj is None or "lora_" not in name:
                continue
            shape = f.get_slice(name).get_shape()
            fin, fout = shapes[proj]
            if ".lora_A." in name and shape[1] != fin:
                raise CheckpointError(
                    f"adapter does not match the backbone: {name} has in_features {shape[1]}, backbone {proj} has {fin}"
                )
            if ".lora_B." in name and shape[0] != fout:
                raise CheckpointError(
                    f"adapter does not match the backbone: {name} has out_features {shape[0]}, backbone {proj} has {fout}"
                )
            layer = _layer_index(name)
            if layer is not None and layer >= dims.num_layers:
                raise CheckpointError(
                    f"adapter does not match the backbone: {name} targets layer {layer}, backbone has {dims.num_layers}"
                )


def _layer_index(name: str) -> int | None:
    parts = name.split(".")
    for a, b in zip(parts, parts[1:]):
        if a == "layers" and b.isdigit():
            return int(b)
    return None
