"""An adapter cannot be dropped or partly applied silently: every tensor of the file must land on a module
of the decoder (checked from the file on every manifest read: rank, parity, merge, export, info, serve,
calibrate) and is read back bit-identical after peft loads it (every PyTorch load)."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file, save_file

from hllm.errors import CheckpointError
from hllm.formats.checkpoint import load_manifest
from tests.cli.conftest import run


def _edit(ck, fn):
    f = ck / "adapter" / "adapter_model.safetensors"
    state = load_file(str(f))
    save_file({k: v.contiguous() for k, v in fn(state).items()}, str(f))


def test_own_layout_reads_as_base(ckpt):
    layout = load_manifest(ckpt).adapter_layout
    assert not layout.causal_lm and "layers.0.self_attn.q_proj" in layout.modules and len(layout.modules) == 14


def test_causal_lm_level_is_recognised(ckpt):
    _edit(ckpt, lambda s: {k.replace("base_model.model.", "base_model.model.model."): v for k, v in s.items()})
    assert load_manifest(ckpt).adapter_layout.causal_lm


@pytest.mark.parametrize("edit,words", [
    (lambda s: {**s, "base_model.model.lm_head.lora_A.weight": next(iter(s.values())).clone()}, ["lm_head", "no module"]),
    (lambda s: {k.replace("lora_A.weight", "lora_A.default.weight"): v for k, v in s.items()},
     ["lora_A.default.weight", "not LoRA tensors"]),
    (lambda s: {k.replace("layers.1.", "layers.7."): v for k, v in s.items()}, ["layers.7", "no module"]),
    (lambda s: {(k.replace("base_model.model.", "base_model.model.model.") if ".layers.0." in k else k): v
                for k, v in s.items()}, ["model.layers.0", "no module"]),  # two layouts mixed
    (lambda s: {"base_model.model.layers.0.mlp.up_proj.lora_A.weight":
                s["base_model.model.layers.0.mlp.up_proj.lora_A.weight"][:, :5], **{k: v for k, v in s.items()
                if "layers.0.mlp.up_proj.lora_A" not in k}}, ["up_proj", "in_features"]),
])
def test_keys_that_land_nowhere_are_refused_everywhere(ckpt, edit, words, capsys):
    _edit(ckpt, edit)
    with pytest.raises(CheckpointError) as e:
        load_manifest(ckpt)
    assert all(w in str(e.value) for w in words), str(e.value)
    code, _, err = run(["info", str(ckpt)], capsys)  # info makes the same check as rank
    assert code == 2 and words[0] in err


def test_a_module_without_its_tensors_is_refused_on_load(ckpt):
    """lora_B of one module missing: peft would keep its initial zeros (that module silently unchanged)."""
    from hllm.model.hllm import load_model

    _edit(ckpt, lambda s: {k: v for k, v in s.items() if "layers.1.mlp.down_proj.lora_B" not in k})
    with pytest.raises(CheckpointError, match="the file does not hold.*layers.1.mlp.down_proj.lora_B"):
        load_model(ckpt)


def test_merge_reports_what_the_adapter_changes(ckpt, tmp_path):
    from hllm.checkpoint.merge import merge_checkpoint
    from hllm.testing import tiny_slates

    rep = merge_checkpoint(ckpt, tmp_path / "m", tiny_slates(2, (2, 8)))
    assert rep.adapter_effect > 1e-4 and rep.lora_b_max > 0 and rep.max_abs_diff <= 1e-4
