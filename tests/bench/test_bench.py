"""Benchmarks: statistics, sub-slates, solver equivalence, JSON schemas (no test asserts a time)."""

import itertools
from collections import Counter
import json

import numpy as np
import pytest

from hllm.bench.lapjv import FAMILIES, available_solvers, bench_solvers, score_matrices
from hllm.bench.peak import matmul_peak
from hllm.measure import describe_machine, prefill_flops, summarize, time_interleaved
from hllm.formats.provenance import library_versions
from hllm.formats.report import MACHINE_KEYS
from hllm.runtime.slates import subslate
from hllm.errors import DecodeError, HllmError, SlateError
from hllm.runtime.decode import assignment_scores, decode, decode_batch



# -- statistics ---------------------------------------------------------------------------------
def test_summarize_known_values():
    s = summarize([5.0, 1.0, 4.0, 2.0, 3.0])
    assert s == {"runs": 5, "median": 3.0, "p90": 4.6, "p99": 4.96, "mean": 3.0, "min": 1.0, "max": 5.0}
    assert summarize([7.0])["p99"] == 7.0


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [float("inf")]])
def test_summarize_refuses_empty_or_non_finite(bad):
    with pytest.raises(HllmError):
        summarize(bad)


def test_time_interleaved_rotates_and_drops_warmup():
    calls = []
    fns = {name: (lambda i, name=name: calls.append((name, i))) for name in ("a", "b", "c")}
    out = time_interleaved(fns, rounds=3, warmup=2, unit=1e6)
    assert {k: len(v) for k, v in out.items()} == {"a": 3, "b": 3, "c": 3}
    assert all(v >= 0 for vals in out.values() for v in vals)
    # round r starts with name r % 3; every round calls each once with the round index
    firsts = [calls[3 * r][0] for r in range(5)]
    assert firsts == ["a", "b", "c", "a", "b"]
    assert sorted(calls[3:6]) == [("a", 1), ("b", 1), ("c", 1)]


# -- sub-slates ---------------------------------------------------------------------------------
def _slate(n=8, positive=6):
    return {
        "slate_id": "s1",
        "history": ["h"],
        "candidates": [{"item_id": f"i{i}", "title": f"t{i}"} for i in range(n)],
        "labels": [int(i == positive) for i in range(n)],
    }


def test_subslate_keeps_positive_and_order():
    s = _slate()
    sub = subslate(s, 4)
    assert [c["item_id"] for c in sub["candidates"]] == ["i0", "i1", "i2", "i6"]
    assert sub["labels"] == [0, 0, 0, 1]
    assert sub["slate_id"] == "s1@4" and sub["history"] == ["h"]
    assert len(s["candidates"]) == 8 and s["slate_id"] == "s1"  # input unchanged


def test_subslate_prefix_when_positive_inside_and_without_labels():
    assert [c["item_id"] for c in subslate(_slate(positive=1), 3)["candidates"]] == ["i0", "i1", "i2"]
    s = _slate()
    del s["labels"]
    sub = subslate(s, 2)
    assert [c["item_id"] for c in sub["candidates"]] == ["i0", "i1"] and "labels" not in sub


@pytest.mark.parametrize("n", [0, 9])
def test_subslate_refuses_bad_size(n):
    with pytest.raises(SlateError, match="cannot take"):
        subslate(_slate(), n)


# -- LAP solvers and the runtime decode --------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_score_matrices_families(family):
    ms = score_matrices(family, 7, 3, seed=1)
    assert len(ms) == 3 and all(m.shape == (7, 7) and m.dtype == np.float32 for m in ms)
    assert not np.array_equal(ms[0], ms[1])
    assert np.array_equal(ms[0], score_matrices(family, 7, 3, seed=1)[0])  # seeded


def test_unknown_family_refused():
    with pytest.raises(ValueError, match="unknown matrix family"):
        score_matrices("uniform", 5, 1)


def _brute_best(m):
    n = m.shape[0]
    return max(sum(float(m[p[j], j]) for j in range(n)) for p in itertools.permutations(range(n)))


