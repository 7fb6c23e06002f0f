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
     "head": {"kind": "probe" | "linear" | "self_attention" | "slot_query", "input_dim": D, "d_model": 512,
              "num_layers": 2, "num_heads": 8, "ff_dim": 1024, "num_positions": K,
              "file": "head.safetensors", "context": false, "activation": null,
              "norm_first": true, "final_norm": true},
     "prompt": {PromptSpec fields}}

:func:`load_manifest` validates everything it can without loading weights and names the problem:
missing files, unknown head kind, head input width ≠ backbone hidden size, a backbone tokenizer with
ids past the embedding (:func:`hllm.formats.tokenizer.check_tokenizer`), an adapter whose LoRA
matrices do not fit the backbone's linear layers (i.e. trained on another base), an adapter config
that is not a JSON object or targets modules the backbone does not have, and every field of the
wrong type (a list where an object goes, a number where a path goes, K as a string).

Paths: ``head.file`` and ``adapter.path`` name files *of the checkpoint*: they must
be relative and stay inside ``CKPT`` after resolving ``..`` and symbolic links
(:func:`hllm.reading.contained_path`), so a crafted manifest can neither make hllm read weights from
elsewhere nor make ``hllm merge`` (which copies the head file into its output) write outside its
output directory. ``backbone.path`` is different by design: a checkpoint *refers* to a backbone it
does not contain (usually a shared Hugging Face directory, e.g. ``../../work/smollm2``), so it may be
absolute or point outside ``CKPT``; hllm only ever reads it (config, weights, tokenizer) and never
writes there.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from hllm.formats.adapter import AdapterLayout, read_adapter
from hllm.formats.architectures import BackboneDims, backbone_dims, read_config
from hllm.errors import CheckpointError
from hllm.files import atomic_write_json
from hllm.reading import contained_path, read_json
from hllm.formats.prompt import PromptSpec
from hllm.formats.tokenizer import check_tokenizer

MANIFEST = "hllm.json"
FORMAT = "hllm-checkpoint"
FORMAT_VERSION = 1
HEAD_KINDS = ("probe", "linear", "self_attention", "slot_query")
#: Activations a head may use between its linear layers (``None``: the kind's default, see HeadSpec).
ACTIVATIONS = ("none", "relu", "gelu", "silu")
#: Kinds built of attention blocks (num_heads, ff_dim, num_layers and the block options apply).
ATTENTION_KINDS = ("self_attention", "slot_query")


