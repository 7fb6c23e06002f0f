"""The mixed OpenVINO recipes: ``openvino-int8-mlp`` (INT8 MLP products with dynamic activation quantization, fp32
attention and head, bf16 / fp32 elsewhere) and ``openvino-int8-search`` (the most sensitive layers' MLPs kept in
float by a bounded search on validation slates)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("openvino")
pytest.importorskip("nncf")

from hllm.calibration.recipes.int8_search import k_schedule  # noqa: E402
from hllm.calibration.recipes.recipe import RecipeInputs  # noqa: E402
from hllm.calibration.recipes.table import RECIPES  # noqa: E402
from hllm.errors import EngineError, ExportError, HllmError  # noqa: E402
from hllm.measure import bf16_support, int8_dot_support  # noqa: E402
from hllm.testing import tiny_slates  # noqa: E402

BY_NAME = {r.name: r for r in RECIPES}
NO_BF16 = pytest.mark.skipif(not bf16_support()[0], reason="the CPU has no AVX512_BF16 / AMX-BF16")


def _matmul_sites(export):
    """{ONNX MatMul node name: module path} of the export's weight matrix products."""
    from hllm.calibration.recipes.parts import weight_matmuls
    from hllm.exporter.bf16 import node_site
    from hllm.exporter.onnx_io import load_onnx

    return {n.name: node_site(n)[1] for n in weight_matmuls(load_onnx(export / "model.onnx"))}


def _scores_close_to_fp32(built, export):
    from hllm.verify.reference import cpu_ranker, ranker_scores

    slates = tiny_slates(3, (3, 6), seed=5)
    got, ref = ranker_scores(cpu_ranker(built, 1), slates), ranker_scores(cpu_ranker(export, 1), slates)
    assert all(np.isfinite(m).all() for m in got) and [m.shape for m in got] == [m.shape for m in ref]
    err = max(float(np.abs(a - b).max()) for a, b in zip(got, ref))
    assert 0 < err < 0.5 * max(float(np.abs(b).max()) for b in ref)  # rounded somewhere, scale kept


def _int8_in_ir(path):
    import openvino as ov

    from hllm.calibration.recipes.openvino_mixed import IR_NAME, compressed_matmuls

    return set(compressed_matmuls(ov.Core().read_model(str(path / IR_NAME))))


@pytest.mark.parametrize("name", [pytest.param("openvino-int8-mlp", marks=NO_BF16), "openvino-int8-mlp-fp32"])
def test_mixed_recipe_quantizes_the_mlp_products_and_no_attention_one(standard_export_dir, tmp_path, name):
    from hllm.runtime.artefact import open_engine, resolve

    meta = BY_NAME[name].build(standard_export_dir, tmp_path / "m")
    q = meta.raw["quantization"]
    sites = _matmul_sites(standard_export_dir)
    mlp = {n for n, p in sites.items() if ".mlp." in p}
    assert len(mlp) == 6 and (meta.engine, str(meta.precision), meta.openvino.inference_precision) == ("openvino", "int8", "f32")
    assert q["int8_matmuls"] == 6 and set(q["int8_nodes"]) == mlp and q["bf16_matmuls"] == 0
    assert q["float_precision"] == BY_NAME[name].settings["float_precision"] and q["int8_parts"] == ["mlp"]
    # the saved graph: 8-bit weights under exactly the MLP products, none under q/k/v/o or the head
    got = _int8_in_ir(tmp_path / "m")
    assert got == mlp and not any(".self_attn" in sites[n] or sites[n].startswith("head") for n in got)
    dq = q["dynamic_quantization"]
    assert dq["group_size"] == 32 and isinstance(dq["effective_group_size"], int)
    if int8_dot_support()[0] and dq["effective_group_size"]:
        assert q["runtime_int8_gemms"] == 6  # the compiled model runs the 6 MLP products, and only them, on int8
    with open_engine(resolve(tmp_path / "m"), threads=1) as e:
        assert e.compiled_property("DYNAMIC_QUANTIZATION_GROUP_SIZE") == dq["effective_group_size"]
    _scores_close_to_fp32(tmp_path / "m", standard_export_dir)


@pytest.mark.parametrize(("name", "float_gemms"), [pytest.param("openvino-int8-mlp", "bf16_matmuls", marks=NO_BF16),
                                                   ("openvino-int8-mlp-fp32", "fp32_matmuls")])
