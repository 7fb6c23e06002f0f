"""``hllm import``: an hllm checkpoint from what another team's training code leaves behind.

Inputs, each as the usual tools save it:

* a Hugging Face backbone directory (Qwen3, Qwen2, Llama: ``save_pretrained`` of the ``*ForCausalLM`` or
  the bare model, safetensors, ``tokenizer.json``) — referred to by path, never copied or written;
* optionally a peft LoRA adapter directory as peft saves it from any model class (``CAUSAL_LM``,
  ``FEATURE_EXTRACTION``, no task type; module names with or without the ``model.`` level) — copied;
* the head's ``state_dict`` (``.safetensors``, or ``.pt`` / ``.pth`` / ``.bin`` read with
  ``torch.load(weights_only=True)``), in the team's own key names, mapped to hllm's
  (docs/formats.md, "Scoring heads") by ``--head-prefix`` and ``--head-map theirs=ours`` rules; the
  sub-module names of ``torch.nn.TransformerEncoderLayer`` / ``nn.MultiheadAttention`` (``self_attn``,
  fused ``in_proj_weight``, ``out_proj``, ``linear1``, ``linear2``) are understood as they are;
* the prompt: a JSON or YAML object of :class:`hllm.formats.prompt.PromptSpec` fields.

The geometry of the head (d_model, ff_dim, num_layers, K, a final norm, a user-context projection) is
read from the tensors' shapes; what shapes cannot tell (``num_heads``, the activation, pre/post norm) is
given. Every tensor must be used and every parameter filled, else :class:`CheckpointError` lists the
keys left over and the names hllm expected. The checkpoint is proven before it is written: the head
loads strictly and the adapter lands whole (:func:`hllm.model.adapter.attach_adapter`).
"""

from __future__ import annotations

import math
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from hllm.errors import CheckpointError
from hllm.files import atomic_dir
from hllm.formats.architectures import backbone_dims, read_config
from hllm.formats.checkpoint import ATTENTION_KINDS, HeadSpec, load_manifest, manifest_dict, write_manifest
from hllm.formats.prompt import PromptSpec
from hllm.reading import read_json

#: Sub-module renames applied after the user's rules: PyTorch's encoder layer / attention names → hllm's.
SUBMODULE_ALIASES = ((".self_attn.", ".attn."), (".attn.out_proj.", ".attn.o."), (".attn.q_proj.", ".attn.q."),
                     (".attn.k_proj.", ".attn.k."), (".attn.v_proj.", ".attn.v."), (".linear1.", ".ff1."),
                     (".linear2.", ".ff2."))
#: Most tensors a head file may hold (a head has tens; a whole model's state dict is refused by name).
MAX_HEAD_TENSORS = 100_000
#: Largest prompt file (bytes): a prompt's fields are a few templates and numbers.
MAX_PROMPT_BYTES = 1 << 20
#: Most bytes the kept head tensors may take (a head is tens of MB; a whole model's state dict is cut by prefix).
MAX_HEAD_BYTES = 1 << 30


@dataclass(frozen=True)
class ImportReport:
    """What ``hllm import`` wrote: the checkpoint directory, the head spec it inferred, the adapter's
    layout (``causal_lm`` / ``base`` / None) and the count of LoRA modules it changes."""

    out_dir: str
    head: dict
    adapter_layout: str | None
    adapter_modules: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def read_state(path: str | os.PathLike, prefix: str = "") -> dict[str, torch.Tensor]:
    """The tensors of a head file, keys kept as saved. ``.safetensors`` is read with safetensors' ``safe_open``
    (only the tensors kept are read); other files with ``torch.load(weights_only=True)`` (no pickled code
    runs), memory-mapped when the file is in torch's zip format; a dict holding its state under
    ``state_dict`` or ``model`` is unwrapped. With ``prefix`` only the keys starting with it are kept,
    the prefix cut (a whole model's state dict, ``--head-prefix head.``). Memory is bounded by
    :data:`MAX_HEAD_BYTES` of kept tensors, whatever the file holds besides.

    Raises: CheckpointError: unreadable file, pickled objects (a whole ``nn.Module``), not a dict of tensors,
        no key with the prefix, more than :data:`MAX_HEAD_TENSORS` tensors or :data:`MAX_HEAD_BYTES` kept.
    """
    import pickle
    import zipfile

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"head weights not found: {path}")
    try:
        if path.suffix == ".safetensors":
            state = _read_safetensors(path, prefix)
        else:
            zipped = zipfile.is_zipfile(path)
            if not zipped and path.stat().st_size > MAX_HEAD_BYTES:
                raise CheckpointError(f"{path} is {path.stat().st_size} bytes in torch's legacy (non-zip) format, over "
                                      f"the {MAX_HEAD_BYTES >> 20} MiB a head may have (save the head's state dict alone)")
            state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=zipped)
    except CheckpointError:
        raise
    except pickle.UnpicklingError:
        raise CheckpointError(f"{path} holds pickled Python objects, not only tensors (a whole nn.Module, or a class of "
                              "your code); hllm never unpickles code: save module.state_dict() instead") from None
    except Exception as e:  # safetensors' SafetensorError, zipfile errors, EOFError of an empty file, ...
        raise CheckpointError(f"cannot read head weights {path} (a safetensors file or a torch.save'd state "
                              f"dict of tensors): {type(e).__name__}: {str(e)[:300]}") from None
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise CheckpointError(f"{path} is not a state dict (a mapping of names to tensors)")
    if len(state) > MAX_HEAD_TENSORS:
        raise CheckpointError(f"{path} holds {len(state)} tensors; a head has far fewer (give --head-prefix)")
    if prefix:
        state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        if not state:
            raise CheckpointError(f"{path}: no tensor name starts with the head prefix {prefix!r}")
    _check_bytes(path, {k: v.numel() * v.element_size() for k, v in state.items()})
    return state


