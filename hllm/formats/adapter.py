"""A peft LoRA adapter directory, read without torch: which module of the backbone each tensor lands on.

peft saves an adapter's tensors under the module names of the model it was *trained on*
(``peft.utils.save_and_load.get_peft_model_state_dict``; the adapter name removed)::

    base_model.model.<module>.lora_A.weight      [r, in_features]
    base_model.model.<module>.lora_B.weight      [out_features, r]     (+ lora_B.bias with lora_bias)
    base_model.model.<module>.lora_embedding_A   [r, vocab]            (an embedding target)
    base_model.model.<module>.lora_embedding_B   [hidden, r]
    base_model.model.<module>.lora_magnitude_vector[.weight]  [out_features]   (DoRA)
    base_model.model.<embed_tokens>.base_layer.weight  [vocab, hidden]  (an embedding target: peft's
                                                   ``save_embedding_layers="auto"`` saves the whole embedding)

``<module>`` depends on the class the team wrapped: ``layers.3.self_attn.q_proj`` for a bare decoder
(``AutoModel``, peft ``FEATURE_EXTRACTION`` or no task type; what hllm's own ``init`` and ``train`` write)
and ``model.layers.3.self_attn.q_proj`` for a ``*ForCausalLM`` (``CAUSAL_LM`` — the usual save), whatever
the ``task_type`` in ``adapter_config.json`` says. hllm runs the bare decoder, so the layout decides where
the adapter is attached (:func:`read_adapter`); a tensor that lands on no module of the decoder is an
error, never a warning: peft itself only warns about such keys and leaves the module unchanged, which
is how an adapter can be dropped silently.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from hllm.errors import CheckpointError
from hllm.formats.architectures import BackboneDims
from hllm.reading import read_json

PEFT_PREFIX = "base_model.model."
#: The module-name level a ``*ForCausalLM`` puts above the decoder (``model.layers…``).
CAUSAL_LM_LEVEL = "model."
#: The kinds of LoRA tensor peft saves, with the parameter names that may follow them.
LORA_KINDS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector", "base_layer")
_KEY = re.compile(r"^(?P<module>.+?)\.(?P<kind>" + "|".join(LORA_KINDS) + r")(?:\.(?P<param>weight|bias))?$")


@dataclass(frozen=True)
class AdapterLayout:
    """Where an adapter's tensors land on the bare decoder.

    Attributes:
        causal_lm: the tensors were saved from a ``*ForCausalLM`` (module names carry ``model.``); the
            decoder is then wrapped so peft sees those names (:func:`hllm.model.adapter.attach_adapter`).
        modules: decoder module names (``layers.3.self_attn.q_proj``, ``embed_tokens``) the adapter changes.
        tensors: ``{key in the file: shape}`` of every tensor.
        config: ``adapter_config.json`` as read.
    """

    causal_lm: bool
    modules: tuple[str, ...]
    tensors: dict[str, tuple[int, ...]]
    config: dict


def decoder_modules(dims: BackboneDims) -> dict[str, tuple[int, int]]:
    """``{module name on the bare decoder: (in, out)}`` of every module an adapter may change: each
    layer's linear projections and ``embed_tokens`` (``(vocab, hidden)``)."""
    out = {"embed_tokens": (dims.vocab_size, dims.hidden_size)}
    for i in range(dims.num_layers):
        for proj, shape in dims.linear_shapes().items():
            block = "self_attn" if proj in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            out[f"layers.{i}.{block}.{proj}"] = shape
    return out


def read_adapter(adapter_dir: Path, dims: BackboneDims) -> AdapterLayout:
    """Read and check a LoRA adapter directory against a backbone (no weights loaded).

    Checks: ``adapter_config.json`` is a LoRA config whose ``target_modules`` exist in the backbone;
    ``adapter_model.safetensors`` is readable; every tensor is a LoRA tensor of a decoder module, all in
    one layout; ``lora_A [r, in]`` / ``lora_B [out, r]`` (and the embedding forms) fit that module.

    Raises: CheckpointError naming the file and the problem: the keys that land on no decoder module
        (at most 5 named, with the count), a mix of layouts, a shape that does not fit (adapter trained
        on another base), a missing or corrupt file.
    """
    cfg_path = adapter_dir / "adapter_config.json"
    weights = adapter_dir / "adapter_model.safetensors"
    if not weights.is_file() and (adapter_dir / "adapter_model.bin").is_file():
        raise CheckpointError(f"{adapter_dir}: adapter_model.bin is a pickle and is never loaded; save the adapter "
                              "with safetensors (peft save_pretrained writes adapter_model.safetensors)")
    for p in (cfg_path, weights):
        if not p.is_file():
            raise CheckpointError(f"adapter file not found: {p}")
    config = read_json(cfg_path, CheckpointError, "{path}: the adapter config is not readable JSON: {reason}")
    if not isinstance(config, dict):
        raise CheckpointError(f"{cfg_path}: the adapter config must be a JSON object, got {type(config).__name__}")
    _check_config(config, cfg_path, dims)
    tensors = _tensor_shapes(weights)
    if not tensors:
        raise CheckpointError(f"{weights} holds no tensor: an empty adapter")
    modules = decoder_modules(dims)
    parsed, left = {}, []
    for key in tensors:
        m = _KEY.match(key.removeprefix(PEFT_PREFIX)) if key.startswith(PEFT_PREFIX) else None
        if m is None:
            left.append(key)
        else:
            parsed[key] = (m["module"], m["kind"], m["param"] or "weight")
    if left:
        raise CheckpointError(_leftover(weights, left, "are not LoRA tensors of a peft save (base_model.model.<module>."
                                                       "lora_A/lora_B...); hLLM would ignore them"))
    causal = all(mod.startswith(CAUSAL_LM_LEVEL) and mod.removeprefix(CAUSAL_LM_LEVEL) in modules
                 for mod, _, _ in parsed.values())
    names = {k: (mod.removeprefix(CAUSAL_LM_LEVEL) if causal else mod) for k, (mod, _, _) in parsed.items()}
    left = sorted(k for k, n in names.items() if n not in modules)
    if left:
        raise CheckpointError(_leftover(weights, left, "land on no module of the backbone's decoder (its layers' linear "
                                                       "projections and embed_tokens; hLLM reads hidden states, so an "
                                                       "lm_head or a task head is not part of it)"))
    for key, (mod, kind, param) in parsed.items():
        _check_shape(key, kind, param, tensors[key], modules[names[key]], names[key])
    return AdapterLayout(causal, tuple(sorted(set(names.values()))), tensors, config)