@pytest.mark.parametrize("family", FAMILIES)
def test_every_solver_reaches_the_brute_force_optimum(family):
    solvers = available_solvers()
    assert {"lap.lapjv", "scipy.linear_sum_assignment"} <= {s.name for s in solvers}
    for m in score_matrices(family, 6, 4, seed=2):
        best = _brute_best(m.astype(np.float64))
        for s in solvers:
            for dt in (np.float32, np.float64):
                r = s.ranking(s.call(np.ascontiguousarray(-m, dtype=dt)), 6)
                assert sorted(r.tolist()) == list(range(6)), s.name
                assert assignment_scores(m, r).sum() == pytest.approx(best, abs=1e-5), (s.name, dt)
        assert assignment_scores(m, decode(m)).sum() == pytest.approx(best, abs=1e-6)


@pytest.mark.parametrize("n", [10, 50, 150])
def test_runtime_decode_matches_scipy_optimum(n):
    from scipy.optimize import linear_sum_assignment

    for m in score_matrices("gaussian", n, 3, seed=n) + score_matrices("rank1", n, 3, seed=n):
        rows, cols = linear_sum_assignment(m.astype(np.float64), maximize=True)
        ours = assignment_scores(m, decode(m)).sum()
        assert ours == pytest.approx(float(m[rows, cols].astype(np.float64).sum()), rel=1e-9, abs=1e-9)


def test_decode_batch_equals_decode_uniform_and_ragged():
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((5, 12, 16)).astype(np.float32)
    uniform = decode_batch(scores, [12] * 5)
    assert [r.tolist() for r in uniform] == [decode(scores[b], 12).tolist() for b in range(5)]
    assert all(r.dtype == np.int64 for r in uniform)
    ns = [12, 3, 1, 7, 12]
    ragged = decode_batch(scores, ns)
    assert [r.tolist() for r in ragged] == [decode(scores[b], n).tolist() for b, n in enumerate(ns)]


def test_decode_batch_uniform_errors_name_the_slate():
    s = np.zeros((3, 4, 4), dtype=np.float32)
    s[2, 3, 1] = np.inf
    with pytest.raises(DecodeError, match="slate at batch position 2: score matrix has 1 non-finite"):
        decode_batch(s, [4, 4, 4])
    with pytest.raises(DecodeError, match="slate s2: score matrix has 1 non-finite"):
        decode_batch(s, [4, 4, 4], ["s0", "s1", "s2"])
    with pytest.raises(DecodeError, match="slate at batch position 0: .*rank positions"):
        decode_batch(np.zeros((2, 5, 3)), [5, 5])
    assert decode_batch(np.zeros((0, 3, 3)), []) == []


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_decode_accepts_huge_finite_scores():
    m = np.full((3, 3), 1e307)  # the float64 sum overflows to inf, the values are finite
    m[0, 0] = m[1, 1] = m[2, 2] = 1.7e308
    assert decode(m).tolist() == [0, 1, 2]


def test_bench_solvers_record():
    rec = bench_solvers(8, "planted", count=4, warmup=1)
    assert rec["correct"] is True and rec["max_objective_gap"] < 1e-9
    assert rec["n_items"] == 8 and rec["matrices"] == 4
    assert {"lap.lapjv/float32", "lap.lapjv/float64", "scipy.linear_sum_assignment/float64"} <= set(rec["solvers_us"])
    assert len(rec["solvers_us"]) == 2 * len(available_solvers())  # every solver × (float32, float64)
    assert all(0 < v["min"] <= v["median"] for v in rec["solvers_us"].values())


def test_bench_solvers_runs_every_matrix_and_flags_a_wrong_solver():
    """Each solver × dtype is called on the warm-up and every timed matrix, then once more per timed matrix
    for the optimality check; a solver that returns the identity on planted problems is not ``correct``."""
    import lap

    from hllm.bench.lapjv import Solver

    seen = Counter()

    def counted(cost):
        seen[cost.dtype.name] += 1
        return lap.lapjv(cost, extend_cost=False, return_cost=False)

    ok = Solver("counted", counted, lambda r, n: np.asarray(r[1], dtype=np.int64))
    rec = bench_solvers(8, "planted", count=4, warmup=1, solvers=[ok])
    assert rec["correct"] is True and rec["max_objective_gap"] < 1e-9
    assert seen == {"float32": 1 + 4 + 4, "float64": 1 + 4 + 4}
    identity = Solver("identity", lambda cost: None, lambda r, n: np.arange(n))
    wrong = bench_solvers(8, "planted", count=4, warmup=1, solvers=[identity])
    assert wrong["correct"] is False and wrong["max_objective_gap"] > 0


