"""INT8 on the fused ``ort-cpu`` graph (GroupQueryAttention, (Skip)SimplifiedLayerNormalization,
MultiHeadAttention head) of tiny Qwen3 (q/k norm, head_dim 16) and Llama (head_dim 16: rotary inside
GQA, SmolLM2's family): parts resolve, dynamic and static quantization leave every contrib op float,
``hllm calibrate`` runs end to end, and the per-layer activation ranges match PyTorch's activations."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from hllm.calibration.recipes.activation_ranges import RESOLUTION, activation_ranges, decoder_matmul_inputs
from hllm.calibration.data import build_calibration_set
from hllm.calibration.recipes.options import FLOAT_OPS, QuantOptions
from hllm.calibration.recipes.parts import (excluded_nodes, float_ops_fed_by_quantized, nodes_in_part, quantized_nodes,
                                    sensitivity_ladder, weight_matmuls)
from hllm.calibration.recipes.quantize import quantize_export
from hllm.exporter.scopes import module_path
from hllm.cli import main
from hllm.errors import EngineError
from hllm.runtime import Ranker, write_jsonl
from hllm.runtime.artefact import resolve
from hllm.runtime.prompt import PromptBuilder, load_tokenizer
from hllm.testing import tiny_slates
from tests.conftest import REPO, TINY_HEAD

CONTRIB = ("GroupQueryAttention", "MultiHeadAttention", "SkipSimplifiedLayerNormalization")


@pytest.fixture(scope="module")
def llama_fused(tmp_path_factory):
    """(checkpoint, fused export) of a tiny Llama with head_dim 16 (GQA applies the rotary itself)."""
    from hllm.checkpoint.init import init_checkpoint
    from hllm.exporter.onnx import export_onnx
    from hllm.testing import tiny_backbone

    root = tmp_path_factory.mktemp("int8-fused")
    bb = tiny_backbone(root / "bb", "llama", seed=21, head_dim=16)
    ck = init_checkpoint(bb, root / "ck", "self_attention", 8, seed=3, head_kwargs=TINY_HEAD)
    export_onnx(ck, root / "export")
    return ck, root / "export"


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def fused(request, merged_checkpoint, export_dir, llama_fused):
    """(name, checkpoint, fused export dir): conftest's Qwen3 export (default flavour) or the Llama above."""
    ck, ex = (merged_checkpoint, export_dir) if request.param == "qwen3" else llama_fused
    assert resolve(ex).flavour == "ort-cpu"
    return request.param, ck, ex


def _builder(ex):
    art = resolve(ex)
    return PromptBuilder(load_tokenizer(art.tokenizer_path), art.prompt, max_items=art.num_positions)


def _load(ex):
    return onnx.load(str(ex / "model.onnx"), load_external_data=False)


def _ops(model, op_type):
    return [n for n in model.graph.node if n.op_type == op_type]


# -- parts on the fused graph -----------------------------------------------------------------------

def test_fused_nodes_carry_module_paths_and_parts_resolve(fused):
    _, _, ex = fused
    m = _load(ex)
    for op in ("MatMul", *CONTRIB):
        assert _ops(m, op) and all(module_path(n) for n in _ops(m, op)), op  # metadata kept by the fusions
    gqa = _ops(m, "GroupQueryAttention")
    assert [module_path(n) for n in gqa] == ["backbone.layers.0.self_attn", "backbone.layers.1.self_attn"]
    assert {n.name for n in _ops(m, "MultiHeadAttention")} <= set(nodes_in_part(m, "head"))
    assert {n.name for n in gqa} <= set(nodes_in_part(m, "attention"))
    norms = set(nodes_in_part(m, "norms"))
    assert {n.name for op in ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization")
            for n in _ops(m, op)} <= norms
    for i, g in enumerate(gqa):
        block = set(nodes_in_part(m, f"block:{i}"))
        want = {n.name for n in weight_matmuls(m) if module_path(n).startswith(f"backbone.layers.{i}.")}
        assert len(want) == 7 and want | {g.name} <= block and not block & {x.name for x in gqa if x is not g}
    assert nodes_in_part(m, "first") == nodes_in_part(m, "block:0")
    assert sensitivity_ladder(m) == ["head", "block:1", "block:0"]