@dataclass(frozen=True)
class HeadSpec:
    """Scoring head hyper-parameters (paper §3.3).

    The equations and parameter names of each kind: docs/formats.md, "Scoring heads".

    Attributes:
        kind: ``probe`` (one Linear(D,K) per item), ``linear`` (Linear(D,d) → activation → Linear(d,K) per
            item; no activation by default, an MLP head with one), ``self_attention`` (Linear(D,d) →
            ``num_layers`` encoder layers over items → [LayerNorm] → Linear(d,K)) or ``slot_query``
            (K learned position queries cross-attend to items; M = items · queriesᵀ / √d).
        input_dim: D, the backbone hidden size.
        d_model: head width (paper 512).
        num_layers / num_heads / ff_dim: encoder geometry (self_attention; slot_query uses one
            cross-attention layer with ``num_heads``).
        num_positions: K, rank positions = the largest slate the head can rank.
        file: weights file inside the checkpoint directory.
        context: the head also reads the user context: the final hidden state at the last token of
            the user context (graph input ``context_positions``), projected to ``d_model`` and added
            as one more token the items attend to (beyond the paper; docs/training.md says what it buys).
        activation: between the two linear layers of ``linear`` (default ``none``) and of each block's
            feed-forward (default ``gelu``): ``none``, ``relu``, ``gelu`` (exact erf) or ``silu``.
        norm_first: attention blocks are pre-LayerNorm (True, hllm's own) or post-LayerNorm (False: the
            default of ``torch.nn.TransformerEncoderLayer``).
        final_norm: a LayerNorm after the last block (True, hllm's own; ``nn.TransformerEncoder`` has
            none unless given ``norm=``).
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
    activation: str | None = None
    norm_first: bool = True
    final_norm: bool = True

    @property
    def act(self) -> str:
        """The activation in force: ``activation``, else ``none`` for ``linear`` and ``gelu`` for blocks."""
        return self.activation or ("gelu" if self.kind in ATTENTION_KINDS else "none")

    def validate(self) -> None:
        """Raise CheckpointError for an unknown kind or non-positive / inconsistent sizes."""
        if self.kind not in HEAD_KINDS:
            raise CheckpointError(f"unknown head kind {self.kind!r}; known: {', '.join(HEAD_KINDS)}")
        for name in ("input_dim", "num_positions", "d_model", "num_layers", "num_heads", "ff_dim"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise CheckpointError(f"head {name} must be a positive integer, got {v!r}")
        if not isinstance(self.file, str) or not self.file.strip():
            raise CheckpointError(f"head file must be a file name, got {self.file!r}")
        for name in ("context", "norm_first", "final_norm"):
            if not isinstance(getattr(self, name), bool):
                raise CheckpointError(f"head {name} must be true or false, got {getattr(self, name)!r}")
        if self.activation is not None and self.activation not in ACTIVATIONS:
            raise CheckpointError(f"head activation must be one of {', '.join(ACTIVATIONS)} (or null), got {self.activation!r}")
        if self.kind == "probe" and self.context:
            raise CheckpointError("a probe head (one Linear(D, K)) cannot read the user context; use kind linear")
        if self.kind in ATTENTION_KINDS and self.d_model % self.num_heads:
            raise CheckpointError(f"head d_model={self.d_model} is not divisible by num_heads={self.num_heads}")

    @classmethod
    def from_dict(cls, d: dict) -> "HeadSpec":
        """Build from the ``head`` section (or options); unknown keys and missing required keys raise
        CheckpointError naming them and the known keys (never Python's ``__init__()`` signature message).
        Values are checked by :meth:`validate`."""
        from dataclasses import MISSING, fields

        known = {f.name: f for f in fields(cls)}
        unknown = sorted(map(str, set(d) - set(known)))
        if unknown:
            raise CheckpointError(f"unknown head keys {unknown}; known: {', '.join(known)}")
        missing = [n for n, f in known.items() if f.default is MISSING and n not in d]
        if missing:
            raise CheckpointError(f"the head section lacks {', '.join(missing)}")
        return cls(**d)


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
        adapter_layout: where the adapter's tensors land (:class:`hllm.formats.adapter.AdapterLayout`),
            None without an adapter.
    """

    root: Path
    backbone_path: Path
    adapter_path: Path | None
    head: HeadSpec
    prompt: PromptSpec
    dims: BackboneDims
    extra: dict = field(default_factory=dict)
    adapter_layout: AdapterLayout | None = None

    @property
    def head_path(self) -> Path:
        return self.root / self.head.file

    @property
    def tokenizer_path(self) -> Path:
        return self.backbone_path / "tokenizer.json"

    @property
    def num_positions(self) -> int:
        return self.head.num_positions


def _backbone_path(root: Path, section: dict, where: Path) -> Path:
    """``backbone.path``: absolute, or relative to the checkpoint; may point outside it (module doc)."""
    p = section.get("path")
    if not isinstance(p, str) or not p.strip():
        raise CheckpointError(f"{where}: backbone.path must be a directory path (a non-empty string), got {p!r}")
    q = Path(p)
    return q if q.is_absolute() else (root / q).resolve()


def manifest_dict(
    backbone: str, head: HeadSpec, prompt: PromptSpec, adapter: str | None = None, extra: dict | None = None
) -> dict:
    """The JSON dict of a manifest (paths stored as given: relative to CKPT or absolute)."""
    d = {
        "format": FORMAT,
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
        CheckpointError: naming the problem (and the field) — missing directory/manifest/head file/
            backbone/tokenizer, unreadable or non-object JSON, wrong format version, a section or
            field of the wrong type, a head file or adapter outside the checkpoint, unknown head
            kind, head input_dim ≠ backbone hidden size, adapter missing, malformed or not matching
            the backbone.
    """
    root = Path(ckpt_dir).resolve()
    mpath = root / MANIFEST
    if not root.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {root}")
    if not mpath.is_file():
        raise CheckpointError(f"not an hllm checkpoint: {mpath} is missing")
    d = _read_json_object(mpath, "manifest")
    if d.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{mpath}: format_version {d.get('format_version')!r} not supported (expected 1)")
    for key in ("backbone", "head", "prompt"):
        if not isinstance(d.get(key), dict):
            raise CheckpointError(f"{mpath}: section {key!r} is missing or not an object")
    backbone = _backbone_path(root, d["backbone"], mpath)
    config = read_config(backbone)
    dims = backbone_dims(config)
    if not (backbone / "tokenizer.json").is_file():
        raise CheckpointError(f"backbone {backbone} has no tokenizer.json")
    check_tokenizer(backbone / "tokenizer.json", dims.vocab_size, where=f"backbone {backbone}", error=CheckpointError)
    head = _head_spec(d["head"], root, mpath)
    if head.input_dim != dims.hidden_size:
        raise CheckpointError(
            f"head input_dim={head.input_dim} but backbone hidden_size={dims.hidden_size} ({backbone})"
        )
    try:
        prompt = PromptSpec.from_dict(d["prompt"])
    except TypeError as e:  # PromptSpec(**d) with a key it does not take cannot happen; be safe
        raise CheckpointError(f"{mpath}: bad prompt section: {e}") from None
    except CheckpointError as e:
        raise CheckpointError(f"{mpath}: {e}") from None
    adapter, layout = None, None
    section = d.get("adapter")
    if section is not None:
        if not isinstance(section, dict):
            raise CheckpointError(f"{mpath}: adapter must be an object {{\"path\": ...}} or null, got {type(section).__name__}")
        adapter = contained_path(root, section.get("path"), f"{mpath}: adapter.path", CheckpointError)
        if not adapter.is_dir():
            raise CheckpointError(f"{mpath}: adapter.path {section.get('path')!r} is not a directory")
        layout = read_adapter(adapter, dims)
    known = {"format", "format_version", "backbone", "adapter", "head", "prompt"}
    extra = {k: v for k, v in d.items() if k not in known}
    return Manifest(root, backbone, adapter, head, prompt, dims, extra, layout)


def _read_json_object(path: Path, what: str) -> dict:
    """A JSON object from ``path``; CheckpointError for unreadable, non-UTF-8, malformed, too deeply
    nested or non-object content."""
    d = read_json(path, CheckpointError, f"{{path}}: the {what} is not readable JSON: {{reason}}")
    if not isinstance(d, dict):
        raise CheckpointError(f"{path}: the {what} must be a JSON object, got {type(d).__name__}")
    return d


def _head_spec(section: dict, root: Path, mpath: Path) -> HeadSpec:
    """The validated head section; ``file`` is checked to lie inside ``root`` and stored normalised
    (relative to ``root``), so writers that copy it (``hllm merge``) stay inside their output."""
    try:
        head = HeadSpec.from_dict(section)
        head.validate()
    except CheckpointError as e:
        raise CheckpointError(f"{mpath}: {e}") from None
    path = contained_path(root, head.file, f"{mpath}: head.file", CheckpointError)
    if not path.is_file():
        raise CheckpointError(f"head weights not found: {path}")
    return replace(head, file=path.relative_to(root).as_posix())
