"""``hllm debug precision``: on a tiny Llama whose layer-1 MLP is planted to overflow float16 (gate/up
weights × 1000, down weights ÷ 10⁶: the same function in real arithmetic up to SiLU, 10⁶× larger
intermediate activations), the keep-one search names ``backbone.layers.1.mlp`` and the FP16 graph with
that island equals the FP32 ranking; the islands file is read by the FP16 export."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hllm.errors import EngineError
from tests.conftest import TINY_HEAD

K = 6
PLANTED = "backbone.layers.1.mlp"


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """(checkpoint, standard export, encoded batches) of a tiny Llama with the planted layer-1 MLP."""
    import torch
    from transformers import AutoModelForCausalLM

    from hllm.checkpoint.init import init_checkpoint
    from hllm.exporter.onnx import export_onnx
    from hllm.exporter.validate import synthetic_batch
    from hllm.testing import tiny_backbone

    root = tmp_path_factory.mktemp("planted")
    bb = tiny_backbone(root / "bb", "llama", seed=3, num_hidden_layers=3)
    m = AutoModelForCausalLM.from_pretrained(str(bb), dtype=torch.float32)
    mlp = m.model.layers[1].mlp
    with torch.no_grad():
        mlp.gate_proj.weight.mul_(1e3)
        mlp.up_proj.weight.mul_(1e3)
        mlp.down_proj.weight.div_(1e6)
    m.save_pretrained(str(bb))
    ck = init_checkpoint(bb, root / "ck", "self_attention", K, seed=0, head_kwargs=TINY_HEAD)
    export_onnx(ck, root / "ex", flavour="standard")
    rng = np.random.default_rng(1)
    vocab = m.config.vocab_size
    batches = [synthetic_batch(rng, vocab, [60, 41], [K, 4]) for _ in range(3)]
    return ck, root / "ex", batches


def test_debugger_finds_the_planted_fp16_layer_and_its_islands_file_exports(planted, tmp_path):
    from hllm.calibration.precision_search.precision_debug import (DebugSettings, VariantRunner, modules_to_try, debug_precision,
                                                  islands_file)
    from hllm.exporter.fp16 import read_islands_file
    from hllm.exporter.onnx import export_onnx

    ck, export, batches = planted
    slates = [{"slate_id": str(i)} for i in range(sum(len(b.n_items) for b in batches))]
    runner = VariantRunner(export, "fp16", batches, threads=1)
    try:
        ref = runner.reference()
        res = debug_precision(runner, ref, slates, modules_to_try(3), DebugSettings(min_top1=1.0, min_tau=0.99))
    finally:
        runner.close()
    assert res["baseline"]["nonfinite"] > 0  # the planted MLP overflows float16
    assert res["modules"][0]["module"] == PLANTED and res["modules"][0]["fixes_nonfinite"]
    assert [r["module"] for r in res["modules"] if r["fixes_nonfinite"]] == [PLANTED]
    assert res["islands"] == [PLANTED] and res["passed"]
    assert res["islands_figures"]["top1_agreement"] == 1.0

    f = tmp_path / "islands.json"
    f.write_text(json.dumps(islands_file("fp16", res, str(export))))
    islands = read_islands_file(f)
    assert islands[-1] == PLANTED and "rmsnorm" in islands
    rep = export_onnx(ck, tmp_path / "fp16", precision="fp16", fp32_islands=islands, slates=[])
    meta = json.loads((tmp_path / "fp16" / "export.json").read_text())
    assert PLANTED in meta["fp32_islands"] and rep.fp16.validation["nonfinite"] == 0


def test_islands_and_targets_are_validated(tmp_path):
    from hllm.calibration.precision_search.precision_debug import VariantRunner, modules_to_try
    from hllm.errors import ExportError
    from hllm.exporter.fp16 import parse_islands, read_islands_file

    assert parse_islands("default,backbone.layers.3.mlp")[-1] == "backbone.layers.3.mlp"
    with pytest.raises(ExportError, match="unknown FP32 island"):
        parse_islands("layers.3")
    (tmp_path / "bad.json").write_text('{"islands": "rmsnorm"}')
    with pytest.raises(ExportError, match="'islands' list"):
        read_islands_file(tmp_path / "bad.json")
    assert modules_to_try(2, ["mlp"], head=False) == ["backbone.layers.0.mlp", "backbone.layers.1.mlp"]
    with pytest.raises(EngineError, match="layers must lie"):
        modules_to_try(2, layers=[5])
    with pytest.raises(EngineError, match="unknown target"):
        VariantRunner(tmp_path, "int4", [])