def test_fused_norm_recognised_by_op_type_without_a_norm_path(export_dir):
    m = _load(export_dir)
    skip = _ops(m, "SkipSimplifiedLayerNormalization")[0]
    for p in skip.metadata_props:  # metadata merged from the matched Add of the residual, say
        if p.key == "pkg.torch.onnx.name_scopes":
            p.value = "['backbone', 'backbone.layers.1', 'add']"
    assert module_path(skip) == "backbone.layers.1" and skip.name in nodes_in_part(m, "norms")


def test_parts_refused_when_a_matmul_has_no_module_path(export_dir):
    m = _load(export_dir)
    mm = weight_matmuls(m)[3]
    del mm.metadata_props[:]
    with pytest.raises(EngineError, match=f"no module path.*{mm.name}"):
        excluded_nodes(m, QuantOptions(exclude=("head",)))
    assert excluded_nodes(m, QuantOptions(exclude_nodes=(mm.name,))) == [mm.name]  # names still work


def test_contrib_op_types_and_modelopt_on_fused_graph_are_refused(export_dir, tmp_path, capsys):
    for op in ("GroupQueryAttention", "RotaryEmbedding", "SkipSimplifiedLayerNormalization"):
        with pytest.raises(EngineError, match="stay float"):
            QuantOptions(op_types=("MatMul", op)).validate()
    with pytest.raises(EngineError, match="--flavour standard"):
        quantize_export(export_dir, tmp_path / "m", QuantOptions(backend="modelopt", target="a100"))
    code, _, err = _run(["calibrate", str(export_dir), str(tmp_path / "m"), "--backend", "modelopt",
                         "--target", "a100", "--slates", str(tmp_path / "absent.jsonl")], capsys)
    assert code == 2 and "--flavour standard" in err and "Traceback" not in err
    code, _, err = _run(["calibrate", str(export_dir), str(tmp_path / "m"), "--backend", "ort-dynamic",
                         "--op-type", "GroupQueryAttention"], capsys)
    assert code == 2 and "stay float" in err and "Traceback" not in err
    assert not (tmp_path / "m").exists()


# -- quantized graphs -----------------------------------------------------------------------------

def _check_contrib_float(src, q):
    """Every contrib op of the source is still there, same op, and reads no quantized tensor."""
    for op in FLOAT_OPS:
        assert [n.name for n in _ops(q, op)] == [n.name for n in _ops(src, op)], op
    assert float_ops_fed_by_quantized(q) == []


def _backbone_weight_matmuls(m):
    return {n.name for n in weight_matmuls(m) if not module_path(n).startswith("head")}


def test_dynamic_int8_of_fused_graph(fused, tmp_path):
    _, _, ex = fused
    res = quantize_export(ex, tmp_path / "d", QuantOptions(backend="ort-dynamic", exclude=("head",)))
    src, q = _load(ex), _load(tmp_path / "d")
    quantized = {n.removesuffix("_quant") for n in quantized_nodes(q)}  # ORT names them NODE_quant
    assert quantized == _backbone_weight_matmuls(src) and len(quantized) == 14
    assert len(_ops(q, "MatMulInteger")) == 14 == res.summary["ops"]["MatMulInteger"]
    _check_contrib_float(src, q)
    side = json.loads((tmp_path / "d" / "export.json").read_text())
    assert side["flavour"] == "ort-cpu" and side["quantization"]["source_flavour"] == "ort-cpu"
    assert side["precision"] == "int8" and resolve(tmp_path / "d").flavour == "ort-cpu"


