"""``hllm calibrate --backend B`` and ``--backend auto`` both run the one loop
(:func:`hllm.calibration.selection.loop.run_loop`): B's recipe (or its ladder) in order, the recipe table
fastest first; ``--recipe`` picks recipes of the table and ``--candidate`` is its deprecated spelling."""

from __future__ import annotations

import json

import pytest

from hllm.calibration.selection import select as select_module
from hllm.cli import main
from hllm.runtime.slates import write_jsonl
from hllm.testing import tiny_slates


def _run(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in argv])
    cap = capsys.readouterr()
    return e.value.code, cap.err


def test_plain_and_auto_calibrate_go_through_the_one_loop(export_dir, tmp_path, capsys, monkeypatch):
    real, calls = select_module.run_loop, []

    def spy(req, recipes, write_report, say, progress):
        seen = []

        def listed(run):  # the recipes the loop is given, as it takes them
            for c in (recipes(run) if callable(recipes) else recipes):
                seen.append(c.name)
                yield c

        calls.append((req.fastest_first, seen))
        return real(req, listed, write_report, say, progress)

    monkeypatch.setattr(select_module, "run_loop", spy)
    ev = write_jsonl(tmp_path / "eval.jsonl", tiny_slates(4, (2, 6), seed=41))
    gate = ["--min-tau", "-1", "--max-regret-p95", "1", "--auc-margin", "1", "--ndcg10-margin", "1",
            "--recall10-margin", "1", "--threads", "1"]
    code, err = _run(["calibrate", export_dir, tmp_path / "plain", "--backend", "ort-dynamic", "-s", ev, "-x", "head",
                      "--report", tmp_path / "plain.json", *gate], capsys)
    assert code == 0, err
    plain = json.loads((tmp_path / "plain.json").read_text())
    assert plain["kind"] == "calibration" and plain["passed"] and plain["excluded_parts"] == ["head"]
    assert plain["gate"]["quantized_nodes"] > 0 and (tmp_path / "plain" / "calibration_report.json").is_file()
    assert calls == [(False, ["ort-dynamic+head"])]
    code, err = _run(["calibrate", export_dir, tmp_path / "auto", "--backend", "auto", "-s", ev, "--bench-runs", "2",
                      "--bench-warmup", "0", "--recipe", "onnxruntime-int8-dynamic", "--report", tmp_path / "auto.json",
                      *gate], capsys)
    assert code == 0, err
    auto = json.loads((tmp_path / "auto.json").read_text())
    from hllm.calibration.recipes.table import RECIPES

    assert calls[1] == (True, [c.name for c in RECIPES])
    rec = {r["name"]: r for r in auto["recipes"]}
    assert "candidates" not in auto and auto["selected"] in ("onnxruntime-fp32", "onnxruntime-int8-dynamic")
    assert rec["onnxruntime-int8-dynamic"]["build_s"] >= 0 and rec["onnxruntime-int8-dynamic"]["quantized_nodes"] > 0
    assert rec["openvino-fp32"]["refused"] == "not requested (--recipe)" and "deprecated" not in err


def test_candidate_is_a_deprecated_spelling_of_recipe(export_dir, tmp_path, capsys):
    ev = write_jsonl(tmp_path / "eval.jsonl", tiny_slates(3, (2, 5), seed=42))
    code, err = _run(["calibrate", export_dir, tmp_path / "o", "--backend", "auto", "-s", ev, "--candidate",
                      "onnxruntime-fp32", "--threads", "1", "--report", tmp_path / "r.json"], capsys)
    assert code == 0, err
    assert "--candidate is deprecated; use --recipe" in " ".join(err.split())
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["selected"] == "onnxruntime-fp32"
    assert all(r.get("refused") == "not requested (--recipe)" for r in doc["recipes"] if r["name"] != "onnxruntime-fp32")
    # the old spelling is refused with one backend, as the new one is
    code, err = _run(["calibrate", export_dir, tmp_path / "p", "--backend", "ort-dynamic", "-s", ev, "--candidate",
                      "onnxruntime-fp32"], capsys)
    assert code == 2 and "--recipe applies to --backend auto only" in " ".join(err.split())


def test_the_ladder_keeps_one_more_part_in_float_per_recipe(export_dir, tmp_path):
    from hllm.calibration.recipes.options import QuantOptions
    from hllm.calibration.selection.loop import LoopRequest, LoopRun
    from hllm.calibration.selection.select import CalibrateRequest, recipe_ladder

    run = LoopRun(None, None, {}, print, None, tmp_path, 0.0)  # no calibration ranges: the ladder of the graph
    req = CalibrateRequest(LoopRequest(export_dir, tmp_path / "o", None, []), QuantOptions(backend="ort-dynamic",
                           exclude=("head",)), auto=True, max_tries=3)
    auto = {}
    got = [(c.name, c.settings["options"].exclude) for c in recipe_ladder(req, run, auto)]
    assert auto["ladder"] == ["head", "block:1", "block:0"]
    assert got == [("ort-dynamic+head", ("head",)), ("ort-dynamic+head+block:1", ("head", "block:1")),
                   ("ort-dynamic+head+block:1+block:0", ("head", "block:1", "block:0"))]
    req.max_tries = 2
    assert [c.name for c in recipe_ladder(req, run, {})] == ["ort-dynamic+head", "ort-dynamic+head+block:1"]
    req.auto = False
    assert [c.name for c in recipe_ladder(req, run, {})] == ["ort-dynamic+head"]