# -- machine ----------------------------------------------------------------------------------
def test_machine_description_and_versions():
    d = describe_machine(shared=True, note="x")
    assert set(d) == MACHINE_KEYS and d["shared"] is True and d["logical_cpus"] >= 1
    v = library_versions()
    assert {"python", "numpy", "lap"} <= set(v)


def test_matmul_peak_small():
    p = matmul_peak(n=64, runs=1, warmup=0)
    assert p["peak_gflops"] >= p["numpy_gflops"] > 0


@pytest.mark.parametrize("numpy_gf, torch_gf, peak", [(10.0, 30.0, 30.0), (50.0, 30.0, 50.0)])
def test_matmul_peak_is_the_faster_library_at_2n3_flop(monkeypatch, numpy_gf, torch_gf, peak):
    """The peak is the better of numpy's and torch's products, each timed over 2·n³ FLOP (n³ multiply-adds)."""
    from hllm.bench import peak as peak_mod

    seen = []

    def fake_best(fn, flop, runs, warmup):
        product = fn()
        seen.append((tuple(product.shape), flop))
        return [numpy_gf, torch_gf][len(seen) - 1]

    monkeypatch.setattr(peak_mod, "best_gflops", fake_best)
    p = matmul_peak(n=64, runs=1, warmup=0)
    assert seen == [((64, 64), 524288.0), ((64, 64), 524288.0)]
    assert (p["numpy_gflops"], p["torch_gflops"], p["peak_gflops"]) == (numpy_gf, torch_gf, peak)


def test_best_gflops_times_the_fastest_call():
    """A call that sleeps 20 ms on 1e9 operations runs at no more than 50 G op/s (the best of three)."""
    import time

    from hllm.bench.peak import best_gflops

    g = best_gflops(lambda: time.sleep(0.02), 1e9, runs=3, warmup=0)
    assert 10 < g <= 50


def test_prefill_flops_formula():
    from hllm.formats.architectures import BackboneDims

    d = BackboneDims("llama", hidden_size=4, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=2,
                     intermediate_size=8, vocab_size=10, tie_word_embeddings=True)
    # per layer: q 4x4 + k 4x2 + v 4x2 + o 4x4 + gate/up 2*4x8 + down 8x4 = 16+8+8+16+64+32 = 144
    assert d.non_embedding_params() == 288
    assert prefill_flops(d, 10) == 2 * 288 * 10 + 2 * 2 * 100 * 2 * 2


# -- end to end on the tiny models ---------------------------------------------------------------
STAGE_KEYS = {"kind", "schema", "model", "backend", "precision", "flavour", "n_items", "batch_size", "runs", "warmup", "stage_ms",
              "stage_stats", "lapjv_us", "engine_io_ms", "overhead_fraction", "prompt_tokens_mean",
              "tokens_per_s", "gflops", "peak_fraction", "load_s", "machine", "versions"}


def test_stage_bench_records_on_tiny_models(merged_checkpoint, export_dir):
    from hllm.bench.report import document
    from hllm.bench.stages import bench_stages
    from hllm.testing import tiny_slates

    data = tiny_slates(4, 8, seed=5)
    recs = bench_stages([merged_checkpoint, export_dir], data, runs=2, warmup=1, peak_gflops=100.0,
                        configs=[(4, 1), (8, 2)])
    doc = document("stages", recs, shared=True)
    assert doc["kind"] == "stages" and len(doc["records"]) == 4
    json.dumps(doc, allow_nan=False)
    assert [(r["backend"], r["n_items"], r["batch_size"]) for r in recs] == [
        ("torch", 4, 1), ("onnxruntime", 4, 1), ("torch", 8, 2), ("onnxruntime", 8, 2)]
    assert [(r["precision"], r["flavour"]) for r in recs[:2]] == [("fp32", None), ("fp32", "ort-cpu")]
    for r in recs:
        assert STAGE_KEYS <= set(r)
        assert set(r["stage_ms"]) == {"prompt", "engine", "decode_output", "total", "lapjv", "engine_io"}
        assert r["stage_stats"]["engine"]["runs"] == r["lapjv_us"]["runs"] == r["runs"]  # one LAPJV timing per engine call
        assert 0 < r["overhead_fraction"] < 1
        assert r["tokens_per_s"] > 0 and r["gflops"] > 0 and r["peak_fraction"] == pytest.approx(r["gflops"] / 100, abs=1e-4)
        assert r["machine"]["shared"] is True
        s = r["stage_stats"]
        assert s["total"]["median"] >= s["engine"]["median"]