def test_static_int8_of_fused_graph_runs_integer_matmuls_with_float_contrib_inputs(fused, tmp_path):
    _, _, ex = fused
    calib = build_calibration_set(tiny_slates(12, (2, 8), seed=31), _builder(ex), count=8, seed=0)
    quantize_export(ex, tmp_path / "s", QuantOptions(exclude=("head",)), calib)
    src, q = _load(ex), _load(tmp_path / "s")
    quantized = set(quantized_nodes(q))
    assert quantized == _backbone_weight_matmuls(src) and len(quantized) == 14
    _check_contrib_float(src, q)
    producer = {o: n for n in q.graph.node for o in n.output}
    # no Q/DQ on MatMul outputs: each quantized MatMul's output goes straight to float consumers
    assert not [n for n in q.graph.node if n.op_type == "QuantizeLinear" and producer.get(n.input[0]) is not None
                and producer[n.input[0]].name in quantized]
    # ONNX Runtime turns DQ → MatMul into the integer GEMM with float output
    opts = ort.SessionOptions()
    opts.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(str(tmp_path / "s" / "model.onnx"), opts, providers=["CPUExecutionProvider"])
    ran = [n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node]
    assert ran.count("MatMulIntegerToFloat") == 14 and "QLinearMatMul" not in ran
    side = json.loads((tmp_path / "s" / "export.json").read_text())
    assert side["quantization"]["source_flavour"] == "ort-cpu"
    assert side["quantization"]["calibration"]["data_sha256"] == calib.data_sha256()
    rk = Ranker.from_path(tmp_path / "s").rank(tiny_slates(2, 4, seed=1))
    assert [sorted(r.order) for r in rk] == [[0, 1, 2, 3]] * 2


def test_static_int8_of_whole_fused_graph_keeps_head_attention_float(export_dir, tmp_path):
    calib = build_calibration_set(tiny_slates(12, (2, 8), seed=31), _builder(export_dir), count=4, seed=0)
    quantize_export(export_dir, tmp_path / "all", QuantOptions(), calib)  # head projections quantized too
    src, q = _load(export_dir), _load(tmp_path / "all")
    assert len(quantized_nodes(q)) == len(weight_matmuls(src)) == 28
    _check_contrib_float(src, q)


# -- hllm calibrate end to end ------------------------------------------------------------------------

