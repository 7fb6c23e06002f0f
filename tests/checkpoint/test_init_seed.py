"""`hllm init --seed` fixes every initial weight, the adapter's A matrices included (peft draws them from
the process-wide torch generator), whatever ran before in the process; the global generator is left as it was."""

from __future__ import annotations

import torch
from safetensors.numpy import load_file

from hllm.checkpoint.init import init_checkpoint
from tests.conftest import TINY_HEAD


def _adapter(path):
    return load_file(str(path / "adapter" / "adapter_model.safetensors"))


def test_same_seed_same_adapter_whatever_the_global_generator(qwen3_backbone, tmp_path):
    torch.manual_seed(123)
    a = init_checkpoint(qwen3_backbone, tmp_path / "a", "self_attention", 8, seed=4, lora_rank=4, head_kwargs=TINY_HEAD)
    torch.rand(1000)  # the process's generator moves on, as other work in the process would move it
    state = torch.random.get_rng_state()
    b = init_checkpoint(qwen3_backbone, tmp_path / "b", "self_attention", 8, seed=4, lora_rank=4, head_kwargs=TINY_HEAD)
    assert torch.equal(torch.random.get_rng_state(), state)  # init does not consume the caller's generator
    wa, wb = _adapter(a), _adapter(b)
    assert sorted(wa) == sorted(wb) and any("lora_A" in k for k in wa)
    for k in wa:
        assert (wa[k] == wb[k]).all(), k
    c = init_checkpoint(qwen3_backbone, tmp_path / "c", "self_attention", 8, seed=5, lora_rank=4, head_kwargs=TINY_HEAD)
    wc = _adapter(c)
    assert all(not (wa[k] == wc[k]).all() for k in wa if "lora_A" in k)  # another seed, other A matrices
