"""bf16 GEMMs with fp32 islands (hllm.exporter.bf16, hllm.calibration.precision_search.bf16_islands): the rounding is
round-to-nearest-even (ties included) in the graph as in NumPy; islands covering the whole graph give the
fp32 scores bit for bit on OpenVINO and on the emulation; without islands every matrix product runs bf16
(OpenVINO's runtime precisions say so) and the scores move; the emulation is the real kernel's twin; the
island search writes a frontier and an islands file that the export builder reads. Tests that need real
bf16 kernels skip, with the reason, on a CPU without AVX512_BF16 / AMX-BF16."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hllm.measure import bf16_support

HAS_BF16, BF16_WHAT = bf16_support()
needs_bf16 = pytest.mark.skipif(not HAS_BF16, reason=f"real bf16 kernels need AVX512_BF16 / AMX-BF16; {BF16_WHAT}")


def _ov_installed() -> bool:
    try:
        import openvino  # noqa: F401
    except ImportError:
        return False
    return True


needs_ov = pytest.mark.skipif(not _ov_installed(), reason="OpenVINO is not installed")


def _setup(export_dir):
    from hllm.runtime.artefact import resolve
    from hllm.runtime.prompt import PromptBuilder, load_tokenizer
    from hllm.testing import tiny_slates

    art = resolve(export_dir)
    b = PromptBuilder(load_tokenizer(art.tokenizer_path), art.prompt, max_items=art.num_positions)
    slates = tiny_slates(3, (5, art.num_positions), seed=11)
    return export_dir, slates, [b.encode([s]) for s in slates]


@pytest.fixture(scope="module")
def setup(standard_export_dir):
    return _setup(standard_export_dir)


@pytest.fixture(scope="module")
def context_setup(tmp_path_factory, context_checkpoint):
    """The standard export of a head that reads the user context (graph input ``context_positions``)."""
    from hllm.exporter.onnx import export_onnx

    out = tmp_path_factory.mktemp("bf16-context") / "export"
    export_onnx(context_checkpoint, out, flavour="standard")
    return _setup(out)


def _ort_fp32(export_dir, batches):
    from hllm.calibration.precision_search.precision_debug import VariantRunner

    r = VariantRunner(export_dir, "fp16", batches, threads=1)
    try:
        return r.reference()
    finally:
        r.close()


def _max(a, b) -> float:
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


def test_round_bf16_is_round_to_nearest_even_and_the_graph_rounds_the_same():
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from hllm.exporter.bf16 import round_then_cast, round_bf16

    # 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even → 1; 1 + 3·2^-8 ties up to 1 + 2^-6 (even)
    x = np.array([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, -(1 + 2**-8), np.inf, -np.inf, 0.0], np.float32)
    assert round_bf16(x).tolist() == [1.0, 1 + 2**-6, 1 + 2**-7, -1.0, np.inf, -np.inf, 0.0]
    assert np.isnan(round_bf16(np.array([np.nan], np.float32)))[0]
    rng = np.random.default_rng(0)
    r = rng.standard_normal(50_000).astype(np.float32) * np.float32(300)
    ties = ((r.view(np.uint32) & np.uint32(0xFFFF0000)) | np.uint32(0x8000)).view(np.float32)
    data = np.concatenate([r, ties, x[:4]])
    nodes = []
    out = round_then_cast(nodes, "x")
    nodes.append(helper.make_node("Cast", [out], ["y"], to=TensorProto.FLOAT))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    onnx.checker.check_model(m)
    got = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": data})[0]
    assert np.array_equal(got, round_bf16(data))
    assert not np.array_equal(got, data)  # it did round


def test_islands_place_matmuls_by_class_and_module(standard_export_dir):
    import onnx

    from hllm.errors import ExportError
    from hllm.exporter.bf16 import convert_to_bf16, parse_islands

    m = onnx.load(str(standard_export_dir / "model.onnx"))
    n_mm = sum(n.op_type == "MatMul" for n in m.graph.node)
    _, none = convert_to_bf16(m, ())
    assert none.bf16_gemms == n_mm and none.fp32_gemms == 0 and none.weights_bf16 > 0
    assert {"q_proj", "k_proj", "v_proj", "o_proj", "attention", "gate_proj", "up_proj", "down_proj", "head"} <= set(none.by_class)
    _, whole = convert_to_bf16(m, ("all",))
    assert whole.bf16_gemms == 0 and whole.fp32_gemms == n_mm
    _, cls = convert_to_bf16(m, ("head", "attention"))
    assert cls.by_class["attention"] == {"bf16": 0, "fp32": none.by_class["attention"]["bf16"]}
    assert cls.by_class["q_proj"]["fp32"] == 0
    _, one = convert_to_bf16(m, ("head", "backbone.layers.0.self_attn.q_proj", "backbone.layers.1"))
    layers = none.by_class["q_proj"]["bf16"]  # one q_proj per decoder layer
    assert one.by_class["q_proj"] == {"bf16": layers - 2, "fp32": 2}
    assert one.by_class["down_proj"] == {"bf16": layers - 1, "fp32": 1}
    typed, rep = convert_to_bf16(m, ("head",))
    velt = sum(n.name.startswith("hllm_bf16_") and n.op_type == "Mul" for n in typed.graph.node)
    assert velt == rep.roundings_inserted > 0  # one exact rounding per activation that is not bf16-valued yet
    assert rep.roundings_inserted < rep.casts_inserted - rep.bf16_gemms  # bf16-valued inputs skip it (V, o_proj input)
    with pytest.raises(ExportError, match="unknown bf16 FP32 island"):
        parse_islands("q_proj,softmaxx")
    assert parse_islands("default,attention") == ("head", "attention") and parse_islands("none") == ()


def test_flop_shares_sum_to_one(setup):
    import onnx

    from hllm.exporter.bf16 import flop_shares, fp32_share

    export_dir, _, batches = setup
    m = onnx.load(str(export_dir / "model.onnx"))
    b = batches[0]
    feeds = {"input_ids": b.input_ids, "readout_positions": b.readout_positions, "item_mask": b.item_mask}
    sh = flop_shares(m, feeds)
    assert abs(sum(sh.values()) - 1) < 1e-9 and sh["q_proj"] > 0 and sh["attention"] > 0
    assert fp32_share(m, feeds, ["all"]) == pytest.approx(1.0)
    assert fp32_share(m, feeds, ["head"]) == pytest.approx(sh["head"])
    assert fp32_share(m, feeds, []) == 0.0


def test_full_islands_give_fp32_scores_on_the_emulation(setup):
    from hllm.calibration.precision_search.bf16_islands import Bf16Variants

    export_dir, _, batches = setup
    ref = _ort_fp32(export_dir, batches)
    v = Bf16Variants(export_dir, batches, "emulate", threads=1)
    try:
        whole, none = v(("all",)), v(())
    finally:
        v.close()
    assert _max(whole, ref) == 0.0  # every MatMul in an island: the fp32 graph itself
    assert _max(none, ref) > 1e-4  # no island: bf16 rounding moves the scores


@needs_ov
@needs_bf16
def test_openvino_honours_islands_full_islands_are_fp32_bit_for_bit(setup):
    from hllm.calibration.precision_search.bf16_islands import Bf16Variants
    from hllm.engines.openvino import OpenVinoEngine
    from hllm.exporter.bf16 import runtime_precisions

    export_dir, _, batches = setup
    v = Bf16Variants(export_dir, batches, "openvino", threads=1)
    try:
        f32 = v._scores(OpenVinoEngine(v.meta.onnx_path, v.meta.num_positions, threads=1, inference_precision="f32",
                                       flavour="standard"))
        whole, none = v(("all",)), v(())
        eng = v.engine(())
        with eng:
            rt_none = runtime_precisions(eng._compiled)
        eng = v.engine(("all",))
        with eng:
            rt_all = runtime_precisions(eng._compiled)
    finally:
        v.close()
    assert _max(whole, f32) == 0.0
    assert _max(none, f32) > 1e-4
    gemm = lambda rt, p: sum(n for k, n in rt.items() if k.split(":")[0] in ("FullyConnected", "MatMul") and k.endswith(p))  # noqa: E731
    assert gemm(rt_none, ":bf16") > 0 and gemm(rt_none, ":f32") == 0  # every matrix product runs bf16
    assert gemm(rt_all, ":bf16") == 0 and gemm(rt_all, ":f32") > 0


@needs_ov
@needs_bf16
def test_emulation_is_the_twin_of_real_bf16(setup):
    from hllm.calibration.precision_search.bf16_islands import Bf16Variants

    export_dir, _, batches = setup
    ref = _ort_fp32(export_dir, batches)
    real, emu = Bf16Variants(export_dir, batches, "openvino", threads=1), Bf16Variants(export_dir, batches, "emulate", threads=1)
    try:
        a, e = real(("head",)), emu(("head",))
    finally:
        real.close(), emu.close()
    # summation order is all that differs: far closer to each other than either is to fp32
    assert _max(a, e) < 0.5 * _max(a, ref) and _max(e, ref) > 1e-4


def test_runner_choice_and_refusal(monkeypatch):
    from hllm import measure
    from hllm.calibration.precision_search.bf16_islands import bf16_runner
    from hllm.errors import EngineError

    monkeypatch.setattr(measure, "cpu_flags", lambda: ["avx2", "avx512f"])
    assert bf16_runner("auto") == "emulate" and bf16_runner("emulate") == "emulate"
    with pytest.raises(EngineError, match="AVX512_BF16 or AMX-BF16"):
        bf16_runner("openvino")
    with pytest.raises(EngineError, match="unknown bf16 runner"):
        bf16_runner("gpu")


def test_bf16_export_is_refused_without_bf16_and_runs_with_it(setup, tmp_path, monkeypatch):
    from hllm import measure
    from hllm.calibration.precision_search.bf16_islands import build_bf16_export
    from hllm.errors import EngineError
    from hllm.formats.export import read_export
    from hllm.runtime.artefact import open_engine, resolve

    export_dir, _, batches = setup
    rec = build_bf16_export(export_dir, tmp_path / "bf16", ["head", "attention"])
    meta = read_export(tmp_path / "bf16", verify_hash=True)
    assert meta.precision.value == "bf16" and meta.engine == "openvino"
    assert meta.raw["openvino"] == {"inference_precision": "f32"} and rec["islands"] == ["head", "attention"]
    assert rec["report"]["by_class"]["attention"]["bf16"] == 0 and rec["report"]["by_class"]["q_proj"]["fp32"] == 0
    with pytest.raises(FileExistsError):
        build_bf16_export(export_dir, tmp_path / "bf16")
    if _ov_installed():
        real = measure.cpu_flags
        monkeypatch.setattr(measure, "cpu_flags", lambda: ["avx2", "avx512f"])
        with pytest.raises(EngineError, match="AVX512_BF16 or AMX-BF16"):
            open_engine(resolve(tmp_path / "bf16"))
        monkeypatch.setattr(measure, "cpu_flags", real)
        if HAS_BF16:
            b = batches[0]
            with open_engine(resolve(tmp_path / "bf16"), threads=1) as eng:
                s = eng.run(b.input_ids, b.readout_positions, b.item_mask, b.context_positions)
            assert eng.name == "openvino" and np.isfinite(s).all()


def test_search_writes_frontier_and_islands_file(setup, tmp_path):
    from hllm.calibration.precision_search.bf16_islands import build_bf16_export, read_islands
    from hllm.cli.app import run

    export_dir, slates, _ = setup
    src = tmp_path / "s.jsonl"
    src.write_text("".join(json.dumps(s) + "\n" for s in slates[:2]))
    out, rep = tmp_path / "islands.json", tmp_path / "report.json"
    assert run(["debug", "precision", str(export_dir), "--precision", "bf16", "--bf16-runner", "emulate", "-s", str(src),
                "-o", str(out), "--report", str(rep), "--groups", "2", "--refine", "1", "--threads", "1"]) == 0
    doc = json.loads(out.read_text())
    assert doc["target"] == "bf16" and doc["runner"] == "emulate" and "head" in doc["islands"]
    front = doc["frontier"]
    names = [p["name"] for p in front]
    assert "baseline (head, attention fp32)" in names and "q_proj fp32" in names and "layers 0-0 fp32" in names
    assert "attention bf16 too (outside the search base)" in names and doc["base"] == ["head", "attention"]
    assert all(set(doc["base"]) <= set(p["islands"]) for p in front if not p["outside_base"])
    assert [p["fp32_share"] for p in front] == sorted(p["fp32_share"] for p in front)
    assert all(0.0 <= p["fp32_share"] <= 1.0 for p in front) and any(p["pareto"] for p in front)
    chosen = next(p for p in front if p["name"] == doc["chosen"])
    assert not chosen["outside_base"]
    assert chosen["islands"] == doc["islands"] and chosen["passes"] == doc["passed"]
    if doc["passed"]:  # the cheapest passing set
        assert chosen["fp32_share"] == min(p["fp32_share"] for p in front if p["passes"] and not p["outside_base"])
    assert read_islands(out) == tuple(doc["islands"])
    rec = build_bf16_export(export_dir, tmp_path / "exp", read_islands(out))
    assert rec["islands"] == doc["islands"]
    bad = tmp_path / "fp16.json"
    bad.write_text(json.dumps({"format": "hllm-fp32-islands", "target": "fp16", "islands": ["rmsnorm"]}))
    from hllm.errors import EngineError

    with pytest.raises(EngineError, match="not a bf16 islands file"):
        read_islands(bad)


def test_select_candidate_reads_the_islands_file(standard_export_dir, tmp_path):
    from hllm.calibration.precision_search.bf16_islands import RECIPE_ISLANDS
    from hllm.calibration.recipes.recipe import RecipeInputs
    from hllm.calibration.recipes.table import RECIPES
    from hllm.errors import EngineError

    c = next(c for c in RECIPES if c.name == "openvino-bf16-islands")
    assert "AVX512_BF16" in c.refusal("standard", ["avx2", "avx512f"], False, True)
    assert "flavour standard" in c.refusal("ort-cpu", ["avx512_bf16"], False, True)
    assert c.refusal("standard", ["avx512_bf16"], False, True) is None
    c.build(standard_export_dir, tmp_path / "default")
    side = json.loads((tmp_path / "default" / "export.json").read_text())
    assert side["bf16_gemm"]["islands"] == list(RECIPE_ISLANDS) and side["precision"] == "bf16"
    by_class = side["bf16_gemm"]["report"]["by_class"]  # the attention in fp32, the MLP in bf16
    assert all(by_class[k]["bf16"] == 0 for k in ("q_proj", "k_proj", "v_proj", "o_proj", "attention"))
    assert all(by_class[k]["fp32"] == 0 and by_class[k]["bf16"] > 0 for k in ("gate_proj", "up_proj", "down_proj"))
    f = tmp_path / "islands.json"
    f.write_text(json.dumps({"format": "hllm-fp32-islands", "target": "bf16", "islands": ["head", "down_proj"]}))
    c.build(standard_export_dir, tmp_path / "file", RecipeInputs(bf16_islands=f))
    rep = json.loads((tmp_path / "file" / "export.json").read_text())["bf16_gemm"]["report"]
    assert rep["by_class"]["down_proj"]["bf16"] == 0 and rep["by_class"]["attention"]["fp32"] == 0
    f.write_text(json.dumps({"format": "hllm-fp32-islands", "target": "bf16", "islands": ["head", "mlpp"]}))
    with pytest.raises(EngineError, match="unknown bf16 FP32 island"):
        c.build(standard_export_dir, tmp_path / "bad", RecipeInputs(bf16_islands=f))


def test_context_head_full_islands_give_fp32_and_no_islands_move_the_scores(context_setup):
    """The bf16 rewrite keeps the fourth graph input: with a context-reading head, every MatMul in an island
    is the fp32 graph exactly, and bf16 everywhere changes the scores (so the user row reaches the head)."""
    from hllm.calibration.precision_search.bf16_islands import Bf16Variants

    export_dir, _, batches = context_setup
    assert all(b.context_positions is not None for b in batches)
    ref = _ort_fp32(export_dir, batches)
    v = Bf16Variants(export_dir, batches, "emulate", threads=1)
    try:
        whole, none, head_only = v(("all",)), v(()), v(("head",))
    finally:
        v.close()
    assert _max(whole, ref) == 0.0
    assert _max(none, ref) > 1e-4
    assert _max(head_only, ref) > 0.0 and all(np.isfinite(x).all() for x in head_only)