def test_versus_ar_record_on_tiny_models(merged_checkpoint, qwen3_backbone):
    from hllm.bench.versus_ar import bench_versus_ar
    from hllm.testing import tiny_slates

    rec = bench_versus_ar([merged_checkpoint], qwen3_backbone, tiny_slates(3, 5, seed=7), n_items=4)
    for k in ("hllm_ms", "ar_ms", "ar_decode_passes", "speedup", "ar_unconstrained_invalid_rate",
              "ar_unconstrained_ms", "ar_unconstrained_decode_passes", "n_items", "slates", "per_slate"):
        assert k in rec
    assert rec["slates"] == 2 and rec["n_items"] == 4
    assert rec["ar_constrained_valid_rate"] == 1.0  # the grammar forces a complete permutation
    assert rec["ar_decode_passes"] >= 4  # at least one token per ordinal
    assert 0.0 <= rec["ar_unconstrained_invalid_rate"] <= 1.0
    for row in rec["per_slate"]:
        assert row["slate_id"].endswith("@4")
        assert sorted(row["order"]) == sorted(["hllm:torch", "ar_constrained", "ar_unconstrained"])
    ratios = [row["ar_constrained"]["ms"] / row["hllm:torch"]["ms"] for row in rec["per_slate"]]
    assert rec["speedup"] == pytest.approx(float(np.median(ratios)), rel=1e-2)
    json.dumps(rec, allow_nan=False)


def test_cli_lapjv_and_chart(tmp_path, merged_checkpoint):
    from typer.testing import CliRunner

    from hllm.cli import app

    runner = CliRunner()
    out = tmp_path / "lap.json"
    r = runner.invoke(app, ["bench", "lapjv", "-n", "5,9", "--families", "gaussian", "--matrices", "3",
                            "-o", str(out), "--shared"])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert doc["kind"] == "lapjv" and doc["shared"] is True and len(doc["records"]) == 2
    assert all(rec["correct"] and set(rec["machine"]) == MACHINE_KEYS for rec in doc["records"])
    r = runner.invoke(app, ["bench", "markdown", str(out)])
    assert r.exit_code == 0, r.output
    rows = [ln for ln in r.output.splitlines() if ln.startswith("| 5 | gaussian |") or ln.startswith("| 9 | gaussian |")]
    assert len(rows) == 2 and all(ln.rstrip().endswith("| yes |") for ln in rows)
    r = runner.invoke(app, ["bench", "lapjv", "--families", "cauchy", "-o", str(out)])
    assert r.exit_code != 0

    st = tmp_path / "stages.json"
    r = runner.invoke(app, ["bench", "stages", str(merged_checkpoint), "-n", "4", "--runs", "1", "--warmup", "0",
                            "--peak-size", "64", "-o", str(st), "-s", str(tmp_path / "missing.jsonl")])
    assert r.exit_code != 0 and not st.exists()  # missing slates: error, no file


def test_markdown_tables_render_the_json_figures():
    from hllm.bench.markdown import stages_table, versus_table

    rec = {"backend": "torch", "n_items": 50, "batch_size": 1, "runs": 3, "lapjv_us": {"median": 41.0},
           "stage_ms": {"prompt": 4.25, "engine": 3210.4, "decode_output": 0.31, "total": 3215.0},
           "overhead_fraction": 0.00142, "prompt_tokens_mean": 1301.0, "tokens_per_s": 405.2, "gflops": 90.4,
           "peak_fraction": 0.63}
    t = stages_table({"records": [rec], "matmul_peak": {"peak_gflops": 144.0, "n": 2048, "runs": 3}})
    assert "| torch | 50 | 1 | 3 | 4.25 | 3,210 | 41 | 0.31 | 3,215 | 0.14% | 1301 | 405 | 90 (63%) |" in t
    assert "144.0 GFLOP/s" in t
    vs = {"n_items": 50, "slates": 2, "hllm_ms": 3300.0, "ar_ms": 21000.0, "ar_decode_passes": 149.0, "speedup": 6.36,
          "ar_unconstrained_ms": 5200.0, "ar_unconstrained_decode_passes": 16.0, "ar_unconstrained_invalid_rate": 1.0,
          "hllm_prompt_tokens": 1301.0, "ar_prefill_tokens": 1437.0}
    assert "| 50 | 2 | 3,300 | 21,000 | 149 | **6.4×** | 5,200 | 16 | 100% | 1301 / 1437 |" in versus_table({"records": [vs]})


