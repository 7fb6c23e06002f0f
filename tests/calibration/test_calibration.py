"""Calibration data, INT8 quantization with excluded parts, the ranking-fidelity gate, fp8 refusal."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from hllm.calibration.data import build_calibration_set, choose_slates
from hllm.formats.calibration_set import load_calibration_set
from hllm.verify.gate import check_disjoint
from hllm.verify.gate import GateThresholds, gate_scores, label_metrics
from hllm.verify.reference import reference_scores
from hllm.verify.sequential import run_gate
from hllm.calibration.recipes.modelopt_ptq import modelopt_available
from hllm.calibration.recipes.options import QuantOptions, check_target
from hllm.calibration.recipes.parts import nodes_in_part, quantized_nodes, sensitivity_ladder
from hllm.calibration.recipes.quantize import quantize_export
from hllm.exporter.scopes import module_path
from hllm.cli import main
from hllm.errors import EngineError, SlateError
from hllm.runtime import Ranker, write_jsonl
from hllm.runtime.artefact import resolve
from hllm.runtime.prompt import PromptBuilder, load_tokenizer
from hllm.testing import tiny_slates


def _ids(slates, prefix):
    return [dict(s, slate_id=f"{prefix}-{s['slate_id']}") for s in slates]


@pytest.fixture(scope="module")
def train_slates():
    return _ids(tiny_slates(64, (2, 8), seed=11), "train")


@pytest.fixture(scope="module")
def eval_slates():
    return _ids(tiny_slates(60, (2, 8), seed=12), "eval")


@pytest.fixture(scope="module")
def builder(export_dir):
    art = resolve(export_dir)
    return PromptBuilder(load_tokenizer(art.tokenizer_path), art.prompt, max_items=art.num_positions)


@pytest.fixture(scope="module")
def calib(train_slates, builder):
    return build_calibration_set(train_slates, builder, count=32, seed=0)


@pytest.fixture(scope="module")
def ref_scores(export_dir, eval_slates):
    return reference_scores(export_dir, eval_slates)


# -- calibration data ---------------------------------------------------------------------------

def test_calibration_set_is_deterministic_for_a_seed(train_slates, builder, tmp_path):
    a = build_calibration_set(train_slates, builder, count=8, seed=5, batch_size=3)
    b = build_calibration_set(train_slates, builder, count=8, seed=5, batch_size=3)
    c = build_calibration_set(train_slates, builder, count=8, seed=6, batch_size=3)
    assert a.slate_ids == b.slate_ids and len(set(a.slate_ids)) == 8
    assert a.data_sha256() == b.data_sha256()
    assert a.slate_ids != c.slate_ids and a.data_sha256() != c.data_sha256()
    assert [x["batch"] for x in a.meta["shapes"]] == [3, 3, 2]
    # the arrays are exactly what the runtime's prompt builder makes of those slates
    by_id = {s["slate_id"]: s for s in train_slates}
    enc = builder.encode([by_id[i] for i in a.slate_ids[:3]])
    np.testing.assert_array_equal(a.batches[0]["input_ids"], enc.input_ids)
    np.testing.assert_array_equal(a.batches[0]["readout_positions"], enc.readout_positions)
    np.testing.assert_array_equal(a.batches[0]["item_mask"], enc.item_mask)
    # saved → loaded gives the same arrays and record
    npz, js = a.save(tmp_path / "cal")
    back = load_calibration_set(tmp_path / "cal.npz")
    assert back.slate_ids == a.slate_ids and back.data_sha256() == a.data_sha256()
    assert json.loads(js.read_text())["seed"] == 5
    for x, y in zip(a.batches, back.batches):
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])
            assert x[k].dtype == y[k].dtype


def test_calibration_set_tamper_and_bad_counts(train_slates, builder, tmp_path):
    a = build_calibration_set(train_slates, builder, count=4, seed=0)
    a.save(tmp_path / "cal")
    meta = json.loads((tmp_path / "cal.json").read_text())
    meta["data_sha256"] = "0" * 64
    (tmp_path / "cal.json").write_text(json.dumps(meta))
    with pytest.raises(SlateError, match="data_sha256"):
        load_calibration_set(tmp_path / "cal")
    with pytest.raises(SlateError, match="eligible"):
        choose_slates(train_slates, 65, 0)
    with pytest.raises(SlateError, match="≥ 1"):
        choose_slates(train_slates, 0, 0)


def test_calibration_never_draws_excluded_and_gate_refuses_overlap(train_slates, builder, export_dir, ref_scores,
                                                                   eval_slates):
    banned = [s["slate_id"] for s in train_slates[:60]]
    a = build_calibration_set(train_slates, builder, count=4, seed=0, exclude_ids=banned)
    assert sorted(a.slate_ids) == sorted(s["slate_id"] for s in train_slates[60:])
    check_disjoint(a.slate_ids, eval_slates)  # disjoint: no error
    with pytest.raises(SlateError, match="used for calibration"):
        check_disjoint(a.slate_ids + [eval_slates[3]["slate_id"]], eval_slates)
    with pytest.raises(SlateError, match="used for calibration"):
        run_gate(ref_scores, export_dir, eval_slates, calibration_ids=[eval_slates[0]["slate_id"]])


# -- where Q/DQ nodes go ----------------------------------------------------------------------------

def _dq_fed_matmuls(model):
    return {n.name for n in model.graph.node if n.name in set(quantized_nodes(model))}


def test_static_int8_qdq_only_outside_excluded_parts(export_dir, calib, tmp_path):
    res = quantize_export(export_dir, tmp_path / "q", QuantOptions(exclude=("head", "first")), calib)
    src = onnx.load(str(export_dir / "model.onnx"), load_external_data=False)
    q = onnx.load(str(tmp_path / "q" / "model.onnx"), load_external_data=False)
    inits = {i.name for i in src.graph.initializer}
    weight_matmuls = {n.name: module_path(n) for n in src.graph.node
                      if n.op_type == "MatMul" and any(i in inits for i in n.input)}
    head = set(nodes_in_part(src, "head"))
    block0 = set(nodes_in_part(src, "first"))
    quantized = set(quantized_nodes(q))
    expected = {n for n in weight_matmuls if n not in head and n not in block0}
    assert expected and quantized == expected  # every weight MatMul of block 1, none of head / block 0
    assert all(weight_matmuls[n].startswith("backbone.layers.1.") for n in quantized)
    assert not any(n.op_type == "DequantizeLinear" and any(c in head for c in _consumers(q, n)) for n in q.graph.node)
    ops = {n.op_type for n in q.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    side = json.loads((tmp_path / "q" / "export.json").read_text())
    assert side["precision"] == "int8" and side["quantization"]["excluded_parts"] == ["head", "first"]
    assert set(side["quantization"]["excluded_nodes"]) == set(res.excluded_nodes) >= head | block0
    assert side["quantization"]["calibration"]["data_sha256"] == calib.data_sha256()
    # the quantized export is a normal artefact for the runtime
    rk = Ranker.from_path(tmp_path / "q").rank(tiny_slates(2, 4, seed=1))
    assert [sorted(r.order) for r in rk] == [[0, 1, 2, 3]] * 2


def _consumers(model, node):
    outs = set(node.output)
    return [n.name for n in model.graph.node if outs & set(n.input)]


def test_dynamic_int8_keeps_excluded_head_float(export_dir, tmp_path):
    quantize_export(export_dir, tmp_path / "d", QuantOptions(backend="ort-dynamic", exclude=("head",)))
    src = onnx.load(str(export_dir / "model.onnx"), load_external_data=False)
    q = onnx.load(str(tmp_path / "d" / "model.onnx"), load_external_data=False)
    head_mm = {n for n in nodes_in_part(src, "head") if any(m.name == n and m.op_type == "MatMul" for m in src.graph.node)}
    q_by_name = {n.name: n for n in q.graph.node}
    assert head_mm and all(q_by_name[n].op_type == "MatMul" for n in head_mm)
    assert any(n.op_type == "MatMulInteger" for n in q.graph.node)
    assert len(quantized_nodes(q)) == 14  # 7 weight projections × 2 decoder blocks


def test_weight_only_int8_matmulnbits_outside_head_and_close_to_fp32(export_dir, eval_slates, ref_scores, tmp_path):
    res = quantize_export(export_dir, tmp_path / "w", QuantOptions(backend="ort-weight-only", exclude=("head",)))
    src = onnx.load(str(export_dir / "model.onnx"), load_external_data=False)
    q = onnx.load(str(tmp_path / "w" / "model.onnx"))
    nbits = [n for n in q.graph.node if n.op_type == "MatMulNBits"]
    assert len(nbits) == len(quantized_nodes(q)) == res.summary["quantized_nodes"] == 14  # 7 projections × 2 blocks
    assert all({a.name: a.i for a in n.attribute}["bits"] == 8 and {a.name: a.i for a in n.attribute}["block_size"] == 32
               for n in nbits)
    inits = {i.name: i for i in q.graph.initializer}
    assert all(inits[n.input[1]].data_type == onnx.TensorProto.UINT8 for n in nbits)  # packed 8-bit weights
    q_by_name = {n.name: n for n in q.graph.node}
    head_mm = [n for n in nodes_in_part(src, "head") if n in q_by_name and q_by_name[n].op_type == "MatMul"]
    assert head_mm  # the head's projections stayed float MatMuls
    gate = run_gate(ref_scores, tmp_path / "w", eval_slates)
    d = gate.to_dict()
    assert 0 < d["max_abs_diff"] < 0.05 and gate.passed, d  # rounding of the weights only
    for bad in (24, 512):  # MatMulNBits blocks: 16 … 256, powers of two
        with pytest.raises(EngineError, match="block_size"):
            QuantOptions(backend="ort-weight-only", block_size=bad).validate()
    with pytest.raises(EngineError, match="MatMul"):
        QuantOptions(backend="ort-weight-only", op_types=("Gemm",)).validate()


def test_parts_resolve_and_typos_fail(export_dir):
    m = onnx.load(str(export_dir / "model.onnx"), load_external_data=False)
    last = nodes_in_part(m, "last")
    assert last == nodes_in_part(m, "block:1") and set(last).isdisjoint(nodes_in_part(m, "first"))
    assert all(module_path(n).startswith("backbone.layers.1") for n in m.graph.node if n.name in set(last))
    assert set(nodes_in_part(m, "backbone.layers.0.mlp")) < set(nodes_in_part(m, "first"))
    with pytest.raises(EngineError, match="matches no node"):
        nodes_in_part(m, "backbone.layers.7")
    with pytest.raises(EngineError, match="2 blocks"):
        nodes_in_part(m, "block:5")


def test_sensitivity_ladder(export_dir):
    m = onnx.load(str(export_dir / "model.onnx"), load_external_data=False)
    assert sensitivity_ladder(m) == ["head", "block:1", "block:0"]
    # with calibration ranges, the block whose MatMul inputs reach the largest magnitude comes first
    mm0 = next(n for n in m.graph.node if n.op_type == "MatMul" and module_path(n).startswith("backbone.layers.0"))
    assert sensitivity_ladder(m, {mm0.input[0]: 1e4}) == ["head", "block:0", "block:1"]


# -- the gate ---------------------------------------------------------------------------------------

def test_gate_thresholds_out_of_range_are_refused():
    for kw in ({"min_top1": 1.5}, {"min_top1": -0.1}, {"max_recall10_delta": -0.01}, {"min_tau": 2.0}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            GateThresholds(**kw)
    assert GateThresholds(min_top1=1.0, min_tau=-1.0).min_top1 == 1.0


def test_label_metrics_by_hand():
    one = [{"labels": [0, 0, 0, 1]}]
    assert label_metrics([[3, 1, 2, 0]], one)["recall@1"] == 1.0
    assert label_metrics([[1, 3, 2, 0]], one)["recall@1"] == 0.0
    assert label_metrics([[1, 3, 2, 0]], one)["ndcg@10"] == pytest.approx(1 / np.log2(3))
    assert label_metrics([[1, 3, 2, 0]], [{"labels": [0, 0, 0, 0]}]) is None
    slates = [{"slate_id": "a", "labels": [1, 0, 0]}, {"slate_id": "b", "labels": [0, 0, 1]}]
    ref = [np.eye(3, dtype=np.float32), np.eye(3, dtype=np.float32)]  # ranks item 0 first
    same = gate_scores(ref, [r.copy() for r in ref], slates)
    assert same.passed and same.to_dict()["top1_agreement"] == 1.0 and same.recall10_delta == 0.0
    flipped = [np.eye(3, dtype=np.float32)[[2, 1, 0]]] * 2  # ranks item 2 first
    rep = gate_scores(ref, flipped, slates, GateThresholds(min_top1=0.5))
    d = rep.to_dict()
    assert d["top1_agreement"] == 0.0 and d["reference_metrics"]["recall@1"] == 0.5
    assert d["quantized_metrics"]["recall@1"] == 0.5 and not rep.passed
    bad = [ref[0], np.full((3, 3), np.nan, dtype=np.float32)]
    d = gate_scores(ref, bad, slates).to_dict()
    assert not d["passed"] and d["nonfinite"] == 9 and d["max_abs_diff"] is None  # JSON-safe
    json.dumps(d, allow_nan=False)


def test_gate_fails_broken_quantization_and_passes_good_one(export_dir, train_slates, builder, calib, eval_slates,
                                                            ref_scores, tmp_path):
    # broken: everything quantized (the head too) with ranges from ONE calibration slate
    tiny_calib = build_calibration_set(train_slates, builder, count=1, seed=0)
    quantize_export(export_dir, tmp_path / "bad", QuantOptions(), tiny_calib)
    bad = run_gate(ref_scores, tmp_path / "bad", eval_slates, calibration_ids=tiny_calib.slate_ids)
    d = bad.to_dict()
    assert not bad.passed and not d["strict_passed"]
    assert {"kendall_tau_mean", "regret_p95"} & {f.criterion for f in bad.failures()}
    assert d["top1_agreement"] < 0.97
    # good: the decoder MLPs quantized (32 calibration slates), head and attention kept in float
    quantize_export(export_dir, tmp_path / "good", QuantOptions(exclude=("head", "attention")), calib)
    good = run_gate(ref_scores, tmp_path / "good", eval_slates, calibration_ids=calib.slate_ids)
    d = good.to_dict()
    assert good.passed, d["failures"]
    assert d["top1_agreement"] >= 0.97 and abs(d["recall@10_delta"]) <= 0.01 and d["max_abs_diff"] > 0


def _run(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    cap = capsys.readouterr()
    return e.value.code, cap.out, cap.err


def test_cli_failed_gate_exits_1_and_writes_only_failed_name(export_dir, train_slates, eval_slates, tmp_path, capsys):
    tr = write_jsonl(tmp_path / "train.jsonl", train_slates)
    ev = write_jsonl(tmp_path / "eval.jsonl", eval_slates)
    out = tmp_path / "int8"
    code, _, err = _run(["calibrate", str(export_dir), "-o", str(out), "--calib-slates", str(tr), "--calib-count", "1",
                         "--eval-slates", str(ev), "--report", str(tmp_path / "r.json")], capsys)
    assert code == 1, err
    assert not out.exists() and (tmp_path / "int8.FAILED" / "model.onnx").is_file()
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["passed"] is False and r["precision"] == "int8" and r["top1_agreement"] < 0.97
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left behind
    code, _, err = _run(["calibrate", str(export_dir), "-o", str(out), "--calib-slates", str(tr), "--calib-count", "16",
                         "--eval-slates", str(ev), "-x", "head", "-x", "attention", "--report", str(tmp_path / "r.json")],
                        capsys)
    assert code == 0, err
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["passed"] is True and r["excluded_parts"] == ["head", "attention"]
    assert json.loads((out / "export.json").read_text())["precision"] == "int8"
    saved = load_calibration_set(out / "calibration")
    assert len(saved.slate_ids) == 16 and not set(saved.slate_ids) & {s["slate_id"] for s in eval_slates}


def test_cli_auto_mode_with_nothing_left_to_quantize_exits_2(export_dir, eval_slates, tmp_path, capsys):
    ev = write_jsonl(tmp_path / "eval.jsonl", eval_slates[:4])
    code, _, err = _run(["calibrate", str(export_dir), "-o", str(tmp_path / "n"), "--backend", "ort-dynamic",
                         "--eval-slates", str(ev), "-x", "head", "-x", "block:0", "-x", "block:1", "--auto"], capsys)
    assert code == 2 and "nothing to quantize" in err.lower() and "Traceback" not in err
    assert not list(tmp_path.glob("n*")) and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_cli_auto_mode_reports_exclusions(export_dir, train_slates, eval_slates, tmp_path, capsys):
    tr = write_jsonl(tmp_path / "train.jsonl", train_slates)
    ev = write_jsonl(tmp_path / "eval.jsonl", eval_slates)
    code, _, err = _run(["calibrate", str(export_dir), "-o", str(tmp_path / "a"), "--calib-slates", str(tr),
                         "--calib-count", "1", "--eval-slates", str(ev), "--auto",
                         "--report", str(tmp_path / "a.json")], capsys)
    r = json.loads((tmp_path / "a.json").read_text())
    tries = r["auto"]["tries"]
    # ranges from one calibration slate break the full INT8 graph, so parts get excluded one by one
    assert tries[0]["excluded"] == [] and not tries[0]["passed"] and len(tries) >= 2
    assert r["auto"]["ladder"] == ["head", "block:0", "block:1"] or r["auto"]["ladder"] == ["head", "block:1", "block:0"]
    assert [t["excluded"] for t in tries[1:]] == [r["auto"]["ladder"][: i + 1] for i in range(len(tries) - 1)]
    assert code == (0 if r["passed"] else 1)
    evaluated = [t for t in tries if not t.get("stop")]
    want = next((t for t in tries if t["passed"]), evaluated[-1])
    assert r["excluded_parts"] == want["excluded"] and r["top1_agreement"] == want["top1_agreement"]
    assert (tmp_path / ("a" if r["passed"] else "a.FAILED") / "model.onnx").is_file()


# -- targets and ModelOpt ------------------------------------------------------------------------

def test_fp8_refused_for_a100(tmp_path, capsys):
    for t in ("a100", "8.0", "sm80"):
        with pytest.raises(EngineError, match="compute capability 8.0"):
            check_target("fp8", t)
    check_target("fp8", "h100")
    check_target("fp8", "l4")
    check_target("int8", "a100")
    with pytest.raises(EngineError, match="--backend modelopt"):
        QuantOptions(backend="ort-static", precision="fp8", target="h100").validate()
    # the command refuses before reading anything (the export path does not even exist)
    code, _, err = _run(["calibrate", str(tmp_path / "nope"), "-o", str(tmp_path / "x"), "--backend", "modelopt",
                         "--precision", "fp8", "--target", "a100"], capsys)
    assert code == 2 and "fp8 is not supported on target a100" in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()


@pytest.mark.skipif(modelopt_available(), reason="checks the message shown when ModelOpt is missing")
def test_modelopt_missing_names_the_extra(standard_export_dir, calib, tmp_path):
    with pytest.raises(EngineError, match=r"hllm\[modelopt\]"):
        quantize_export(standard_export_dir, tmp_path / "m", QuantOptions(backend="modelopt", target="a100"), calib)
    assert not (tmp_path / "m").exists()


@pytest.mark.skipif(not modelopt_available(), reason="nvidia-modelopt[onnx] is not installed (hllm[modelopt] extra)")
def test_modelopt_int8_qdq_runs_in_onnxruntime(standard_export_dir, calib, eval_slates, ref_scores, tmp_path):
    opts = QuantOptions(backend="modelopt", target="a100", exclude=("head",))
    quantize_export(standard_export_dir, tmp_path / "m", opts, calib)
    q = onnx.load(str(tmp_path / "m" / "model.onnx"), load_external_data=False)
    src = onnx.load(str(standard_export_dir / "model.onnx"), load_external_data=False)
    head = set(nodes_in_part(src, "head"))
    quantized = set(quantized_nodes(q))
    assert quantized and not quantized & head
    rep = run_gate(ref_scores, tmp_path / "m", eval_slates, GateThresholds(min_top1=0.0, max_recall10_delta=1.0))
    assert rep.to_dict()["nonfinite"] == 0


@pytest.mark.skipif(not modelopt_available(), reason="nvidia-modelopt[onnx] is not installed (hllm[modelopt] extra)")
def test_modelopt_fp8_qdq_for_hopper_runs_in_onnxruntime_cpu(standard_export_dir, calib, eval_slates, ref_scores,
                                                             tmp_path):
    opts = QuantOptions(backend="modelopt", precision="fp8", target="h100")
    quantize_export(standard_export_dir, tmp_path / "f", opts, calib)
    q = onnx.load(str(tmp_path / "f" / "model.onnx"), load_external_data=False)
    fp8 = onnx.TensorProto.FLOAT8E4M3FN
    assert any(i.data_type == fp8 for i in q.graph.initializer) or any(
        a.name == "to" and a.i == fp8 for n in q.graph.node for a in n.attribute)
    rep = run_gate(ref_scores, tmp_path / "f", eval_slates, GateThresholds(min_top1=0.0, max_recall10_delta=1.0))
    assert rep.to_dict()["precision"] == "fp8" and rep.to_dict()["nonfinite"] == 0
