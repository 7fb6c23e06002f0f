"""CLI hardening found by hostile inputs (docs/hardening.md, "CLI hostile inputs"): islands that
name nothing, cache folders the features cache did not make, the empty slates value, corrupt optimizer state,
hostile benchmark labels and frontiers where every contender was refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hllm.errors import ExportError
from hllm.testing import tiny_slates
from tests.cli.conftest import run


def _slates_file(path, n=2):
    path.write_text("".join(json.dumps(s) + "\n" for s in tiny_slates(n, (2, 6), seed=3)))
    return path


# ---------------------------------------------------------------- islands that name nothing


def test_an_island_that_names_no_node_is_refused_by_both_rewrites(standard_export_dir):
    from hllm.exporter.bf16 import convert_to_bf16
    from hllm.exporter.fp16 import convert_to_fp16
    from hllm.exporter.onnx_io import load_onnx

    model = load_onnx(standard_export_dir / "model.onnx")
    with pytest.raises(ExportError, match=r"\['backbone\.layers\.99\.mlp'\] name no node .*backbone\.layers\.0…1"):
        convert_to_fp16(model, ("rmsnorm", "backbone.layers.99.mlp"))
    with pytest.raises(ExportError, match=r"\['backbone\.layers\.1\.mlpp'\] name no matrix product"):
        convert_to_bf16(model, ("head", "backbone.layers.1.mlpp"))
    # islands that name modules of the graph (nested ones too) keep their nodes in float32
    _, rep = convert_to_fp16(model, ("backbone.layers.1", "backbone.layers.1.mlp"))
    assert rep.island_nodes.get("backbone.layers.1", 0) > 0
    _, rep = convert_to_bf16(model, ("backbone.layers.1.mlp",))
    assert rep.by_class["down_proj"] == {"bf16": 1, "fp32": 1}  # two layers: the island keeps one


def test_export_refuses_an_fp32_island_beyond_the_models_layers(merged_checkpoint, tmp_path, capsys):
    out = tmp_path / "e"
    code, _, err = run(["export", str(merged_checkpoint), str(out), "--precision", "fp16",
                        "--fp32-islands", "rmsnorm,backbone.layers.99.mlp", "-s", ""], capsys)
    assert code == 2, err
    assert "backbone.layers.99.mlp" in err and "name no node" in err
    assert not out.exists()


@pytest.mark.parametrize("value", ["", ",", " ", "rmsnorm,,softmax", "none,backbone.layers.0.mlp"])
def test_an_empty_island_entry_or_none_beside_islands_is_refused(merged_checkpoint, standard_export_dir, tmp_path,
                                                                 capsys, value):
    """`--fp32-islands ''` (an unset shell variable), a stray comma or 'none' beside islands: exit 2 naming the
    value, nothing written (exported an FP16 graph with no FP32 island, or dropped the 'none'); the same for
    `--bf16-base` and an islands file. 'none' alone still means no island."""
    from hllm.exporter.bf16 import parse_islands as bf16_islands
    from hllm.exporter.fp16 import parse_islands, read_islands_file

    out = tmp_path / "e"
    code, _, err = run(["export", str(merged_checkpoint), str(out), "--precision", "fp16", "--fp32-islands", value,
                        "-s", ""], capsys)
    assert code == 2, err
    assert repr(value.strip() if value.strip() in ("", ",") else value) in err or repr(value) in err, err
    assert not out.exists()
    code, _, err = run(["debug", "precision", str(standard_export_dir), "--precision", "bf16", "--bf16-runner",
                        "emulate", "--bf16-base", value, "-s", str(_slates_file(tmp_path / "s.jsonl")),
                        "-o", str(tmp_path / "i.json")], capsys)
    assert code == 2 and "--bf16-base" in err, err
    assert not (tmp_path / "i.json").exists()
    f = tmp_path / "islands.json"
    f.write_text(json.dumps({"islands": value.split(",")}))
    with pytest.raises(ExportError, match="islands file"):
        read_islands_file(f)
    assert parse_islands("none") == () and bf16_islands("none") == () and bf16_islands([]) == ()


def test_debug_precision_refuses_a_bf16_base_island_that_names_nothing(standard_export_dir, tmp_path, capsys):
    src = _slates_file(tmp_path / "s.jsonl")
    code, _, err = run(["debug", "precision", str(standard_export_dir), "--precision", "bf16", "--bf16-runner",
                        "emulate", "--bf16-base", "head,backbone.layers.99", "-s", str(src),
                        "-o", str(tmp_path / "i.json")], capsys)
    assert code == 2, err
    assert "backbone.layers.99" in err and "name no matrix product" in err
    assert not (tmp_path / "i.json").exists()


def test_calibrate_refuses_a_bf16_islands_file_that_names_nothing(standard_export_dir, tmp_path, capsys):
    f = tmp_path / "islands.json"
    f.write_text(json.dumps({"format": "hllm-fp32-islands", "target": "bf16",
                             "islands": ["head", "backbone.layers.99.mlp"]}))
    src = _slates_file(tmp_path / "s.jsonl")
    code, _, err = run(["calibrate", str(standard_export_dir), str(tmp_path / "q"), "--backend", "auto",
                        "-s", str(src), "--bf16-islands", str(f)], capsys)
    assert code == 2, err
    assert "backbone.layers.99.mlp" in err and "name no matrix product" in err
    assert not (tmp_path / "q").exists()


# ---------------------------------------------------------------- feature caches in folders they did not make


@pytest.mark.parametrize("content", ["stray-slate", "export", "junk-manifest"])
def test_features_refuses_a_folder_it_did_not_make(qwen3_backbone, tmp_path, capsys, content):
    import numpy as np

    src = _slates_file(tmp_path / "s.jsonl")
    d = tmp_path / "cache"
    d.mkdir()
    if content == "stray-slate":  # would have counted as cached slate 0, and the cache as complete
        np.savez(d / "00000.npz", hidden=np.zeros((3, 4), np.float32), readout=np.zeros(2, np.int64))
    elif content == "export":
        (d / "export.json").write_text("{}")
    else:
        (d / "partial.json").write_text("[1, 2")
    before = sorted(p.name for p in d.iterdir())
    code, _, err = run(["features", str(qwen3_backbone), str(d), "-s", str(src), "--layer", "1", "-k", "8",
                        "--threads", "1"], capsys)
    assert code == 2, err
    assert ("is not a feature cache" if content != "junk-manifest" else "is not a feature cache manifest") in err
    assert sorted(p.name for p in d.iterdir()) == before  # nothing written into it


def test_features_resumes_its_own_folder_and_starts_in_an_empty_one(qwen3_backbone, tmp_path, capsys):
    src = _slates_file(tmp_path / "s.jsonl")
    d = tmp_path / "cache"
    d.mkdir()
    argv = ["features", str(qwen3_backbone), str(d), "-s", str(src), "--layer", "1", "-k", "8", "--threads", "1"]
    code, out, err = run(argv, capsys)
    assert code == 0 and "2 slates" in out, err
    code, out, err = run(argv, capsys)  # its own finished cache: opened as it is
    assert code == 0 and "2 slates" in out, err


@pytest.mark.parametrize("done", [True, False])
def test_features_refuses_its_cache_of_the_same_slate_ids_with_other_texts(qwen3_backbone, tmp_path, capsys, done):
    """The slate file edited (same slate ids, other titles): its finished cache was opened as it was and its
    unfinished one resumed, mixing rows of the old texts in. Refused (exit 2), the cache left as it is."""
    src = _slates_file(tmp_path / "s.jsonl")
    d = tmp_path / "cache"
    argv = ["features", str(qwen3_backbone), str(d), "--layer", "1", "-k", "8", "--threads", "1"]
    code, _, err = run([*argv, "-s", str(src)], capsys)
    assert code == 0, err
    if not done:  # an interrupted run: its manifest is partial.json, one slate missing
        meta = json.loads((d / "meta.json").read_text())
        (d / "partial.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "backbone"}))
        (d / "meta.json").unlink()
        (d / "00001.npz").unlink()
    edited = [json.loads(x) for x in src.read_text().splitlines()]
    edited[1]["candidates"][0]["title"] += " edited"
    (tmp_path / "e.jsonl").write_text("".join(json.dumps(x) + "\n" for x in edited))
    before = sorted(p.name for p in d.iterdir())
    code, _, err = run([*argv, "-s", str(tmp_path / "e.jsonl")], capsys)
    assert code == 2, err
    assert "different slate texts under the same ids" in err or "unfinished cache of other slates" in err, err
    assert sorted(p.name for p in d.iterdir()) == before
    code, out, err = run([*argv, "-s", str(src)], capsys)  # the slates it was made from: still its own
    assert code == 0 and "2 slates" in out, err


# ---------------------------------------------------------------- the empty slates value


def test_export_with_empty_slates_skips_them_for_an_output_under_the_working_directory(
        merged_checkpoint, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(["export", str(merged_checkpoint), "sub/e", "-s", ""], capsys)
    assert code == 0, err  # was refused: '' became the path '.', an input every relative OUT_DIR lies inside
    assert (tmp_path / "sub" / "e" / "export.json").is_file() and "exported →" in out
    code, _, err = run(["export", str(merged_checkpoint), "e2", "-s", "."], capsys)
    assert code == 2 and "e2" in err  # '.' is a path (the directory holding OUT_DIR), not the skip
    assert not (tmp_path / "e2").exists()



@pytest.mark.parametrize("out", [".", "..", ""])
def test_export_overwrite_refuses_the_working_directory_and_its_ancestors(merged_checkpoint, tmp_path, monkeypatch,
                                                                           capsys, out):
    """`hllm export CKPT . --overwrite` (or `..`, or '' which is '.'): refused before the work, exit 2 (the export
    ran, then its replacement failed with "Device or resource busy"); nothing there is touched."""
    work = tmp_path / "w" / "sub"
    work.mkdir(parents=True)
    (work / "keep.txt").write_text("mine")
    monkeypatch.chdir(work)
    code, out_text, err = run(["export", str(merged_checkpoint), out, "-s", "", "--overwrite"], capsys)
    assert code == 2, err
    assert "it is the working directory or holds it" in err and "exported" not in out_text, err
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt"] and sorted(p.name for p in work.parent.iterdir()) == ["sub"]

# ---------------------------------------------------------------- benchmark labels and frontiers


def test_bench_chart_cuts_a_3_mb_label_and_says_so(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from hllm.bench.chart import MAX_LABEL
    import json

    doc = json.loads((Path(__file__).resolve().parents[2] / "results" / "bench" / "stages.json").read_text(encoding="utf-8"))
    n = doc["records"][0]["n_items"]
    huge = "x" * 3_000_000
    for r in doc["records"]:
        r["backend"] = huge + str(r.get("backend"))  # distinct labels, each 3 MB
    doc["records"][0].setdefault("machine", {})["cpu"] = huge
    f = tmp_path / "stages.json"
    f.write_text(json.dumps(doc))
    code, _, err = run(["bench", "chart", "--stages", str(f), "-n", str(n), "-o", str(tmp_path / "c.png")], capsys)
    assert code == 0, err
    assert f"longer than {MAX_LABEL} characters were cut" in err
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


def test_chart_labels_are_cut_to_the_limit():
    from hllm.bench.chart import MAX_LABEL, clip_label

    cut: list[str] = []
    assert clip_label("onnxruntime ort-cpu int8", cut) == "onnxruntime ort-cpu int8" and cut == []
    long = "y" * (10 * MAX_LABEL)
    assert clip_label(long, cut) == "y" * (MAX_LABEL - 1) + "…" and cut == ["y" * MAX_LABEL]


def test_bench_frontier_exits_1_when_every_contender_was_refused(merged_checkpoint, standard_export_dir, tmp_path, capsys,
                                                                 monkeypatch):
    from hllm import measure

    monkeypatch.setattr(measure, "cpu_flags", lambda: ["avx2", "avx512f"])  # no bf16 instructions: refused
    src = _slates_file(tmp_path / "s.jsonl", 1)
    out = tmp_path / "f.json"
    code, _, err = run(["bench", "frontier", str(merged_checkpoint), "-c", f"ov-bf16|{standard_export_dir}|openvino|bf16|bf16",
                        "-s", str(src), "--rounds", "1", "--warmup", "0", "--threads", "1", "-o", str(out)], capsys)
    assert code == 1, err
    assert "every contender was refused" in err
    rows = json.loads(out.read_text())["rows"]  # the report still says why
    assert [r["name"] for r in rows] == ["PyTorch fp32 eager", "ov-bf16"] and "AVX512_BF16" in rows[1]["refused"]


# ---------------------------------------------------------------- one slate-id rule in calibration


def test_calibration_names_id_less_slates_by_the_one_id_rule_and_checks_their_overlap():
    from hllm.calibration.data import choose_slates
    from hllm.errors import SlateError
    from hllm.runtime.slates import slate_ids
    from hllm.verify.gate import check_disjoint

    pool = [{k: v for k, v in s.items() if k != "slate_id"} for s in tiny_slates(8, (2, 4), seed=7)]
    evals = pool[:3]  # the gate's slates: "0", "1", "2" by the rule
    assert slate_ids(evals) == ["0", "1", "2"]
    chosen = choose_slates(pool, 5, seed=0, exclude_ids=slate_ids(evals))
    assert sorted(slate_ids(chosen)) == ["3", "4", "5", "6", "7"]  # never an evaluation slate, named as in the input
    check_disjoint(slate_ids(chosen), evals)
    with pytest.raises(SlateError, match=r"1 evaluation slate\(s\) were used for calibration \(e\.g\. \['1'\]\)"):
        check_disjoint(["1", "7"], evals)  # was missed: every id-less slate was "" to the check
