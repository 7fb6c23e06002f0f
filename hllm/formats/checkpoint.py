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

from hllm.formats.architectures import BackboneDims, backbone_dims, read_config
from hllm.errors import CheckpointError
from hllm.files import atomic_write_json
from hllm.reading import contained_path, read_json
from hllm.formats.prompt import PromptSpec
from hllm.formats.tokenizer import check_tokenizer

MANIFEST = "hllm.json"
FORMAT = "hllm-checkpoint"
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
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise CheckpointError(f"head {name} must be a positive integer, got {v!r}")
        if not isinstance(self.file, str) or not self.file.strip():
            raise CheckpointError(f"head file must be a file name, got {self.file!r}")
        if not isinstance(self.context, bool):
            raise CheckpointError(f"head context must be true or false, got {self.context!r}")
        if self.d_model % self.num_heads:
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
    adapter = None
    section = d.get("adapter")
    if section is not None:
        if not isinstance(section, dict):
            raise CheckpointError(f"{mpath}: adapter must be an object {{\"path\": ...}} or null, got {type(section).__name__}")
        adapter = contained_path(root, section.get("path"), f"{mpath}: adapter.path", CheckpointError)
        if not adapter.is_dir():
            raise CheckpointError(f"{mpath}: adapter.path {section.get('path')!r} is not a directory")
        check_adapter(adapter, dims)
    known = {"format", "format_version", "backbone", "adapter", "head", "prompt"}
    extra = {k: v for k, v in d.items() if k not in known}
    return Manifest(root, backbone, adapter, head, prompt, dims, extra)


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


def check_adapter(adapter_dir: Path, dims: BackboneDims) -> None:
    """Check a PEFT LoRA adapter fits the backbone: its ``adapter_config.json`` is a LoRA config whose
    ``target_modules`` exist in the backbone (:func:`lora_module_names`), and every
    ``lora_A [r, in]`` / ``lora_B [out, r]`` matches the in/out features of the linear layer it targets.

    Raises: CheckpointError naming the field or the first mismatching tensor (adapter trained on
        another base), or a corrupt config / weights file.
    """
    cfg = adapter_dir / "adapter_config.json"
    weights = adapter_dir / "adapter_model.safetensors"
    for p in (cfg, weights):
        if not p.is_file():
            raise CheckpointError(f"adapter file not found: {p}")
    _check_adapter_config(_read_json_object(cfg, "adapter config"), cfg, dims)
    from safetensors import safe_open

    shapes = dims.linear_shapes()
    try:
        with safe_open(str(weights), framework="numpy") as f:
            tensors = {name: f.get_slice(name).get_shape() for name in f.keys()}
    except Exception as e:  # safetensors raises SafetensorError (not exported everywhere) on bad headers
        raise CheckpointError(f"adapter weights {weights} are not a readable safetensors file: {e}") from None
    for name, shape in tensors.items():
        proj = next((p for p in shapes if f".{p}." in name), None)
        if proj is None or "lora_" not in name:
            continue
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


def lora_module_names(dims: BackboneDims) -> list[str]:
    """Names of the LoRA-targetable linear modules of a supported backbone, as peft sees them on the
    base model (``model.layers.N.self_attn.q_proj`` / ``model.layers.N.mlp.up_proj``; Qwen3, Qwen2 and
    Llama share this layout)."""
    names = []
    for i in range(dims.num_layers):
        for proj in dims.linear_shapes():
            block = "self_attn" if proj in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            names.append(f"model.layers.{i}.{block}.{proj}")
    return names


def _check_adapter_config(cfg: dict, where: Path, dims: BackboneDims) -> None:
    """peft's LoRA config: ``peft_type`` LORA, ``r`` a positive integer, ``target_modules`` a list of
    module names (matched as peft does: equal to, or a ``.``-suffix of, a module name) or a regular
    expression (``re.fullmatch``), matching at least one module of the backbone each."""
    import re

    kind = cfg.get("peft_type", "LORA")
    if kind != "LORA":
        raise CheckpointError(f"{where}: peft_type {kind!r} is not supported (hllm reads LoRA adapters)")
    r = cfg.get("r")
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise CheckpointError(f"{where}: r must be a positive integer, got {r!r}")
    targets = cfg.get("target_modules")
    names = lora_module_names(dims)
    short = sorted(dims.linear_shapes())
    if isinstance(targets, str):
        try:
            pattern = re.compile(targets)
        except re.error as e:
            raise CheckpointError(f"{where}: target_modules {targets!r} is not a valid regular expression ({e})") from None
        if not any(pattern.fullmatch(n) or pattern.fullmatch(n.removeprefix("model.")) for n in names):
            raise CheckpointError(f"{where}: target_modules {targets!r} matches no module of the backbone "
                                  f"(its linear modules: {', '.join(short)})")
        return
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) and t for t in targets):
        raise CheckpointError(f"{where}: target_modules must be a non-empty list of module names or a regular "
                              f"expression, got {targets!r}")
    for t in targets:
        if not any(n == t or n.endswith("." + t) for n in names):
            raise CheckpointError(f"{where}: target_modules names {t!r}, which the backbone does not have "
                                  f"(its linear modules: {', '.join(short)})")


def _layer_index(name: str) -> int | None:
    parts = name.split(".")
    for a, b in zip(parts, parts[1:]):
        if a == "layers" and b.isdigit():
            return int(b)
    return None
