"""``hllm calibrate --backend auto``: every recipe the CPU and the export allow is built and gated, the
ones it cannot run are listed with the missing instruction set, the fastest that passes is written and
opens with ``hllm rank``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("openvino")

from hllm.calibration.recipes.table import ACCURACY_CONTROL, RECIPES  # noqa: E402
from hllm.testing import tiny_slates  # noqa: E402

BY_NAME = {c.name: c for c in RECIPES}


def test_refusal_names_the_missing_instruction_set_flavour_and_data():
    vnni = ["avx2", "avx512f", "avx512_vnni"]
    why = BY_NAME["openvino-bf16"].refusal("standard", vnni, True, True)
    assert "AVX512_BF16 and AMX_BF16" in why and "avx512_vnni" in why
    assert BY_NAME["openvino-bf16"].refusal("standard", vnni + ["amx_bf16"], True, True) is None
    assert "flavour standard" in BY_NAME["openvino-fp32"].refusal("ort-cpu", vnni, True, True)
    assert "calibration" in BY_NAME["onnxruntime-int8-static"].refusal("ort-cpu", vnni, False, True)
    assert "hllm[openvino]" in BY_NAME["openvino-int8"].refusal("standard", vnni, True, False)
    assert BY_NAME["onnxruntime-fp32"].refusal("ort-cpu", [], False, False) is None


def test_auto_times_every_recipe_and_writes_the_fastest_that_passes(standard_export_dir, tmp_path):
    from hllm.runtime.slates import write_jsonl as write_slates

    write_slates(tmp_path / "eval.jsonl", tiny_slates(8, (2, 8), seed=11))  # the gate's 6, then NNCF's 2
    write_slates(tmp_path / "train.jsonl", [{**s, "slate_id": f"train-{i}"} for i, s in enumerate(tiny_slates(4, 6, seed=12))])
    out, rep = tmp_path / "selected", tmp_path / "selection.json"
    # in a child process: OpenVINO / NNCF loaded into the pytest process make a later test's SIGTERM-to-self
    # crash it (native threads); the CPU flags are faked there the same way
    code = (f"from hllm import measure; measure.cpu_flags = lambda: {['avx2', 'avx512f', 'avx512_vnni']!r}\n"
            "import sys; from hllm.cli import main; main(sys.argv[1:])")
    argv = ["calibrate", str(standard_export_dir), str(out), "--backend", "auto", "-s", str(tmp_path / "eval.jsonl"),
            "--limit", "6", "--calib-slates", str(tmp_path / "train.jsonl"), "--calib-count", "4", "--bench-runs", "3",
            "--bench-warmup", "1", "--threads", "1", "--min-top1", "0.5", "--max-recall10-delta", "1",
            "--max-auc-delta", "1", "--report", str(rep)]
    r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(rep.read_text())
    rec = {c["name"]: c for c in doc["recipes"]}
    assert list(rec) == [c.name for c in RECIPES]
    assert "AVX512_BF16" in rec["openvino-bf16"]["refused"]
    # every built recipe is timed first; they are checked from the fastest down until one passes (fp32: tensor
    # parity with the reference on a few slates, the engine that computed it not rerun; reduced precision: the gate
    # over every slate or until it cannot pass); the slower ones are skipped, never checked
    from hllm.calibration.selection.loop import FP32_PARITY_ATOL

    assert doc["reference"]["engine"] in ("onnxruntime-fp32", "openvino-fp32") and doc["wall_s"] > 0
    assert doc["thresholds"]["time_budget_s"] > 0
    built = {n: c for n, c in rec.items() if "build_s" in c and "error" not in c}
    assert set(built) >= {"onnxruntime-fp32", "onnxruntime-fused-fp32", "openvino-fp32", "onnxruntime-int8-dynamic",
                          "onnxruntime-int8-static"}
    assert all(c["engine_ms_median"] > 0 for c in built.values())
    assert rec["onnxruntime-fp32"]["passed"]  # the baseline is always checked: the run always has an export to write
    for name, c in built.items():
        if c.get("check") == "parity":
            assert c["precision"] == "fp32" and c["parity"]["slates"] == 6
            assert c["passed"] == (c["parity"]["max_abs_diff"] <= FP32_PARITY_ATOL)
        elif c.get("check") == "gate":
            g = c["gate"]
            assert g["gate"] == "quality" and c["passed"] == g["passed"]
            assert {x["name"] for x in g["criteria"]} >= {"auc_delta", "kendall_tau_mean", "regret_p95", "top1_agreement"}
            assert g["slates"] == 6 or g["stopped_after"] == g["slates"] < 6
        elif c.get("check") != "reference":
            assert "skipped" in c and "passed" not in c, c
    sel, ac = doc["selected"], ACCURACY_CONTROL  # the validation-slate searches are timed in a second run
    assert rec[sel]["passed"]
    if sel not in ac:
        for name, c in built.items():
            if name in (sel, "onnxruntime-fp32", *ac):
                continue
            if c["engine_ms_median"] < rec[sel]["engine_ms_median"]:
                assert c["passed"] is False, (name, c)  # faster than the winner: checked, and it failed
            else:
                assert "skipped" in c, (name, c)
    base_ms = rec["onnxruntime-fp32"]["engine_ms_median"]  # the baseline: fp32 ONNX Runtime, standard graph
    for name in set(built) - set(ACCURACY_CONTROL):
        assert rec[name]["speedup_vs_fp32"] == pytest.approx(base_ms / rec[name]["engine_ms_median"], rel=0.01, abs=2e-3)
    # the selected directory is an export that ranks as it is, and carries the report
    assert json.loads((out / "selection_report.json").read_text())["selected"] == doc["selected"]
    ranked = tmp_path / "r.jsonl"
    r = subprocess.run([sys.executable, "-c", code, "rank", str(out), "-s", str(tmp_path / "eval.jsonl"), "-o", str(ranked)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(ranked.read_text().splitlines()) == 8
    # the input export is untouched: no selection report written into it
    assert not (standard_export_dir / "selection_report.json").exists()


def test_auto_refuses_an_unknown_recipe_and_a_quantized_start(standard_export_dir, tmp_path, capsys):
    from hllm.cli import main

    with pytest.raises(SystemExit) as e:
        main(["calibrate", str(standard_export_dir), str(tmp_path / "o"), "--backend", "auto", "--recipe", "tvm-int4"])
    assert e.value.code == 2
    assert "tvm-int4" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["calibrate", str(standard_export_dir), str(tmp_path / "o"), "--backend", "ort-dynamic", "--recipe",
              "openvino-fp32"])
    assert e.value.code == 2


def test_gate_fail_fast_stops_once_the_gate_cannot_pass(standard_export_dir):
    def gate_fail_fast(ref, path, slates, th, threads, chunk):  # the loop's check of a reduced-precision recipe
        rep = run_gate(ref, path, slates, th, threads=threads, fail_fast=True, chunk=chunk, sequential=True)
        return rep, len(rep.records)

    import numpy as np

    from hllm.verify.sequential import run_gate
    from hllm.verify.gate import GateThresholds
    from hllm.verify.reference import cpu_ranker, ranker_scores

    slates = tiny_slates(12, (3, 8), seed=21)
    ref = ranker_scores(cpu_ranker(standard_export_dir, 1), slates)
    th = GateThresholds(mode="strict", min_top1=0.9, max_recall10_delta=1.0, max_auc_delta=1.0)  # 1 top-1 miss of 12
    rep, k = gate_fail_fast(ref, standard_export_dir, slates, th, threads=1, chunk=3)
    assert k == 12 and rep.passed and rep.summary().top1_agreement == 1.0
    # a reference whose top item is another one on every slate: 2 misses exceed the 1 allowed → stop after 3
    from hllm.verify.parity import compare_slate

    flipped = []
    for a in ref:
        second = compare_slate(a, a).ref_order[1]  # the engine's second item: put it first
        m = np.zeros_like(a)
        m[second, 0] = 10.0
        flipped.append(m)
    rep, k = gate_fail_fast(flipped, standard_export_dir, slates, th, threads=1, chunk=3)
    assert k == 3 and not rep.passed and "top-1" in rep.stop_reason
    # the quality gate stops it too: with 9 slates to go, the mean tau cannot reach 0.9 any more
    rep, k = gate_fail_fast(flipped, standard_export_dir, slates, GateThresholds(), threads=1, chunk=3)
    assert k == 3 and not rep.passed and rep.to_dict()["stopped_after"] == 3


@pytest.mark.parametrize("backend", ["auto", "ort-dynamic"])
def test_reference_cache_is_never_written_into_the_input_or_out_dir(backend, standard_export_dir, tmp_path, capsys):
    """``--reference-scores`` is written when absent: inside the input export it would modify the input,
    inside OUT_DIR it would make the final rename fail after all the work; both are refused up front."""
    from hllm.cli import main
    from hllm.runtime.slates import write_jsonl as write_slates

    write_slates(tmp_path / "eval.jsonl", tiny_slates(2, (2, 8), seed=11))
    before = sorted(p.name for p in standard_export_dir.iterdir())
    for cache, where in ((standard_export_dir / "ref.npz", "input"), (tmp_path / "o" / "ref.npz", "OUT_DIR")):
        with pytest.raises(SystemExit) as e:
            main(["calibrate", str(standard_export_dir), str(tmp_path / "o"), "--backend", backend, "-s",
                  str(tmp_path / "eval.jsonl"), "--threads", "1", "--reference-scores", str(cache)])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert "--reference-scores" in err and where in err, err
        assert not cache.exists() and not (tmp_path / "o").exists()
    assert sorted(p.name for p in standard_export_dir.iterdir()) == before


def test_auto_refuses_an_openvino_sidecar_and_a_typo_before_any_work(standard_export_dir, tmp_path, capsys):
    """A previous selection that picked OpenVINO (sidecar ``engine: openvino``) is not an ONNX Runtime FP32
    start: its "onnxruntime-*" recipes would inherit that engine. Refused, as is a --recipe typo,
    before the slates are read."""
    from hllm.cli import main

    ov = BY_NAME["openvino-fp32"].build(standard_export_dir, tmp_path / "ov").root
    for export, extra, want in ((ov, [], "selects the openvino engine"), (standard_export_dir, ["--recipe", "openvino-fp33"], "openvino-fp33")):
        with pytest.raises(SystemExit) as e:
            main(["calibrate", str(export), str(tmp_path / "o"), "--backend", "auto", "-s", str(tmp_path / "missing.jsonl"),
                  *extra])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert want in err and "missing.jsonl" not in err, err
    assert not (tmp_path / "o").exists()


def test_accuracy_control_validates_on_slates_apart_from_the_gates(standard_export_dir, tmp_path, monkeypatch):
    """NNCF's accuracy control gets the validation slates, never the gate's: overlapping ones are refused before
    any work, none at all refuse the recipe, disjoint ones are what its build receives."""
    from hllm.calibration.recipes import accuracy_control
    from hllm.calibration.selection import pipeline
    from hllm.calibration.recipes.table import NO_VALIDATION, check_validation
    from hllm.calibration.selection.loop import LoopRequest
    from hllm.calibration.selection.select import select
    from hllm.errors import EngineError, SlateError
    from hllm.verify.gate import GateThresholds
    from hllm.verify.reference import cpu_ranker

    slates = tiny_slates(7, (3, 6), seed=31)
    evals = slates[:4]
    validation = [{**s, "slate_id": f"held-out-{i}"} for i, s in enumerate(slates[4:])]
    check_validation(validation, evals)
    with pytest.raises(SlateError, match="1 validation slate"):
        check_validation(validation + [evals[2]], evals)
    seen = []

    def fake_build(export_dir, dst, calibration, validation, *a, **k):
        seen.append([s["slate_id"] for s in validation])
        raise EngineError("stopped here by the test")

    monkeypatch.setattr(accuracy_control, "build_recipe", fake_build)
    # the reference from ONNX Runtime only: OpenVINO loaded in the pytest process breaks a later SIGTERM test
    monkeypatch.setattr(pipeline, "fp32_engines", lambda art, threads=None: {"onnxruntime-fp32": cpu_ranker(art, threads)})

    def run(val, out):
        req = LoopRequest(standard_export_dir, tmp_path / out, GateThresholds(), evals, calibration=object(),
                            only=("openvino-int8",), threads=1, validation_slates=val)
        return {c["name"]: c for c in select(req)[0].recipes}

    with pytest.raises(SlateError, match="also gate slates"):
        run(validation + [evals[0]], "overlap")
    assert not (tmp_path / "overlap").exists()
    assert run([], "none")["openvino-int8"]["refused"] == NO_VALIDATION and seen == []
    rec = run(validation, "apart")["openvino-int8"]
    assert rec["error"] == "EngineError: stopped here by the test"
    assert seen == [["held-out-0", "held-out-1", "held-out-2"]]


def test_accuracy_control_gets_what_is_left_of_the_time_budget(standard_export_dir, tmp_path, monkeypatch):
    """NNCF's search runs last with the run's budget minus what was spent and a reserve for its own gate; under
    the minimum it is refused with the figures, and never built."""
    from hllm.calibration.recipes import accuracy_control
    from hllm.calibration.selection import pipeline
    from hllm.calibration.selection import loop as sel
    from hllm.calibration.selection.loop import LoopRequest
    from hllm.calibration.selection.select import select
    from hllm.errors import EngineError
    from hllm.verify.gate import GateThresholds
    from hllm.verify.reference import cpu_ranker

    slates = tiny_slates(6, (3, 6), seed=32)
    evals, validation = slates[:3], [{**s, "slate_id": f"held-out-{i}"} for i, s in enumerate(slates[3:])]
    budgets = []

    def fake_build(export_dir, dst, calibration, validation, *a, settings=None, **k):
        budgets.append(settings["budget_s"])
        raise EngineError("stopped here by the test")

    monkeypatch.setattr(accuracy_control, "build_recipe", fake_build)
    monkeypatch.setattr(pipeline, "fp32_engines", lambda art, threads=None: {"onnxruntime-fp32": cpu_ranker(art, threads)})

    def run(budget, out, spent=0.0):
        req = LoopRequest(standard_export_dir, tmp_path / out, GateThresholds(), evals, calibration=object(),
                            only=("openvino-int8",), threads=1, validation_slates=validation, time_budget_s=budget,
                            spent_before_s=spent)
        res = select(req)[0]
        return {c["name"]: c for c in res.recipes}, res

    rec, res = run(sel.ACCURACY_CONTROL_MIN_S, "short")
    assert rec["openvino-int8"]["refused"].startswith("time budget: ") and "raise --time-budget" in rec["openvino-int8"]["refused"]
    assert budgets == [] and res.selected == "onnxruntime-fp32" and res.thresholds["time_budget_s"] == sel.ACCURACY_CONTROL_MIN_S
    stale = tmp_path / ".long.999999-12345.abcdefgh.tmp"  # a staging directory of a killed run (no such writer)
    (stale / "openvino-fp32").mkdir(parents=True)
    rec, res = run(3600.0, "long", spent=100.0)
    assert len(budgets) == 1 and res.thresholds["time_budget_s"] == 3600.0  # the budget as given
    top = 3600 - sel.ACCURACY_CONTROL_RESERVE_S - 100.0  # what the caller spent before counts
    assert top - res.wall_s - 0.1 <= budgets[0] <= top
    assert not stale.exists()  # swept before the run staged its own
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_recipes_are_checked_from_the_fastest_down_and_the_slower_ones_skipped(tmp_path):
    """The first recipe (by median engine time) that passes wins; the faster ones were checked and failed,
    the slower ones — and any slower than the baseline — are skipped without a check."""
    from hllm.calibration.selection.loop import LoopRun

    ms = {"onnxruntime-fp32": 40.0, "openvino-bf16": 10.0, "onnxruntime-int8-dynamic": 15.0,
          "openvino-bf16-islands": 20.0, "openvino-fp32": 30.0, "onnxruntime-int8-static": 50.0}
    verdict = {"openvino-bf16": False, "onnxruntime-int8-dynamic": False, "openvino-bf16-islands": True}
    run = LoopRun(None, None, {}, lambda m: None, None, tmp_path, 0.0)
    run.recipes = BY_NAME
    run.records = {n: {"name": n} for n in ms}
    checked = []

    def check(c):
        checked.append(c.name)
        run.records[c.name].update(check="gate", passed=verdict[c.name])
        return verdict[c.name]

    run.check = check
    timing = {"engine_ms": {n: {"median": v} for n, v in ms.items()}}
    assert run.fastest_passing(list(ms), timing, "onnxruntime-fp32") == "openvino-bf16-islands"
    assert checked == ["openvino-bf16", "onnxruntime-int8-dynamic", "openvino-bf16-islands"]
    assert "openvino-bf16-islands" in run.records["openvino-fp32"]["skipped"]
    assert "skipped" in run.records["onnxruntime-int8-static"] and "skipped" not in run.records["onnxruntime-fp32"]
    # nothing passes: every recipe faster than the baseline is checked, the baseline stays the winner
    verdict.update({"openvino-bf16-islands": False, "openvino-fp32": False})
    run.records, checked[:] = {n: {"name": n} for n in ms}, []
    assert run.fastest_passing(list(ms), timing, "onnxruntime-fp32") == "onnxruntime-fp32"
    assert checked == ["openvino-bf16", "onnxruntime-int8-dynamic", "openvino-bf16-islands", "openvino-fp32"]
    assert "onnxruntime-fp32, which passed" in run.records["onnxruntime-int8-static"]["skipped"]



def test_slates_without_ids_follow_the_id_rule_and_overlap_is_checked_only_when_nncf_validates(standard_export_dir,
                                                                                               tmp_path):
    """Validation slates come after the gate's in the input: one without ``slate_id`` is named by that index
    (the project's id rule), so it never collides with a gate slate; an explicit id shared with the gate does.
    The overlap is checked only when an accuracy-control recipe is going to be built."""
    from hllm.calibration.recipes.table import check_validation
    from hllm.calibration.selection.loop import LoopRequest
    from hllm.calibration.selection.select import select
    from hllm.errors import SlateError
    from hllm.verify.gate import GateThresholds

    plain = [{k: v for k, v in s.items() if k != "slate_id"} for s in tiny_slates(5, (3, 6), seed=33)]
    check_validation(plain[3:], plain[:3])  # named "3", "4" after the gate's "0", "1", "2"
    with pytest.raises(SlateError, match="1 validation slate.*'1'"):
        check_validation([{**plain[3], "slate_id": "1"}], plain[:3])  # an explicit id equal to a gate slate's
    # NNCF not requested: an overlap is no reason to stop the run
    named = [{**s, "slate_id": f"s{i}"} for i, s in enumerate(plain[:3])]
    req = LoopRequest(standard_export_dir, tmp_path / "sel", GateThresholds(), named, only=("onnxruntime-fp32",),
                        threads=1, validation_slates=named)
    assert select(req)[0].selected == "onnxruntime-fp32"


def test_a_recipe_that_cannot_be_timed_is_recorded_and_the_rest_are_timed(standard_export_dir, tmp_path):
    """One built recipe whose graph is broken ends neither the timing nor the run: its record says why."""
    import shutil

    from hllm.calibration.selection.loop import LoopRequest, LoopRun
    from hllm.verify.gate import GateThresholds

    good, broken = tmp_path / "good", tmp_path / "broken"
    shutil.copytree(standard_export_dir, good)
    shutil.copytree(standard_export_dir, broken)
    (broken / "model.onnx").write_bytes(b"not onnx")
    built = {"onnxruntime-fp32": standard_export_dir, "onnxruntime-fused-fp32": good, "onnxruntime-int8-dynamic": broken}
    req = LoopRequest(standard_export_dir, tmp_path / "o", GateThresholds(), tiny_slates(3, (2, 5), seed=34),
                        rounds=2, warmup=0, threads=1)
    said = []
    run = LoopRun(req, None, {}, said.append, None, tmp_path, 0.0)
    run.records = {n: {"name": n} for n in built}
    records = list(run.records.values())
    sp = run.time(built, "onnxruntime-fp32")
    assert set(sp["engine_ms"]) == {"onnxruntime-fp32", "onnxruntime-fused-fp32"} and "onnxruntime-int8-dynamic" not in built
    assert records[2]["error"].startswith("timing: ") and "engine_ms_median" not in records[2]
    assert all(r["engine_ms_median"] > 0 for r in records[:2])
    assert any("onnxruntime-int8-dynamic: cannot be timed" in m for m in said)
