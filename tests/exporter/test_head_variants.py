"""Every head variant a team may bring (docs/formats.md, Scoring heads) exports in both flavours, and the
graph's scores equal PyTorch's (≤ 1e-4) on a batch the export did not validate on."""

from __future__ import annotations

import numpy as np
import pytest

from hllm.checkpoint.init import init_checkpoint
from hllm.exporter.onnx import export_onnx
from hllm.exporter.validate import synthetic_batch
from hllm.formats.checkpoint import load_manifest
from hllm.runtime.artefact import open_engine, resolve

SMALL = dict(d_model=16, num_heads=2, ff_dim=32)
VARIANTS = {
    "probe": ("probe", {}),
    "mlp-gelu": ("linear", {"d_model": 16, "activation": "gelu"}),
    "mlp-relu-context": ("linear", {"d_model": 16, "activation": "relu", "context": True}),
    "encoder-post-ln-relu": ("self_attention", {**SMALL, "norm_first": False, "final_norm": False, "activation": "relu"}),
    "encoder-post-ln-context": ("self_attention", {**SMALL, "norm_first": False, "activation": "relu", "context": True}),
    "slot-query-post-ln": ("slot_query", {**SMALL, "norm_first": False, "final_norm": False, "activation": "relu"}),
    "slot-query-silu-context": ("slot_query", {**SMALL, "activation": "silu", "context": True}),
}


@pytest.mark.parametrize("flavour", ["ort-cpu", "standard"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_head_variant_exports_with_parity(qwen3_backbone, tmp_path, variant, flavour):
    kind, kwargs = VARIANTS[variant]
    ck = init_checkpoint(qwen3_backbone, tmp_path / "ck", kind, 6, seed=1, head_kwargs=kwargs)
    export_onnx(ck, tmp_path / "exp", flavour=flavour)
    b = synthetic_batch(np.random.default_rng(5), load_manifest(ck).dims.vocab_size, [37, 9], [6, 3])
    ctx = b.context_positions if kwargs.get("context") else None
    with open_engine(resolve(ck)) as ref, open_engine(resolve(tmp_path / "exp")) as got:
        want = ref.run(b.input_ids, b.readout_positions, b.item_mask, ctx)
        have = got.run(b.input_ids, b.readout_positions, b.item_mask, ctx)
    assert want.shape == (2, 6, 6)
    assert np.abs(want - have).max() <= 1e-4
    assert np.abs(want[b.item_mask]).max() > 0  # real rows score something


def test_linear_head_needs_no_divisible_width():
    """The probe-like heads have no attention: d_model need not divide by num_heads."""
    from hllm.formats.checkpoint import HeadSpec

    HeadSpec("linear", 32, 8, d_model=30, num_heads=8).validate()
    with pytest.raises(Exception, match="divisible"):
        HeadSpec("self_attention", 32, 8, d_model=30, num_heads=8).validate()