def test_scaling_table_renders_each_contender_per_prompt_length():
    from hllm.bench.markdown import scaling_table

    def rec(model, backend, flavour, s, ms, ratio, gf=None, pf=None):
        return {"seq_len": s, "model": model, "backend": backend, "flavour": flavour, "precision": "fp32",
                "engine_ms": {"median": ms}, "ratio_to_reference": ratio, "gflops": gf, "peak_fraction": pf}

    doc = {"records": [rec("ck", "torch", None, 400, 900.0, 1.0), rec("fused", "onnxruntime", "ort-cpu", 400, 600.0, 1.5),
                       rec("ck", "torch", None, 2600, 7000.0, 1.0, 120.0, 0.6),
                       rec("fused", "onnxruntime", "ort-cpu", 2600, 4375.0, 1.6, 192.0, 0.96)],
           "matmul_peak": {"peak_gflops": 200.0, "n": 2048, "runs": 3}}
    t = scaling_table(doc)
    assert "| PyTorch eager (reference) | 900 (1.00×) | 7,000 (1.00×) | 120 (60%) |" in t
    assert "| onnxruntime ort-cpu fp32 | 600 (1.50×) | 4,375 (1.60×) | 192 (96%) |" in t
    assert "S=400: ms (× ref)" in t and "200.0 GFLOP/s" in t


def test_chart_png(tmp_path):
    pytest.importorskip("matplotlib")
    from hllm.bench.chart import write_chart

    rec = {"n_items": 50, "batch_size": 1, "backend": "torch",
           "stage_ms": {"prompt": 3.0, "engine": 3000.0, "lapjv": 0.05, "decode_output": 0.2, "total": 3003.2}}
    vs = {"n_items": 50, "hllm_ms": 3000.0, "ar_ms": 30000.0, "ar_decode_passes": 149, "speedup": 10.0,
          "ar_unconstrained_ms": 5000.0, "ar_unconstrained_decode_passes": 16, "ar_unconstrained_invalid_rate": 1.0}
    chart = write_chart([rec, {**rec, "backend": "onnxruntime"}], tmp_path / "c.png", vs)
    assert chart.path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list(chart.panels) == ["stages", "versus"]
    assert set(chart.panels["stages"].series) == {"torch", "onnxruntime"}  # older records: backend only
    assert [v for _, v in chart.panels["versus"].series.popitem()[1]] == [3.0, 30.0, 5.0]  # seconds
    with pytest.raises(HllmError, match="no stage record"):
        write_chart([rec], tmp_path / "d.png", n_items=10)


def _stage_rec(model, backend, flavour, precision, engine_ms):
    return {"model": model, "backend": backend, "flavour": flavour, "precision": precision, "n_items": 50,
            "batch_size": 1, "stage_ms": {"prompt": 3.0, "engine": engine_ms, "lapjv": 0.05, "decode_output": 0.2,
                                          "total": engine_ms + 3.25}}


def _scaling_recs(contenders, seq_lens=(400, 800, 1350)):
    """bench_scaling-shaped records: per S, each contender (the first = reference); ms = S × its speed."""
    recs = []
    for s in seq_lens:
        ref_ms = s * contenders[0][4]
        for model, backend, flavour, precision, ms_per_token in contenders:
            ms = s * ms_per_token
            recs.append({"kind": "scaling", "seq_len": s, "n_items": 50, "model": model, "backend": backend,
                         "precision": precision, "flavour": flavour,
                         "engine_ms": {"runs": 5, "median": ms, "p90": ms * 1.1, "min": ms * 0.9},
                         "ratio_to_reference": round(ref_ms / ms, 3), "gflops": 10.0, "peak_fraction": None})
    return recs


