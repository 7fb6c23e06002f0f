"""Attach a peft LoRA adapter to the bare decoder and prove that every tensor of the file landed.

peft's own ``PeftModel.from_pretrained`` builds the class the config's ``task_type`` names
(``CAUSAL_LM`` → ``PeftModelForCausalLM``, which needs ``prepare_inputs_for_generation``: a bare
``Qwen3Model`` has none) and, when the saved module names do not match the model (an adapter saved
from a ``*ForCausalLM`` loaded onto its bare decoder), only *warns* about the unexpected keys and leaves
the modules as initialised: lora_B = 0, so the adapter silently changes nothing. Here:

1. the layout of the file decides the names (:func:`hllm.formats.adapter.read_adapter`): a ``*ForCausalLM``
   save is attached to the decoder wrapped in :class:`CausalLMNames`, so peft sees the very module names
   the team trained with (their ``target_modules``, ``rank_pattern`` and ``layers_to_transform`` too);
2. the generic ``peft.PeftModel`` is built whatever the ``task_type`` (hLLM reads hidden states);
3. the weights are loaded with ``peft.set_peft_model_state_dict`` and read back with
   ``peft.get_peft_model_state_dict``: the two key sets must be equal and every tensor bit-identical.
   A tensor of the file that reached no module, or a LoRA module that got no tensor, is an error.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from hllm.errors import CheckpointError
from hllm.formats.adapter import AdapterLayout


class CausalLMNames(nn.Module):
    """The bare decoder under the attribute ``model``, so its modules are named as in a ``*ForCausalLM``
    (``model.layers.3.self_attn.q_proj``). ``forward`` is the decoder's; ``config`` is the decoder's.

    Args: decoder: a Hugging Face base decoder (``Qwen3Model``, ``Qwen2Model``, ``LlamaModel``).
    """

    def __init__(self, decoder: nn.Module):
        super().__init__()
        self.model = decoder

    @property
    def config(self):
        return self.model.config

    def get_input_embeddings(self):
        """The decoder's ``embed_tokens`` (peft reads it to save or load an embedding target)."""
        return self.model.get_input_embeddings()

    def get_output_embeddings(self):
        """None: the decoder has no LM head (hLLM reads hidden states)."""
        return None

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)


def unwrap(module: nn.Module) -> nn.Module:
    """The bare decoder inside ``module``: unwraps peft (``get_base_model``) and :class:`CausalLMNames`."""
    if hasattr(module, "get_base_model"):
        module = module.get_base_model()
    return module.model if isinstance(module, CausalLMNames) else module


def attach_adapter(decoder: nn.Module, adapter_dir: str | Path, layout: AdapterLayout) -> nn.Module:
    """Wrap ``decoder`` in a ``peft.PeftModel`` carrying the adapter of ``adapter_dir``, proven applied.

    Args:
        decoder: the bare decoder (:func:`hllm.model.hllm.load_backbone`), any float dtype.
        adapter_dir: a peft adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``).
        layout: its layout, from :func:`hllm.formats.adapter.read_adapter` (the manifest's ``adapter_layout``).
    Returns: the ``PeftModel`` (eval mode; ``forward(input_ids=…)`` is the decoder's forward with LoRA).
    Raises: CheckpointError naming the keys when a tensor of the file did not land on a module, a LoRA
        module got no tensor from the file, a tensor was changed on the way (shape or value), or peft
        cannot build the adapter (its message).
    """
    from peft import PeftConfig, PeftModel
    from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    adapter_dir = Path(adapter_dir)
    try:
        config = PeftConfig.from_pretrained(str(adapter_dir))
        config.inference_mode = True
        config.task_type = None  # the generic PeftModel: hLLM runs the decoder, never generate()
        model = PeftModel(CausalLMNames(decoder) if layout.causal_lm else decoder, config)
        state = load_file(str(adapter_dir / "adapter_model.safetensors"))
        set_peft_model_state_dict(model, state)
    except (ValueError, TypeError, KeyError, RuntimeError, OSError) as e:
        raise CheckpointError(f"cannot attach the adapter {adapter_dir}: {type(e).__name__}: {e}") from None
    landed = get_peft_model_state_dict(model, save_embedding_layers=any(".base_layer." in k for k in state))
    missing = sorted(set(state) - set(landed))
    unfed = sorted(set(landed) - set(state))
    changed = sorted(k for k in set(state) & set(landed)
                     if landed[k].shape != state[k].shape or not torch.equal(landed[k], state[k].to(landed[k].dtype)))
    for keys, what in ((missing, "landed on no module"), (unfed, "are LoRA parameters the file does not hold "
                                                                  "(they would keep peft's initial values)"),
                       (changed, "were not loaded as saved")):
        if keys:
            more = f" (and {len(keys) - 5} more)" if len(keys) > 5 else ""
            raise CheckpointError(f"adapter {adapter_dir}: {len(keys)} tensor(s) {what}: {', '.join(keys[:5])}{more}")
    return model.eval()


def lora_b_norm(model: nn.Module) -> float:
    """Largest |value| over every ``lora_B`` / ``lora_embedding_B`` parameter of a peft model (0.0 when none):
    0 means the adapter is peft's initial state and changes nothing."""
    norms = [p.detach().abs().max().item() for n, p in model.named_parameters()
             if ("lora_B" in n or "lora_embedding_B" in n) and p.numel()]
    return max(norms, default=0.0)
