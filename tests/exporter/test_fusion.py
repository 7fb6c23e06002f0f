"""Export flavours: the fused ``ort-cpu`` graph (GroupQueryAttention, (Skip)SimplifiedLayerNormalization)
and the portable ``standard`` graph (only ai.onnx ops, no IsNaN), on tiny Qwen3 (head_dim ≠ hidden/heads,
q/k norm), Qwen2 (q/k/v bias) and Llama; scores against PyTorch at shapes the export did not trace."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import onnx
import pytest
import torch

from hllm.exporter.patches import causal_sdpa_export
from hllm.exporter.fusion import nonstandard_ops
from hllm.exporter.onnx import export_onnx
from hllm.exporter.validate import synthetic_batch
from hllm.engines.ort import OnnxRuntimeEngine
from hllm.errors import ExportError
from hllm.model.hllm import load_model
from tests.conftest import TINY_HEAD

K = 8
# name → (family, config overrides). ORT's GQA applies rotary itself only for head_size % 16 == 0;
# head_dim 8 keeps the rotary outside the op (do_rotary=0).
ARCHS = {
    "qwen3": ("qwen3", {}),                                  # head_dim 16 ≠ 32/4, q/k RMSNorm
    "qwen2": ("qwen2", {}),                                  # head_dim 8, q/k/v bias
    "llama": ("llama", {}),                                  # head_dim 8, tied embeddings
    "llama_hd16": ("llama", {"head_dim": 16}),               # rotary inside GQA on Llama (SmolLM2's family)
    "qwen2_mha": ("qwen2", {"num_key_value_heads": 4}),      # no KV grouping (H == Hkv)
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from hllm.checkpoint.init import init_checkpoint
    from hllm.testing import tiny_backbone

    root = tmp_path_factory.mktemp("fusion")
    out = {}
    for i, (name, (family, overrides)) in enumerate(ARCHS.items()):
        bb = tiny_backbone(root / f"bb-{name}", family, seed=10 + i, **overrides)
        out[name] = init_checkpoint(bb, root / f"ck-{name}", "self_attention", K, seed=i, head_kwargs=TINY_HEAD)
    return out


@pytest.fixture(scope="module")
def exports(checkpoints, tmp_path_factory):
    """{(arch, flavour): export dir}, built lazily."""
    root = tmp_path_factory.mktemp("fusion-exports")
    cache = {}

    def get(arch, flavour):
        if (arch, flavour) not in cache:
            export_onnx(checkpoints[arch], root / f"{arch}-{flavour}", flavour=flavour)
            cache[arch, flavour] = root / f"{arch}-{flavour}"
        return cache[arch, flavour]

    return get


def _ops(export_dir) -> Counter:
    g = onnx.load(str(export_dir / "model.onnx"), load_external_data=False).graph
    return Counter(f"{n.domain or 'ai.onnx'}:{n.op_type}" for n in g.node)


def _max_diff_at_untraced_shapes(ckpt, export_dir) -> dict[str, float]:
    """Fresh shapes (the export traced B=2 S=32 N≤4): B>1 with unequal lengths and N<K, a longer row,
    B=1, and N=K."""
    model = load_model(ckpt)
    vocab = model.backbone.config.vocab_size
    rng = np.random.default_rng(123)
    shapes = {"B4_unequal_N<K": ([57, 9, 130, 3], [5, 1, 7, 2]), "B1_S300": ([300], [K]), "B2_N=K": ([80, 45], [K, K])}
    out = {}
    with OnnxRuntimeEngine(export_dir / "model.onnx", K) as eng, torch.inference_mode():
        for name, (lengths, items) in shapes.items():
            b = synthetic_batch(rng, vocab, lengths, items)
            ref = model(*(torch.from_numpy(x) for x in b.inputs(False).values())).numpy()
            got = eng.run(b.input_ids, b.readout_positions, b.item_mask)
            assert np.isfinite(got).all()
            out[name] = float(np.abs(ref - got).max())
    return out


@pytest.mark.parametrize("arch", list(ARCHS))
def test_fused_export_matches_pytorch_and_holds_the_fused_ops(arch, checkpoints, exports):
    d = exports(arch, "ort-cpu")
    meta = json.loads((d / "export.json").read_text())
    assert meta["flavour"] == "ort-cpu"  # the tolerance is recomputed below, not read back from the sidecar
    diffs = _max_diff_at_untraced_shapes(checkpoints[arch], d)
    assert max(diffs.values()) <= 1e-4, diffs

    ops = _ops(d)
    layers = 2
    assert ops["com.microsoft:GroupQueryAttention"] == layers  # one per decoder layer
    assert ops["com.microsoft:SkipSimplifiedLayerNormalization"] == 2 * layers  # residual + RMSNorm
    # the first input RMSNorm (+ Qwen3's q and k norms per layer) stay SimplifiedLayerNormalization
    assert ops["ai.onnx:SimplifiedLayerNormalization"] == 1 + (2 * layers if arch == "qwen3" else 0)
    assert ops["com.microsoft:MultiHeadAttention"] == 2  # the scoring head's two attention blocks
    assert not [o for o in ops if o.endswith((":Softmax", ":IsNaN", ":Trilu", ":Pow"))]  # all inside fused ops
    assert meta["fusion"]["ops"] == dict(sorted(ops.items()))

    g = onnx.load(str(d / "model.onnx"), load_external_data=False).graph
    gqa = [n for n in g.node if n.op_type == "GroupQueryAttention"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in gqa[0].attribute}
    cfg = load_model(checkpoints[arch]).backbone.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    assert attrs["num_heads"] == cfg.num_attention_heads and attrs["kv_num_heads"] == cfg.num_key_value_heads
    assert attrs["do_rotary"] == int(head_dim % 16 == 0)


@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "llama"])
def test_standard_export_is_portable_and_matches_pytorch(arch, checkpoints, exports):
    d = exports(arch, "standard")
    meta = json.loads((d / "export.json").read_text())
    assert meta["flavour"] == "standard"  # the tolerance is recomputed below, not read back from the sidecar
    diffs = _max_diff_at_untraced_shapes(checkpoints[arch], d)
    assert max(diffs.values()) <= 1e-4, diffs
    ops = _ops(d)
    assert nonstandard_ops(d / "model.onnx") == {}
    assert all(o.startswith("ai.onnx:") for o in ops)
    assert "ai.onnx:IsNaN" not in ops and "ai.onnx:CumSum" not in ops  # no NaN guard, no packed-sequence mask
    assert ops["ai.onnx:Softmax"] == 2 + 2  # decoder layers + head blocks: attention is still there, unfused
    assert meta["fusion"]["rewrites"]["softmax_nan_guards_removed"] == 2  # the head's key-padding attention


def test_nonstandard_ops_names_contrib_ops(exports):
    bad = nonstandard_ops(exports("qwen3", "ort-cpu") / "model.onnx")
    assert bad["com.microsoft:GroupQueryAttention"] == 2
    assert bad["ai.onnx:SimplifiedLayerNormalization"] == 5  # ORT registers it in the ONNX domain


def test_flavour_defaults_and_refusals(checkpoints, tmp_path):
    with pytest.raises(ExportError, match="--flavour standard"):
        export_onnx(checkpoints["qwen3"], tmp_path / "x", precision="fp16", flavour="ort-cpu")
    with pytest.raises(ExportError, match="flavour must be one of"):
        export_onnx(checkpoints["qwen3"], tmp_path / "x", flavour="tensorrt")
    assert not (tmp_path / "x").exists()


def test_export_fails_and_writes_nothing_when_attention_does_not_fuse(checkpoints, tmp_path, monkeypatch):
    from hllm.exporter import fusion

    monkeypatch.setattr(fusion.CausalGroupQueryAttention, "check", lambda self, context, **kw: False)
    with pytest.raises(ExportError, match=r"attention fusion matched 0 of 2 decoder layers.*--flavour standard"):
        export_onnx(checkpoints["llama"], tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_causal_sdpa_patch_is_reversible():
    from transformers import masking_utils as mu

    before = (mu._ignore_causal_mask_sdpa, mu.find_packed_sequence_indices)
    with causal_sdpa_export():
        assert mu._ignore_causal_mask_sdpa is not before[0]
        assert mu._ignore_causal_mask_sdpa(None, 5, 5, 0, 0) is True  # plain prefill: mask skipped
        padding = torch.tensor([[True, True, False]])
        assert mu._ignore_causal_mask_sdpa(padding, 3, 3, 0, 0) is False  # a padding mask keeps its mask
        assert mu.find_packed_sequence_indices(torch.arange(4)[None]) is None
    assert (mu._ignore_causal_mask_sdpa, mu.find_packed_sequence_indices) == before
    with pytest.raises(RuntimeError), causal_sdpa_export():
        raise RuntimeError("boom")
    assert (mu._ignore_causal_mask_sdpa, mu.find_packed_sequence_indices) == before


def test_causal_sdpa_patch_keeps_pytorch_scores(checkpoints):
    """Inside the patch the eager model computes the same scores (SDPA is_causal vs a causal mask)."""
    model = load_model(checkpoints["qwen3"])
    b = synthetic_batch(np.random.default_rng(5), model.backbone.config.vocab_size, [30, 12], [4, 2])
    args = [torch.from_numpy(x) for x in b.inputs(False).values()]
    with torch.inference_mode():
        ref = model(*args)
        with causal_sdpa_export():
            patched = model(*args)
    assert torch.allclose(ref, patched, atol=1e-6)


def test_cli_export_flavour_option(checkpoints, tmp_path, capsys):
    from hllm.cli.app import main

    out = tmp_path / "e"
    with pytest.raises(SystemExit) as e:
        main(["export", str(checkpoints["qwen2"]), str(out), "--flavour", "standard", "--slates", ""])
    assert e.value.code in (0, None)
    assert "(standard," in capsys.readouterr().out
    assert json.loads((out / "export.json").read_text())["flavour"] == "standard"
    with pytest.raises(SystemExit) as e:
        main(["export", str(checkpoints["qwen2"]), str(tmp_path / "x"), "--flavour", "tensorrt", "--slates", ""])
    assert e.value.code == 2 and "flavour must be one of ort-cpu, standard" in capsys.readouterr().err


@pytest.mark.parametrize("arch", ["qwen3", "llama_hd16"])
def test_fuse_export_turns_a_standard_export_into_the_fused_flavour(arch, checkpoints, exports, tmp_path):
    """``fuse_export`` (no re-trace) yields the same fused ops as a fused export and PyTorch's scores at
    untraced shapes; the input export is left as it was; a fused or existing destination is refused."""
    from hllm.exporter.fusion import fuse_export

    src = exports(arch, "standard")
    before = {f.name: f.stat().st_mtime_ns for f in src.iterdir()}
    fuse_export(src, tmp_path / "fused")
    meta = json.loads((tmp_path / "fused" / "export.json").read_text())
    assert meta["flavour"] == "ort-cpu" and meta["fused_from"] == json.loads((src / "export.json").read_text())["onnx_sha256"]
    ops = _ops(tmp_path / "fused")
    assert ops["com.microsoft:GroupQueryAttention"] == 2 and ops["com.microsoft:MultiHeadAttention"] == 2
    diffs = _max_diff_at_untraced_shapes(checkpoints[arch], tmp_path / "fused")
    assert max(diffs.values()) <= 1e-4, diffs
    assert {f.name: f.stat().st_mtime_ns for f in src.iterdir()} == before
    with pytest.raises(ExportError, match="exists"):
        fuse_export(src, tmp_path / "fused")
    with pytest.raises(ExportError, match="standard export"):
        fuse_export(tmp_path / "fused", tmp_path / "again")


def test_fuse_export_of_a_context_head_feeds_context_positions(context_checkpoint, tmp_path):
    """A head that reads the user context: the fused graph made by ``fuse_export`` keeps the
    ``context_positions`` input and scores real encoded slates (B=3, unequal lengths, N<K) like PyTorch."""
    from hllm.exporter.fusion import fuse_export
    from hllm.runtime.artefact import resolve
    from hllm.runtime.prompt import PromptBuilder, load_tokenizer
    from hllm.testing import tiny_slates

    export_onnx(context_checkpoint, tmp_path / "std", flavour="standard")
    fuse_export(tmp_path / "std", tmp_path / "fused")
    art = resolve(tmp_path / "fused")
    assert art.flavour == "ort-cpu" and art.context
    assert "context_positions" in [i.name for i in onnx.load(str(art.path), load_external_data=False).graph.input]
    builder = PromptBuilder(load_tokenizer(art.tokenizer_path), art.prompt, max_items=art.num_positions)
    b = builder.encode(tiny_slates(3, (2, 7), seed=8))
    model = load_model(context_checkpoint)
    with torch.inference_mode():
        ref = model(*(torch.from_numpy(x) for x in b.inputs(True).values())).numpy()
    with OnnxRuntimeEngine(art.path, art.num_positions, context=True) as eng:
        got = eng.run(b.input_ids, b.readout_positions, b.item_mask, b.context_positions)
    assert np.abs(ref - got).max() <= 1e-4