def test_a_kept_layer_runs_in_the_float_precision(standard_export_dir, tmp_path, name, float_gemms):
    base = BY_NAME[name].build(standard_export_dir, tmp_path / "all").raw["quantization"]
    meta = BY_NAME[name].build(standard_export_dir, tmp_path / "m", RecipeInputs(keep_float=("backbone.layers.1.mlp",)))
    q = meta.raw["quantization"]
    sites = _matmul_sites(standard_export_dir)
    layer0 = {n for n, p in sites.items() if p.startswith("backbone.layers.0.mlp.")}
    assert q["keep"] == ["backbone.layers.1.mlp"] and set(q["int8_nodes"]) == layer0 == _int8_in_ir(tmp_path / "m")
    assert q[float_gemms] == base[float_gemms] + 3  # layer 1's gate / up / down moved from INT8 to the float precision


def test_a_scope_or_island_that_matches_nothing_is_refused(standard_export_dir, tmp_path):
    from hllm.calibration.recipes.openvino_mixed import build_mixed_export

    def build(**kw):
        build_mixed_export(standard_export_dir, tmp_path / "x", float_precision="fp32", **kw)

    with pytest.raises(EngineError, match="'backbone.layers.9.mlp' matches no node"):
        build(int8=("backbone.layers.9.mlp",))
    with pytest.raises(EngineError, match="'norms' holds no weight matrix product"):
        build(int8=("norms",))
    with pytest.raises(EngineError, match="kept part 'backbone.layers.0.self_attn' keeps none of the INT8"):
        build(keep=("backbone.layers.0.self_attn",))
    with pytest.raises(EngineError, match="nothing to quantize"):
        build(keep=("mlp",))
    with pytest.raises(ExportError, match="backbone.layers.7"):
        build(fp32=("head", "backbone.layers.7"))
    with pytest.raises(EngineError, match="float precision 'fp16'"):
        build_mixed_export(standard_export_dir, tmp_path / "x", float_precision="fp16")
    assert issubclass(ExportError, HllmError) and issubclass(EngineError, HllmError)  # the CLI's exit 2
    assert not (tmp_path / "x").exists()


def test_the_k_schedule_doubles_then_bisects_and_stays_below_all_groups():
    def walk(groups, first_pass):
        tried = {}
        while (k := k_schedule(tried, groups)) is not None:
            tried[k] = k >= first_pass
        return list(tried)

    assert walk(30, 11) == [0, 1, 2, 4, 8, 16, 12, 10, 11]
    assert walk(8, 99) == [0, 1, 2, 4, 7]  # never k = 8: nothing left in INT8
    assert walk(8, 0) == [0] and walk(1, 99) == [0]


def _search(export, dst, **settings):
    from hllm.calibration.recipes.int8_search import sensitivity_search

    return sensitivity_search(export, dst, tiny_slates(5, (3, 8), seed=21), float_precision="fp32",
                              settings=settings or None)


def test_the_search_orders_the_groups_and_keeps_the_most_sensitive_until_the_floor_clears(standard_export_dir, tmp_path):
    s = _search(standard_export_dir, tmp_path / "a")["search"]
    groups = ["backbone.layers.0.mlp", "backbone.layers.1.mlp"]
    assert sorted(s["order"]) == groups and set(s["sensitivity"]) == set(groups)
    sens = s["sensitivity"]
    assert [sens[g]["kendall_tau_mean"] for g in s["order"]] == sorted(sens[g]["kendall_tau_mean"] for g in s["order"])
    assert s["baseline"]["max_abs_dM"] == 0 and s["validation_slates"] == 5 and s["min_tau"] == 0.9
    # whole validation slates (the gate's tau is over all candidates) and a target above the gate's floor
    assert s["max_candidates"] is None and s["target_tau"] == pytest.approx(0.92) and s["margin"] == 0.02
    assert s["tries"][0]["k"] == 0 and s["kept"] == [] and s["figures"]["kendall_tau_mean"] >= 0.9
    # a floor on max|ΔM| between "the least sensitive group alone" and "both groups": k = 0 fails, k = 1 passes
    alone, both = sens[s["order"][-1]]["max_abs_dM"], s["tries"][0]["figures"]["max_abs_dM"]
    assert alone < both
    q = _search(standard_export_dir, tmp_path / "b", max_abs_diff=(alone + both) / 2, max_tries=3)
    t = q["search"]
    assert [(x["k"], x["passed"]) for x in t["tries"]] == [(0, False), (1, True)] and t["kept"] == t["order"][:1]
    kept_nodes = {n for n, p in _matmul_sites(standard_export_dir).items() if p.startswith(t["kept"][0] + ".")}
    assert len(kept_nodes) == 3 and set(q["int8_nodes"]) == _int8_in_ir(tmp_path / "b")
    assert not kept_nodes & set(q["int8_nodes"]) and q["int8_matmuls"] == 3
    _scores_close_to_fp32(tmp_path / "b", standard_export_dir)