def _run(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    cap = capsys.readouterr()
    return e.value.code, cap.out, cap.err


@pytest.mark.parametrize("backend", ["ort-dynamic", "ort-static"])
def test_cli_calibrate_fused_llama(backend, llama_fused, tmp_path, capsys):
    _, ex = llama_fused
    tr = write_jsonl(tmp_path / "train.jsonl", [dict(s, slate_id=f"t{i}") for i, s in
                                                 enumerate(tiny_slates(24, (2, 8), seed=41))])
    ev = write_jsonl(tmp_path / "eval.jsonl", [dict(s, slate_id=f"e{i}") for i, s in
                                                enumerate(tiny_slates(30, (2, 8), seed=42))])
    out = tmp_path / "int8"
    code, _, err = _run(["calibrate", str(ex), str(out), "--backend", backend, "--calib-slates", str(tr),
                         "--calib-count", "16", "--slates", str(ev), "-x", "head", "--min-top1", "0.8",
                         "--report", str(tmp_path / "r.json")], capsys)
    assert code == 0, err
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["passed"] and r["backend"] == backend and r["excluded_parts"] == ["head"]
    assert 0.8 <= r["top1_agreement"] <= 1 and r["gate"]["quantized_nodes"] == 14 and r["gate"]["nonfinite"] == 0
    assert (r["calibration"] is None) == (backend == "ort-dynamic")
    side = json.loads((out / "export.json").read_text())
    assert side["quantization"]["source_flavour"] == "ort-cpu" and side["quantization"]["backend"] == backend
    assert json.loads((out / "calibration_report.json").read_text())["top1_agreement"] == r["top1_agreement"]
    code, _, err = _run(["rank", str(out), "--slates", str(ev), "--limit", "2", "-o", str(tmp_path / "rk.jsonl")],
                        capsys)
    assert code == 0, err
    rows = [json.loads(x) for x in (tmp_path / "rk.jsonl").read_text().splitlines()]
    assert [r["slate_id"] for r in rows] == ["e0", "e1"]


# -- activation ranges -------------------------------------------------------------------------------

def _torch_linear_inputs(ckpt, batch):
    """{module path: [T, C] float32} the decoder nn.Linear inputs of PyTorch's reference on ``batch``'s real
    tokens (pads dropped)."""
    import torch

    from hllm.model.hllm import load_model

    model = load_model(ckpt)
    seen: dict[str, np.ndarray] = {}
    hooks = [mod.register_forward_pre_hook(lambda _m, a, name=name: seen.__setitem__(name, a[0].detach().numpy()))
             for name, mod in model.named_modules()
             if isinstance(mod, torch.nn.Linear) and name.startswith("backbone.layers.")]
    with torch.inference_mode():
        model(*(torch.from_numpy(x) for x in batch.inputs(False).values()))
    for h in hooks:
        h.remove()
    real = np.arange(batch.input_ids.shape[1])[None, :] < batch.lengths[:, None]
    return {k: v[real] for k, v in seen.items()}


def test_activation_ranges_match_numpy_on_pytorch_activations(fused):
    _, ck, ex = fused
    slates = tiny_slates(5, (2, 8), seed=51)
    rep = activation_ranges(ex, slates, batch_size=3)  # two runs, the first one padded
    json.dumps(rep, allow_nan=False)
    batch = _builder(ex).encode(slates)
    ref = _torch_linear_inputs(ck, batch)
    assert rep["slates"] == 5 and rep["tokens"] == int(batch.lengths.sum())
    assert [lay["layer"] for lay in rep["layers"]] == [0, 1]
    covered = []
    for lay in rep["layers"]:
        roles = [[p.rsplit(".", 1)[-1] for p in e["matmuls"]] for e in lay["inputs"]]
        assert roles == [["q_proj", "k_proj", "v_proj"], ["o_proj"], ["gate_proj", "up_proj"], ["down_proj"]]
        for e in lay["inputs"]:
            x = np.abs(ref[e["matmuls"][0]])
            for p in e["matmuls"]:
                assert p.startswith(f"backbone.layers.{lay['layer']}.")
                np.testing.assert_allclose(ref[p], ref[e["matmuls"][0]])  # one tensor feeds them all
            chan = x.max(axis=0)
            assert e["channels"] == x.shape[1] and e["values"] == x.size
            assert e["max_abs"] == pytest.approx(float(x.max()), rel=1e-4)
            assert e["outlier_ratio"] == pytest.approx(float(chan.max() / np.median(chan)), rel=1e-3)
            assert e["channel_absmax_median"] == pytest.approx(float(np.median(chan)), rel=1e-3)
            assert e["p99_9"] == pytest.approx(float(np.percentile(x, 99.9)), rel=2 * RESOLUTION)
            assert e["p99_9"] <= e["max_abs"] and e["top_channels"][0][1] == e["max_abs"]
            covered += e["matmuls"]
    assert sorted(covered) == sorted(ref)  # every decoder projection, nothing else
    worst = max((e for lay in rep["layers"] for e in lay["inputs"]), key=lambda e: e["outlier_ratio"])
    assert rep["worst"]["tensor"] == worst["tensor"]


def test_activation_ranges_script_and_refusals(export_dir, tmp_path):
    import runpy
    import sys

    src = write_jsonl(tmp_path / "pool.jsonl", tiny_slates(10, (2, 8), seed=61))
    argv = sys.argv
    sys.argv = ["activation_ranges.py", str(export_dir), str(src), "--count", "3", "--out", str(tmp_path / "a.json")]
    try:
        with pytest.raises(SystemExit) as e:
            runpy.run_path(str(REPO / "scripts" / "activation_ranges.py"), run_name="__main__")
    finally:
        sys.argv = argv
    assert e.value.code == 0
    rep = json.loads((tmp_path / "a.json").read_text())
    assert rep["draw"]["count"] == 3 and len(rep["draw"]["slate_ids"]) == 3 and len(rep["layers"]) == 2
    tensors = {e["tensor"] for lay in rep["layers"] for e in lay["inputs"]}
    assert set(decoder_matmul_inputs(_load(export_dir))) == tensors
    with pytest.raises(EngineError, match="at least one slate"):
        activation_ranges(export_dir, [])
    with pytest.raises(EngineError, match="percentile"):
        activation_ranges(export_dir, tiny_slates(1, 3), q=100)