def _check_bytes(path: Path, sizes: dict[str, int]) -> None:
    """Refuse head tensors over :data:`MAX_HEAD_BYTES` in all (``sizes``: bytes per key), naming the largest."""
    total = sum(sizes.values())
    if total > MAX_HEAD_BYTES:
        big = max(sizes, key=sizes.get)
        raise CheckpointError(f"{path}: the head's tensors take {total} bytes (largest {big!r}: {sizes[big]}), over the "
                              f"{MAX_HEAD_BYTES >> 20} MiB a head may have (a whole model? give --head-prefix)")


def _read_safetensors(path: Path, prefix: str) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file whose names start with ``prefix`` (all with ``""``), sizes checked
    from the header before any is read."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        keys = list(f.keys())
        if len(keys) > MAX_HEAD_TENSORS:
            raise CheckpointError(f"{path} holds {len(keys)} tensors; a head has far fewer")
        keep = [k for k in keys if k.startswith(prefix)]
        sizes = {}
        for k in keep:
            sl = f.get_slice(k)
            sizes[k] = math.prod(sl.get_shape()) * _SAFETENSORS_BYTES.get(sl.get_dtype(), 8)
        _check_bytes(path, sizes)
        return {k: f.get_tensor(k) for k in keep}


#: Bytes per element of safetensors dtypes (unknown ones counted as 8).
_SAFETENSORS_BYTES = {"F64": 8, "I64": 8, "U64": 8, "C64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2,
                      "I16": 2, "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def parse_rules(rules: list[str]) -> list[tuple[str, str]]:
    """``["theirs=ours", ...]`` → ``[(theirs, ours)]``; prefixes of key names, ``ours`` may be empty.

    Raises: CheckpointError for a rule without ``=``, with an empty left side, or two rules that map the
        same ``theirs`` to different names (which one was meant is unknowable).
    """
    out: dict[str, str] = {}
    for r in rules:
        theirs, sep, ours = r.partition("=")
        if not sep or not theirs:
            raise CheckpointError(f"--head-map {r!r}: write THEIRS=OURS (key prefixes, e.g. encoder.layers.=blocks.)")
        if out.get(theirs, ours) != ours:
            raise CheckpointError(f"--head-map rules collide: {theirs}={out[theirs]} and {theirs}={ours} rename the "
                                  "same keys; give one")
        out[theirs] = ours
    return list(out.items())


def map_head_state(state: dict[str, torch.Tensor], rules: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
    """Rename a head state dict to hllm's parameter names.

    Each key takes the rule with the longest matching ``theirs`` prefix (one rule per key), then the
    :data:`SUBMODULE_ALIASES`; a fused ``attn.in_proj_weight [3d, d]`` / ``in_proj_bias [3d]`` of
    ``nn.MultiheadAttention`` is split into ``attn.q`` / ``attn.k`` / ``attn.v`` (its row order).

    Raises: CheckpointError when two keys map to one name (naming both).
    """
    out: dict[str, torch.Tensor] = {}
    origin: dict[str, str] = {}

    def put(name: str, tensor: torch.Tensor, src: str) -> None:
        if name in out:
            raise CheckpointError(f"head keys {origin[name]!r} and {src!r} both map to {name!r}")
        out[name], origin[name] = tensor, src

    for key, tensor in state.items():
        hits = [(t, o) for t, o in rules if key.startswith(t)]
        name = key
        if hits:
            t, o = max(hits, key=lambda r: len(r[0]))
            name = o + key[len(t):]
        name = "." + name
        for theirs, ours in SUBMODULE_ALIASES:
            name = name.replace(theirs, ours)
        name = name[1:]
        fused = re.fullmatch(r"(.*\.attn)\.in_proj_(weight|bias)", name)
        if fused:
            if tensor.shape[0] % 3:
                raise CheckpointError(f"head key {key!r}: a fused in_proj of {tensor.shape[0]} rows is not 3 × d_model")
            for part, chunk in zip("qkv", tensor.chunk(3, dim=0)):
                put(f"{fused[1]}.{part}.{fused[2]}", chunk.contiguous(), key)
        else:
            put(name, tensor, key)
    return out


def infer_head_spec(kind: str, state: dict[str, torch.Tensor], input_dim: int, num_heads: int | None = None,
                    **options) -> HeadSpec:
    """The :class:`HeadSpec` of a mapped head state dict: sizes from the shapes (``proj.weight [d, D]``,
    ``out.weight [K, d]`` or ``queries [K, d]``, ``blocks.N.ff1.weight [ff, d]``), ``final_norm`` from
    ``norm.weight``, ``context`` from ``context.proj.weight``; ``num_heads`` and ``options``
    (``activation``, ``norm_first``, ``num_positions`` to check K) as given.

    Raises: CheckpointError naming the tensor that is missing for ``kind``, a K that differs from
        ``num_positions``, or an attention kind without ``num_heads``.
    """
    def shape(name: str) -> tuple[int, ...]:
        if name not in state:
            have = ", ".join(sorted(state)[:12])
            raise CheckpointError(f"a {kind} head needs the tensor {name!r} (hllm's name; map yours with --head-map "
                                  f"THEIRS=OURS); the mapped head has: {have}")
        return tuple(state[name].shape)

    want_k = options.pop("num_positions", None)
    spec: dict = {"kind": kind, "input_dim": input_dim, **{k: v for k, v in options.items() if v is not None}}
    if kind == "probe":
        spec["num_positions"] = shape("out.weight")[0]
    else:
        spec["d_model"] = shape("proj.weight")[0]
        spec["num_positions"] = shape("queries" if kind == "slot_query" else "out.weight")[0]
        spec["context"] = "context.proj.weight" in state
    if kind in ATTENTION_KINDS:
        if num_heads is None:
            raise CheckpointError(f"a {kind} head needs --num-heads (the attention heads cannot be read from shapes)")
        layers = {int(m[1]) for k in state if (m := re.match(r"blocks\.(\d+)\.", k))}
        spec.update(num_heads=num_heads, num_layers=max(layers) + 1 if layers else 0,
                    ff_dim=shape("blocks.0.ff1.weight")[0], final_norm="norm.weight" in state)
    if want_k is not None and spec["num_positions"] != want_k:
        raise CheckpointError(f"--num-positions {want_k}, but the head's weights give K={spec['num_positions']}")
    head = HeadSpec.from_dict(spec)
    head.validate()
    return head


def load_prompt(path: str | os.PathLike | None) -> PromptSpec:
    """A :class:`PromptSpec` from a JSON or YAML file (``.yaml`` / ``.yml``) of its fields; None → defaults.

    Raises: CheckpointError: unreadable file, not an object, unknown fields or bad values (naming them).
    """
    if path is None:
        return PromptSpec()
    path = Path(path)
    if path.suffix in (".yaml", ".yml"):
        import yaml

        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_PROMPT_BYTES + 1)
            if len(raw) > MAX_PROMPT_BYTES:  # was cut silently, then failed as a YAML syntax error
                raise CheckpointError(f"the prompt file {path} is over {MAX_PROMPT_BYTES >> 20} MiB")
            d = yaml.safe_load(raw.decode("utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError) as e:
            raise CheckpointError(f"cannot read the prompt file {path}: {e}") from None
    else:
        d = read_json(path, CheckpointError, "cannot read the prompt file {path}: {reason}", max_bytes=MAX_PROMPT_BYTES)
    try:
        return PromptSpec.from_dict(d)
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None


def import_checkpoint(backbone: str | os.PathLike, head_file: str | os.PathLike, out_dir: str | os.PathLike,
                      kind: str, adapter: str | os.PathLike | None = None, head_map: list[str] = (),
                      head_prefix: str = "", num_heads: int | None = None, activation: str | None = None,
                      norm_first: bool = True, num_positions: int | None = None,
                      prompt: PromptSpec | None = None, overwrite: bool = False) -> ImportReport:
    """Write an hllm checkpoint to ``out_dir`` (atomic) from a team's backbone, adapter and head.

    Args: see the module doc; ``head_map``: ``theirs=ours`` prefix rules (:func:`map_head_state`).
    Returns: :class:`ImportReport`.
    Raises: CheckpointError naming the problem (unsupported backbone, unmapped or missing head keys,
        an adapter that does not fit or does not land whole); FileExistsError (``out_dir`` exists, no
        overwrite). Nothing is written unless every check passes.
    """
    from hllm.model.hllm import load_model

    backbone = Path(backbone).resolve()
    dims = backbone_dims(read_config(backbone))
    state = map_head_state(read_state(head_file, head_prefix), parse_rules(list(head_map)))
    spec = infer_head_spec(kind, state, dims.hidden_size, num_heads, activation=activation,
                           norm_first=None if kind not in ATTENTION_KINDS else norm_first, num_positions=num_positions)
    _check_head_keys(spec, state)
    prompt = prompt or PromptSpec()
    _check_prompt(prompt, backbone)
    if adapter is not None:  # checked where it is, so an error names the user's files, not the copy's
        from hllm.formats.adapter import read_adapter

        if not Path(adapter).is_dir():
            raise CheckpointError(f"adapter directory not found: {adapter}")
        read_adapter(Path(adapter), dims)
    with atomic_dir(Path(out_dir).resolve(), overwrite=overwrite) as tmp:
        from safetensors.torch import save_file

        save_file({k: v.float().contiguous() for k, v in state.items()}, str(tmp / spec.file))
        if adapter is not None:
            _copy_adapter(Path(adapter), tmp / "adapter")
        extra = {"provenance": {"created_by": "hllm import", "head_file": str(Path(head_file).resolve()),
                                "adapter": str(Path(adapter).resolve()) if adapter else None, "trained": True}}
        write_manifest(tmp, manifest_dict(str(backbone), spec, prompt, "adapter" if adapter is not None else None, extra))
        m = load_manifest(tmp)  # the static checks every command makes (adapter keys, head file, tokenizer)
        try:
            load_model(m)  # the head loads strictly and the adapter lands whole, or nothing is written
        except CheckpointError as e:  # name the user's adapter, not the copy about to be removed
            raise CheckpointError(str(e).replace(str(tmp / "adapter"), str(adapter))) from None
        layout = m.adapter_layout
    return ImportReport(str(out_dir), spec.__dict__ | {"act": spec.act},
                        None if layout is None else ("causal_lm" if layout.causal_lm else "base"),
                        0 if layout is None else len(layout.modules))


def _check_prompt(prompt: PromptSpec, backbone: Path) -> None:
    """The prompt builds with the backbone's tokenizer (a ``bos_token`` it lacks is refused now, not at
    the first ``rank``)."""
    from hllm.runtime.prompt import PromptBuilder, load_tokenizer

    try:
        PromptBuilder(load_tokenizer(backbone / "tokenizer.json"), prompt)
    except CheckpointError as e:
        raise CheckpointError(f"the prompt does not fit the backbone {backbone}: {e}") from None


def _check_head_keys(spec: HeadSpec, state: dict[str, torch.Tensor]) -> None:
    """Every tensor used, every parameter filled, every shape right — or CheckpointError listing them."""
    from hllm.model.heads import build_head

    want = build_head(spec).state_dict()
    unused, missing = sorted(set(state) - set(want)), sorted(set(want) - set(state))
    if unused or missing:
        raise CheckpointError(
            f"the head does not map onto a {spec.kind} head: "
            + (f"{len(unused)} key(s) left over (after the map): {', '.join(unused[:8])}; " if unused else "")
            + (f"{len(missing)} parameter(s) not filled: {', '.join(missing[:8])}; " if missing else "")
            + "hllm's names are in docs/formats.md (Scoring heads); map yours with --head-map THEIRS=OURS")
    bad = [f"{k} {list(state[k].shape)} (expected {list(v.shape)})" for k, v in want.items() if state[k].shape != v.shape]
    if bad:
        raise CheckpointError(f"head tensors of the wrong shape: {'; '.join(bad[:5])}")
    bad = [f"{k} ({str(v.dtype).removeprefix('torch.')})" for k, v in state.items() if not v.is_floating_point()]
    if bad:
        raise CheckpointError(f"head tensors that are not real floating point: {', '.join(bad[:5])} (a head's "
                              "parameters are float; a complex or integer tensor would be cast, losing values)")
    bad = [k for k, v in state.items() if not torch.isfinite(v).all()]
    if bad:
        raise CheckpointError(f"head tensors holding NaN or infinity: {', '.join(bad[:5])} (a diverged training run?)")


def _copy_adapter(src: Path, dst: Path) -> None:
    """Copy a peft adapter directory's two files (config + safetensors weights) into the checkpoint."""
    if not src.is_dir():
        raise CheckpointError(f"adapter directory not found: {src}")
    dst.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        if not (src / name).is_file():
            hint = " (adapter_model.bin is a pickle and is never read: save with safetensors)" \
                if (src / "adapter_model.bin").is_file() else ""
            raise CheckpointError(f"adapter file not found: {src / name}{hint}")
        shutil.copy2(src / name, dst / name)
