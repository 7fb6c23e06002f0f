"""Merge parity, merged-dir hygiene, ONNX export validated at untraced shapes, engines agree."""

import json

import numpy as np
import pytest
import torch

from hllm.formats.checkpoint import load_manifest
from hllm.engines.ort import OnnxRuntimeEngine
from hllm.engines.reference import TorchEngine
from hllm.errors import CheckpointError, ShapeError
from hllm.checkpoint.merge import ADAPTER_FILES, merge_checkpoint
from hllm.exporter.onnx import export_onnx
from hllm.exporter.validate import synthetic_batch, validation_batches
from hllm.model.hllm import load_model
from hllm.testing import tiny_slates


def test_lora_is_not_a_no_op(lora_checkpoint):
    """init writes non-zero LoRA B matrices, so the adapter really changes the scores."""
    from safetensors import safe_open

    m = load_manifest(lora_checkpoint)
    with safe_open(str(m.adapter_path / "adapter_model.safetensors"), "pt") as f:
        b = [f.get_tensor(k) for k in f.keys() if "lora_B" in k]
    assert b and all(t.abs().sum() > 0 for t in b)
    batch = synthetic_batch(np.random.default_rng(0), m.dims.vocab_size, [20], [3])
    args = [torch.from_numpy(x) for x in batch.inputs(False).values()]
    with torch.inference_mode():
        with_adapter = load_model(m)(*args)
        base = load_model(m)
        base.backbone.disable_adapter_layers()
        without = base(*args)
    assert (with_adapter - without).abs().max() > 1e-4


def test_merged_checkpoint_is_standalone(merged_checkpoint):
    m = load_manifest(merged_checkpoint)
    assert m.adapter_path is None
    assert not [p for p in merged_checkpoint.rglob("*") if p.name in ADAPTER_FILES]
    assert "merged_from" in m.extra


def test_merge_parity_tied_embeddings(backbones, tmp_path):
    """Llama tiny has tie_word_embeddings=True: merge must still reproduce the adapter model."""
    from hllm.checkpoint.init import init_checkpoint
    from tests.conftest import TINY_HEAD

    ck = init_checkpoint(backbones["llama"], tmp_path / "ck", "linear", 6, lora_rank=2, head_kwargs=TINY_HEAD)
    merge_checkpoint(ck, tmp_path / "merged", tiny_slates(2, (2, 6)))
    # independent of merge's own self-check: other inputs, both models loaded here
    adapter, merged = load_model(load_manifest(ck)), load_model(load_manifest(tmp_path / "merged"))
    b = synthetic_batch(np.random.default_rng(21), load_manifest(ck).dims.vocab_size, [33, 12], [6, 3])
    args = [torch.from_numpy(x) for x in b.inputs(False).values()]
    with torch.inference_mode():
        want, got = adapter(*args).numpy(), merged(*args).numpy()
    assert np.abs(want).max() > 1e-3  # scores that can differ
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_merge_refuses_checkpoint_without_adapter(merged_checkpoint, tmp_path):
    with pytest.raises(CheckpointError, match="no adapter"):
        merge_checkpoint(merged_checkpoint, tmp_path / "x", tiny_slates(1))


def test_export_refuses_unmerged(lora_checkpoint, tmp_path):
    with pytest.raises(CheckpointError, match="hllm merge"):
        export_onnx(lora_checkpoint, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_export_sidecar_and_validation(export_dir):
    meta = json.loads((export_dir / "export.json").read_text())
    shapes = {v["shape"] for v in meta["validation"]["shapes"]}
    assert {"B1_N1", "B3_unequal", "B2_NK"} <= shapes
    assert meta["num_positions"] == 8 and meta["precision"] == "fp32"
    assert [i["name"] for i in meta["inputs"]] == ["input_ids", "readout_positions", "item_mask"]
    assert (export_dir / "tokenizer.json").is_file()
    assert len(meta["source_checkpoint"]["sha256"]) == 64


def _ort_vs_torch(checkpoint, onnx_path, batch) -> float:
    """max |ONNX Runtime − PyTorch| on ``batch``, with a bare onnxruntime session (not hllm's engine)."""
    import onnxruntime as ort

    feeds = batch.inputs(False)
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    (got,) = sess.run(["scores"], feeds)
    with torch.inference_mode():
        want = load_model(load_manifest(checkpoint))(*(torch.from_numpy(x) for x in feeds.values())).numpy()
    return float(np.abs(got - want).max())


def test_export_sidecar_records_the_diff_it_had(merged_checkpoint, export_dir):
    """The sidecar's per-shape max |ΔM| is what ONNX Runtime and PyTorch give here on the same batches."""
    meta = json.loads((export_dir / "export.json").read_text())
    recorded = {v["shape"]: v["max_abs_diff"] for v in meta["validation"]["shapes"]}
    for name, b in validation_batches(load_manifest(merged_checkpoint).dims.vocab_size, 8, seed=0):
        diff = _ort_vs_torch(merged_checkpoint, export_dir / "model.onnx", b)
        assert diff <= 1e-4 and recorded[name] == pytest.approx(diff, abs=1e-6), name
    assert meta["validation"]["max_abs_diff"] == pytest.approx(max(recorded.values()))


def test_onnx_graph_has_dynamic_dims(export_dir):
    import onnx

    g = onnx.load(str(export_dir / "model.onnx"), load_external_data=False).graph
    dims = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in g.input}
    assert all(isinstance(d, str) for d in dims["input_ids"])
    assert all(isinstance(d, str) for d in dims["item_mask"])
    out = [d.dim_param or d.dim_value for d in g.output[0].type.tensor_type.shape.dim]
    assert out[-1] == 8


@pytest.mark.parametrize("family,kind", [("qwen2", "linear"), ("llama", "slot_query")])
def test_export_other_families_and_heads(backbones, tmp_path, family, kind):
    """Every head kind and backbone family exports (qwen3 + self_attention is the export_dir fixture)."""
    from hllm.checkpoint.init import init_checkpoint
    from tests.conftest import TINY_HEAD

    ck = init_checkpoint(backbones[family], tmp_path / "ck", kind, 5, head_kwargs=TINY_HEAD)
    export_onnx(ck, tmp_path / "exp")
    b = synthetic_batch(np.random.default_rng(22), load_manifest(ck).dims.vocab_size, [51, 8], [5, 2])  # not validated by export
    assert _ort_vs_torch(ck, tmp_path / "exp" / "model.onnx", b) <= 1e-4


def test_engines_agree_and_validate_inputs(merged_checkpoint, export_dir):
    m = load_manifest(merged_checkpoint)
    for name, b in validation_batches(m.dims.vocab_size, 8, seed=11):
        with TorchEngine(merged_checkpoint) as te, OnnxRuntimeEngine(export_dir / "model.onnx", 8) as oe:
            a = te.run(b.input_ids, b.readout_positions, b.item_mask)
            o = oe.run(b.input_ids, b.readout_positions, b.item_mask)
        np.testing.assert_allclose(a, o, atol=1e-4, err_msg=name)
    with OnnxRuntimeEngine(export_dir / "model.onnx", 8) as oe:
        ids = np.zeros((1, 5), np.int64)
        with pytest.raises(ShapeError, match="readout_positions must lie"):
            oe.run(ids, np.array([[7]]), np.array([[True]]))
        with pytest.raises(ShapeError, match="int64"):
            oe.run(ids.astype(np.int32), np.array([[1]]), np.array([[True]]))