def test_the_sensitivity_pass_scores_fewer_slates_and_the_tries_every_one(standard_export_dir, tmp_path, monkeypatch):
    """One build per layer group is the search's cost: the order comes from the first ``sensitivity_slates``
    validation slates, every try of k is scored on all of them (the verdict)."""
    import hllm.calibration.recipes.int8_search as search

    seen, real = [], search._score
    monkeypatch.setattr(search, "_score", lambda m, r, g, slates=None: seen.append(slates) or real(m, r, g, slates))
    s = _search(standard_export_dir, tmp_path / "a", sensitivity_slates=2)["search"]
    assert s["sensitivity_slates"] == 2 and s["validation_slates"] == 5
    # reference (all), the two groups alone (2 slates each), then the tries (all)
    assert seen == [None, 2, 2] + [None] * len(s["tries"])
    assert _search(standard_export_dir, tmp_path / "b")["search"]["sensitivity_slates"] == 5  # default 8, capped


def test_the_search_stops_at_its_bound_and_writes_nothing(standard_export_dir, tmp_path):
    with pytest.raises(EngineError, match=r"within the bounds \(1 of at most 1 tries\).*no export written"):
        _search(standard_export_dir, tmp_path / "a", max_abs_diff=1e-12, max_tries=1)
    assert not (tmp_path / "a").exists()
    with pytest.raises(EngineError, match="unknown INT8 search setting"):
        _search(standard_export_dir, tmp_path / "a", max_trys=1)
    from hllm.calibration.recipes.int8_search import sensitivity_search

    with pytest.raises(EngineError, match="needs validation slates"):
        sensitivity_search(standard_export_dir, tmp_path / "a", [], float_precision="fp32")


@NO_BF16
def test_the_search_recipe_keeps_bf16_elsewhere_and_records_its_search(standard_export_dir, tmp_path):
    val = tiny_slates(4, (3, 6), seed=22)
    meta = BY_NAME["openvino-int8-search"].build(standard_export_dir, tmp_path / "s",
                                                 RecipeInputs(validation=val, ac_settings={"budget_s": 300.0}))
    q = meta.raw["quantization"]
    s = q["search"]
    assert s["float_precision"] == "bf16" and s["budget_s"] == 300.0 and len(s["order"]) == 2
    assert 0 < s["baseline"]["max_abs_dM"]  # bf16 MLPs: not the fp32 graph
    assert q["int8_matmuls"] == 3 * (2 - len(s["kept"])) and q["bf16_matmuls"] == 3 * len(s["kept"])


def test_a_biased_head_product_stays_float_in_a_context_reading_head(tiny_dir, context_checkpoint, tmp_path):
    """A head that reads the user context has a biased projection (ONNX ``Gemm``), which OpenVINO names
    ``NAME/WithoutBiases``: the ignored scope must name it so, else NNCF compressed it too (the build refused)."""
    from hllm.exporter.onnx import export_onnx

    export_onnx(context_checkpoint, tmp_path / "std", flavour="standard")
    sites = _matmul_sites(tmp_path / "std")
    assert any(p.startswith("head.context") for p in sites.values())  # the product that broke the build
    meta = BY_NAME["openvino-int8-mlp-fp32"].build(tmp_path / "std", tmp_path / "m")
    mlp = {n for n, p in sites.items() if ".mlp." in p}
    assert set(meta.raw["quantization"]["int8_nodes"]) == mlp == _int8_in_ir(tmp_path / "m")
    _scores_close_to_fp32(tmp_path / "m", tmp_path / "std")
    # the INT8 search feeds the context inputs too: its sensitivity pass (2 slates) and its tries (all 5) run
    # on the context-reading graph, and what it writes scores like the fp32 graph
    q = _search(tmp_path / "std", tmp_path / "s", sensitivity_slates=2)
    s = q["search"]
    assert s["sensitivity_slates"] == 2 and s["validation_slates"] == 5 and len(s["order"]) == 2
    assert s["figures"]["kendall_tau_mean"] >= s["target_tau"]
    assert not {n for n, p in sites.items() if p.startswith("head.")} & set(q["int8_nodes"])
    _scores_close_to_fp32(tmp_path / "s", tmp_path / "std")