def _leftover(weights: Path, keys: list[str], why: str) -> str:
    more = f" (and {len(keys) - 5} more)" if len(keys) > 5 else ""
    return f"adapter {weights}: {len(keys)} tensor(s) {why}: {', '.join(keys[:5])}{more}"


def _tensor_shapes(weights: Path) -> dict[str, tuple[int, ...]]:
    """``{key: shape}`` from a safetensors header (the header alone is read; it is bounded by the format)."""
    from safetensors import safe_open

    try:
        with safe_open(str(weights), framework="numpy") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except Exception as e:  # safetensors raises SafetensorError (not exported everywhere) on bad headers
        raise CheckpointError(f"adapter weights {weights} are not a readable safetensors file: {e}") from None


def _check_shape(key: str, kind: str, param: str, shape: tuple[int, ...], io: tuple[int, int], module: str) -> None:
    fin, fout = io
    if kind == "base_layer":  # only an embedding's own weights travel with an adapter (save_embedding_layers)
        if not module.endswith("embed_tokens") or param != "weight" or tuple(shape) != (fin, fout):
            raise CheckpointError(f"adapter tensor {key}: peft saves a base layer's weights only for an embedding "
                                  f"target ([vocab {fin}, hidden {fout}]), got {list(shape)} for {module}")
        return
    want = {("lora_A", "weight"): (1, fin, "in_features"), ("lora_B", "weight"): (0, fout, "out_features"),
            ("lora_B", "bias"): (0, fout, "out_features"), ("lora_embedding_A", "weight"): (1, fin, "vocabulary"),
            ("lora_embedding_B", "weight"): (0, fout, "hidden size"),
            ("lora_magnitude_vector", "weight"): (0, fout, "out_features")}.get((kind, param))
    if want is None:
        raise CheckpointError(f"adapter tensor {key}: a {kind}.{param} is not a LoRA parameter peft saves")
    axis, size, what = want
    if len(shape) <= axis or shape[axis] != size:
        raise CheckpointError(f"adapter does not match the backbone: {key} has shape {list(shape)}, but {module} "
                              f"has {what} {size} (adapter trained on another base?)")


def _check_config(cfg: dict, where: Path, dims: BackboneDims) -> None:
    """peft's LoRA config: ``peft_type`` LORA, ``r`` a positive integer, ``target_modules`` a list of
    module names (matched as peft does: equal to, or a ``.``-suffix of, a module name) or a regular
    expression (``re.fullmatch``), matching at least one module of the backbone each, in either layout."""
    kind = cfg.get("peft_type", "LORA")
    if kind != "LORA":
        raise CheckpointError(f"{where}: peft_type {kind!r} is not supported (hllm reads LoRA adapters)")
    r = cfg.get("r")
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise CheckpointError(f"{where}: r must be a positive integer, got {r!r}")
    targets = cfg.get("target_modules")
    names = list(decoder_modules(dims))
    names += [CAUSAL_LM_LEVEL + n for n in names]
    short = sorted(dims.linear_shapes())
    if isinstance(targets, str):
        try:
            pattern = re.compile(targets)
        except re.error as e:
            raise CheckpointError(f"{where}: target_modules {targets!r} is not a valid regular expression ({e})") from None
        if not any(pattern.fullmatch(n) for n in names):
            raise CheckpointError(f"{where}: target_modules {targets!r} matches no module of the backbone "
                                  f"(its linear modules: {', '.join(short)})")
        return
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) and t for t in targets):
        raise CheckpointError(f"{where}: target_modules must be a non-empty list of module names or a regular "
                              f"expression, got {json.dumps(targets)[:200]}")
    for t in targets:
        if not any(n == t or n.endswith("." + t) for n in names):
            raise CheckpointError(f"{where}: target_modules names {t!r}, which the backbone does not have "
                                  f"(its linear modules: {', '.join(short)})")