def test_chart_many_contenders_and_scaling_panel(tmp_path):
    pytest.importorskip("matplotlib")
    from hllm.bench.chart import contender_labels, write_chart

    contenders = [("ck/merged", "torch", None, "fp32", 2.0),
                  ("ex/export/model.onnx", "onnxruntime", "ort-cpu", "fp32", 1.0),
                  ("ex/standard/model.onnx", "onnxruntime", "standard", "fp32", 1.6),
                  ("ex/int8/model.onnx", "onnxruntime", "ort-cpu", "int8", 0.5),
                  ("ex/int8-b/model.onnx", "onnxruntime", "ort-cpu", "int8", 0.8)]
    stages = [_stage_rec(m, b, f, p, 1000.0 * t) for m, b, f, p, t in contenders]
    stages.append({**stages[0], "n_items": 10})  # another N: not charted
    scaling = _scaling_recs(contenders)
    want = ["torch fp32", "onnxruntime ort-cpu fp32", "onnxruntime standard fp32", "onnxruntime ort-cpu int8 (int8)",
            "onnxruntime ort-cpu int8 (int8-b)"]
    assert list(contender_labels(stages).values()) == want

    chart = write_chart(stages, tmp_path / "c.png", scaling=scaling)
    assert chart.path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list(chart.panels) == ["stages", "scaling"]
    st = chart.panels["stages"]
    assert list(st.series) == want
    assert st.series["onnxruntime ort-cpu int8 (int8)"][1] == ("engine (prefill + head)", 500.0)
    assert [c for c, _ in st.series["torch fp32"]] == ["prompt + tokenize", "engine (prefill + head)", "LAPJV decode",
                                                       "decode + output", "total"]
    sc = chart.panels["scaling"]
    assert list(sc.series) == want and "speed-up over torch fp32" in sc.title
    assert sc.series["onnxruntime standard fp32"] == [(400.0, 640.0), (800.0, 1280.0), (1350.0, 2160.0)]
    # one ratio per S for each non-reference contender: 2/1 = 2.00×, 2/1.6 = 1.25×, 2/0.5 = 4.00×, 2/0.8 = 2.50×
    assert sorted(sc.texts) == sorted(["2.00×", "1.25×", "4.00×", "2.50×"] * 3)

    chart = write_chart(stages, tmp_path / "d.png", versus=None, scaling=None)
    assert list(chart.panels) == ["stages"]


def test_cli_chart_with_scaling_panel(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from hllm.cli.app import run

    contenders = [("ck", "torch", None, "fp32", 2.0), ("ex/model.onnx", "onnxruntime", "ort-cpu", "int8", 0.5)]
    st, sc = tmp_path / "stages.json", tmp_path / "scaling.json"
    st.write_text(json.dumps({"kind": "stages", "records": [_stage_rec(m, b, f, p, 1e3 * t) for m, b, f, p, t in contenders]}))
    sc.write_text(json.dumps({"kind": "scaling", "records": _scaling_recs(contenders)}))
    png = tmp_path / "c.png"
    assert run(["bench", "chart", "--stages", str(st), "--scaling", str(sc), "-o", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"chart → {png}" in capsys.readouterr().out
    assert run(["bench", "chart", "--stages", str(st), "--scaling", str(st), "-o", str(tmp_path / "d.png")]) == 2
    assert "not a benchmark JSON of kind scaling" in capsys.readouterr().err and not (tmp_path / "d.png").exists()


def test_solver_bench_on_real_model_scores(export_dir):
    from hllm.bench.lapjv import model_score_matrices
    from hllm.testing import tiny_slates

    real = model_score_matrices(export_dir, tiny_slates(2, 8, seed=9), [3, 8])
    assert sorted(real) == [3, 8] and [m.shape for m in real[8]] == [(8, 8), (8, 8)]
    assert all(m.dtype == np.float32 and np.isfinite(m).all() for ms in real.values() for m in ms)
    rec = bench_solvers(8, "model", count=3, warmup=1, matrices=real[8])
    assert rec["correct"] and rec["matrices"] == 3 and rec["family"] == "model"
    assert set(rec["batch_us_per_slate"]) == {"decode_batch()", "decode() loop", "lap.lapjv loop"}


def test_cpu_id_reads_family_and_model_of_the_first_processor(tmp_path):
    """Two CPUs named "AMD EPYC" (Zen 4: family 25, Zen 5: family 26) are told apart in every result's machine."""
    from hllm.measure import cpu_id

    f = tmp_path / "cpuinfo"
    f.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
                 "model name\t: AMD EPYC\n\nprocessor\t: 1\ncpu family\t: 26\nmodel\t\t: 2\n")
    assert cpu_id(str(f)) == "family 25 model 17"
    f.write_text("processor\t: 0\nmodel name\t: ARMv8\n")
    assert cpu_id(str(f)) is None and cpu_id(str(tmp_path / "absent")) is None
