"""The user-context readout (``HeadSpec.context``, beyond the paper): the prompt builder's context
position, the model reading the hidden state there, and the optional graph input ``context_positions``
through export (both flavours), ONNX Runtime and the Ranker."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from hllm.errors import ShapeError
from hllm.testing import tiny_slates


def test_context_position_is_the_last_user_context_token(qwen3_backbone):
    from hllm.formats.prompt import PromptSpec
    from hllm.runtime.prompt import PromptBuilder, load_tokenizer

    tok = load_tokenizer(qwen3_backbone)
    b = PromptBuilder(tok, PromptSpec(), max_items=8)
    s = tiny_slates(1, 5, seed=2)[0]
    enc = b.encode_one(s)
    ctx_ids, _ = b._context_ids(s["history"])
    assert enc.context_end == len(ctx_ids) - 1 < enc.readout[0]
    assert enc.ids[: enc.context_end + 1] == ctx_ids
    batch = b.encode([s, tiny_slates(1, 3, seed=4)[0]])
    assert batch.context_positions.dtype == np.int64 and batch.context_positions.shape == (2,)
    assert list(batch.inputs(True)) == ["input_ids", "readout_positions", "item_mask", "context_positions"]


def test_model_reads_the_context_position(context_checkpoint):
    from hllm.model.hllm import load_model
    from hllm.runtime.prompt import PromptBuilder, load_tokenizer
    from hllm.formats.checkpoint import load_manifest

    m = load_manifest(context_checkpoint)
    model = load_model(m)
    assert model.reads_context and m.head.context
    b = PromptBuilder(load_tokenizer(m.tokenizer_path), m.prompt, max_items=8).encode(tiny_slates(2, (3, 6), seed=1))
    args = [torch.from_numpy(x) for x in b.inputs(True).values()]
    with torch.inference_mode():
        a = model(*args)
        moved = model(*args[:3], args[3] - 1)  # another context token → other scores
        with pytest.raises(ValueError, match="user context"):
            model(*args[:3])
    assert not torch.allclose(a, moved)


@pytest.mark.parametrize("flavour", ["ort-cpu", "standard"])
def test_context_export_matches_pytorch_and_ranks(tiny_dir, context_checkpoint, flavour):
    from hllm.exporter.onnx import export_onnx
    from hllm.exporter.validate import synthetic_batch
    from hllm.engines.reference import TorchEngine
    from hllm.runtime import Ranker
    from hllm.runtime.artefact import resolve

    out = tiny_dir / f"export-context-{flavour}"
    rep = export_onnx(context_checkpoint, out, flavour=flavour, overwrite=True)
    assert rep.max_abs_diff <= 1e-4
    side = json.loads((out / "export.json").read_text())
    assert [t["name"] for t in side["inputs"]][-1] == "context_positions"
    art = resolve(out)
    assert art.context and art.flavour == flavour
    b = synthetic_batch(np.random.default_rng(7), 300, [41, 12, 30], [8, 3, 5])  # shapes not traced
    with Ranker.from_path(out) as onnx_r, TorchEngine(context_checkpoint) as ref:
        got = onnx_r.engine.run(b.input_ids, b.readout_positions, b.item_mask, b.context_positions)
        want = ref.run(b.input_ids, b.readout_positions, b.item_mask, b.context_positions)
        np.testing.assert_allclose(got, want, atol=1e-4)
        with pytest.raises(ShapeError, match="context_positions"):
            onnx_r.engine.run(b.input_ids, b.readout_positions, b.item_mask)
        slates = tiny_slates(3, (2, 8), seed=11)
        with Ranker.from_path(context_checkpoint) as torch_r:
            assert [r.order for r in onnx_r.rank(slates)] == [r.order for r in torch_r.rank(slates)]
