"""`hllm init --seed` fixes every initial weight — the head (one that reads the user context too) and the
adapter's A matrices, which peft draws from the process-wide torch generator — whatever ran before in the
process; the global generator is left as it was."""

from __future__ import annotations

import pytest
import torch
from safetensors.numpy import load_file

from hllm.checkpoint.init import init_checkpoint
from tests.conftest import TINY_HEAD


def _weights(path):
    """{file/tensor name: array} of the head and the adapter of a checkpoint directory."""
    out = {f"head/{k}": v for k, v in load_file(str(next(path.glob("head*.safetensors")))).items()}
    out.update({f"adapter/{k}": v for k, v in load_file(str(path / "adapter" / "adapter_model.safetensors")).items()})
    return out


@pytest.mark.parametrize("context", [False, True], ids=["plain-head", "context-head"])
def test_same_seed_same_weights_whatever_the_global_generator(qwen3_backbone, tmp_path, context):
    head = {**TINY_HEAD, "context": context}
    torch.manual_seed(123)
    a = init_checkpoint(qwen3_backbone, tmp_path / "a", "self_attention", 8, seed=4, lora_rank=4, head_kwargs=head)
    torch.rand(1000)  # the process's generator moves on, as other work in the process would move it
    state = torch.random.get_rng_state()
    b = init_checkpoint(qwen3_backbone, tmp_path / "b", "self_attention", 8, seed=4, lora_rank=4, head_kwargs=head)
    assert torch.equal(torch.random.get_rng_state(), state)  # init does not consume the caller's generator
    wa, wb = _weights(a), _weights(b)
    assert sorted(wa) == sorted(wb) and any("lora_A" in k for k in wa)
    assert any("context" in k for k in wa) == context  # the context head's own parameters are among them
    for k in wa:
        assert (wa[k] == wb[k]).all(), k
    c = init_checkpoint(qwen3_backbone, tmp_path / "c", "self_attention", 8, seed=5, lora_rank=4, head_kwargs=head)
    wc = _weights(c)
    assert all(not (wa[k] == wc[k]).all() for k in wa if "lora_A" in k)  # another seed, other A matrices
