"""Reference model: the three head variants, three backbone families, readout and padding invariance."""

import numpy as np
import pytest
import torch

from hllm.formats.architectures import backbone_dims, read_config
from hllm.formats.checkpoint import HeadSpec
from hllm.model.heads import build_head
from hllm.model.hllm import HllmModel, gather_readout, load_backbone
from hllm.runtime.prompt import PromptBuilder, load_tokenizer
from hllm.formats.prompt import PromptSpec

KINDS = ["linear", "self_attention", "slot_query"]


@pytest.mark.parametrize("kind", KINDS)
def test_head_shapes_and_masking(kind):
    spec = HeadSpec(kind=kind, input_dim=16, num_positions=7, d_model=32, num_heads=4, ff_dim=64)
    head = build_head(spec, seed=0).eval()
    items = torch.randn(2, 5, 16)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], dtype=torch.bool)
    m = head(items, mask)
    assert m.shape == (2, 5, 7) and m.dtype == torch.float32
    assert torch.all(m[1, 2:] == 0)
    assert torch.isfinite(m).all()


@pytest.mark.parametrize("kind", ["self_attention", "slot_query"])
def test_padding_items_do_not_change_real_scores(kind):
    spec = HeadSpec(kind=kind, input_dim=16, num_positions=6, d_model=32, num_heads=4, ff_dim=64)
    head = build_head(spec, seed=1).eval()
    items = torch.randn(1, 3, 16)
    padded = torch.cat([items, torch.randn(1, 2, 16) * 100], dim=1)
    a = head(items, torch.ones(1, 3, dtype=torch.bool))
    b = head(padded, torch.tensor([[1, 1, 1, 0, 0]], dtype=torch.bool))
    torch.testing.assert_close(a, b[:, :3], atol=1e-5, rtol=1e-5)


def test_items_interact_only_in_attention_heads():
    spec = dict(input_dim=16, num_positions=4, d_model=32, num_heads=4, ff_dim=64)
    items = torch.randn(1, 3, 16)
    changed = items.clone()
    changed[0, 2] += 5.0
    mask = torch.ones(1, 3, dtype=torch.bool)
    for kind, interacts in (("linear", False), ("self_attention", True)):
        h = build_head(HeadSpec(kind=kind, **spec), seed=0).eval()
        same = torch.allclose(h(items, mask)[0, 0], h(changed, mask)[0, 0])
        assert same != interacts


def test_seeded_head_is_reproducible():
    spec = HeadSpec(kind="slot_query", input_dim=8, num_positions=3, d_model=16, num_heads=2, ff_dim=32)
    a, b = build_head(spec, seed=5), build_head(spec, seed=5)
    for (n, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(p, q), n


def test_gather_readout():
    hidden = torch.arange(2 * 5 * 3, dtype=torch.float32).reshape(2, 5, 3)
    pos = torch.tensor([[4, 0], [2, 2]])
    out = gather_readout(hidden, pos)
    assert torch.equal(out[0, 0], hidden[0, 4]) and torch.equal(out[1, 1], hidden[1, 2])


def test_qwen3_head_dim_from_config(backbones):
    dims = backbone_dims(read_config(backbones["qwen3"]))
    assert dims.head_dim == 16 and dims.hidden_size // dims.num_heads == 8
    assert dims.linear_shapes()["q_proj"] == (32, 64)


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "llama"])
def test_right_padding_matches_unpadded(backbones, family):
    """Right padding + causal attention: a slate's scores do not depend on what it is batched with."""
    bb = backbones[family]
    dims = backbone_dims(read_config(bb))
    head = build_head(HeadSpec("self_attention", dims.hidden_size, 6, 32, 2, 4, 64), seed=0).eval()
    model = HllmModel(load_backbone(bb), head).eval()
    builder = PromptBuilder(load_tokenizer(bb), PromptSpec())
    from hllm.testing import tiny_slates

    s = tiny_slates(2, (2, 6), seed=7)
    s[1]["candidates"] = s[1]["candidates"] * 1  # keep as is; lengths differ by construction
    alone = builder.encode([s[0]])
    both = builder.encode(s)
    assert both.input_ids.shape[1] >= alone.input_ids.shape[1]
    with torch.inference_mode():
        a = model(*(torch.from_numpy(x) for x in alone.inputs(False).values()))
        b = model(*(torch.from_numpy(x) for x in both.inputs(False).values()))
    n = int(alone.n_items[0])
    np.testing.assert_allclose(a[0, :n].numpy(), b[0, :n].numpy(), atol=1e-5)
