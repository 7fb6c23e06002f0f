"""A head that reads the user context (graph input ``context_positions``) on every command path: rank, parity,
eval, calibrate (ort-static, ort-dynamic, ort-weight-only, a saved set), encode. The export's rankings are
compared with the PyTorch checkpoint's, so a path that dropped or moved the context position would fail."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hllm.cli import main
from hllm.errors import ShapeError
from hllm.formats.graph import feed_dict
from hllm.runtime import Ranker, write_jsonl
from hllm.testing import tiny_slates

FOUR = ["input_ids", "readout_positions", "item_mask", "context_positions"]


def _run(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in argv])
    cap = capsys.readouterr()
    return e.value.code, cap.out, cap.err


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("ctx-slates")
    train = [dict(s, slate_id=f"train-{i}") for i, s in enumerate(tiny_slates(12, (2, 8), seed=31))]
    evals = [dict(s, slate_id=f"eval-{i}") for i, s in enumerate(tiny_slates(10, (2, 8), seed=32))]
    return {"train": write_jsonl(d / "train.jsonl", train), "eval": write_jsonl(d / "eval.jsonl", evals), "evals": evals}


def _orders(path) -> list[list[int]]:
    return [json.loads(line)["order"] for line in path.read_text().splitlines()]


def test_rank_parity_eval_read_the_context(context_checkpoint, context_export_dir, files, tmp_path, capsys):
    for name, model in (("onnx", context_export_dir), ("torch", context_checkpoint)):
        code, _, err = _run(["rank", model, "-s", files["eval"], "-o", tmp_path / f"{name}.jsonl", "-b", "3"], capsys)
        assert code == 0, err
    assert _orders(tmp_path / "onnx.jsonl") == _orders(tmp_path / "torch.jsonl")
    with Ranker.from_path(context_checkpoint) as ranker:  # independent: the engine fed by hand, context moved
        b = ranker.builder.encode(files["evals"][:2])
        moved = ranker.engine.run(b.input_ids, b.readout_positions, b.item_mask, b.context_positions - 1)
        same = ranker.engine.run(b.input_ids, b.readout_positions, b.item_mask, b.context_positions)
    assert not np.allclose(moved, same)  # so equal orders above mean the context position travelled
    code, out, err = _run(["parity", context_checkpoint, context_export_dir, "-s", files["eval"], "--json"], capsys)
    assert code == 0, err
    rep = json.loads(out)
    assert rep["passed"] is True and rep["max_abs_diff"] <= 1e-4
    code, out, err = _run(["eval", context_checkpoint, context_export_dir, "-s", files["eval"], "--json"], capsys)
    assert code == 0, err
    metrics = json.loads(out)["rankers"]
    a, b = (metrics[k] for k in metrics)
    assert a["ndcg@10"] == pytest.approx(b["ndcg@10"], abs=1e-9) and a["recall@1"] == b["recall@1"] and a["auc"] == pytest.approx(b["auc"])


@pytest.mark.parametrize("backend", ["ort-static", "ort-dynamic", "ort-weight-only"])
def test_calibrate_every_ort_backend_on_a_context_head(context_export_dir, files, backend, tmp_path, capsys):
    out = tmp_path / backend
    code, _, err = _run(["calibrate", context_export_dir, "-o", out, "--backend", backend, "--calib-slates", files["train"],
                         "--calib-count", "6", "--calib-batch-size", "2", "--eval-slates", files["eval"],
                         "--min-top1", "0", "--max-recall10-delta", "1", "--min-tau", "-1",
                         "--report", tmp_path / "r.json", *(["--bench-runs", "2"] if backend == "ort-dynamic" else [])],
                        capsys)
    assert code == 0, err
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["passed"] is True and rep["backend"] == backend and rep["precision"] == "int8"
    assert rep == json.loads((out / "calibration_report.json").read_text())
    if backend == "ort-dynamic":  # the interleaved speed run is recorded (its figures are not asserted)
        assert set(rep["speed"]["speedup_vs_fp32"]) == {"fp32", "int8"} and rep["speedup_vs_fp32"] > 0 and rep["machine"]
    side = json.loads((out / "export.json").read_text())
    assert [t["name"] for t in side["inputs"]] == FOUR
    with Ranker.from_path(out) as q, Ranker.from_path(context_export_dir) as fp32:
        got = q.rank(files["evals"][:3])
        want = fp32.rank(files["evals"][:3])
    assert [len(r.order) for r in got] == [len(r.order) for r in want]
    if backend == "ort-static":  # the drawn set holds the fourth input and reloads with it
        from hllm.formats.calibration_set import load_calibration_set

        saved = load_calibration_set(out / "calibration")
        assert saved.inputs == tuple(FOUR) and all(list(b) == FOUR for b in saved.batches)
        assert all(b["context_positions"].shape == (b["input_ids"].shape[0],) for b in saved.batches)


def test_calibration_set_without_context_positions_is_refused(context_export_dir, export_dir, files, tmp_path, capsys):
    from hllm.calibration.data import build_calibration_set
    from hllm.runtime.artefact import resolve
    from hllm.runtime.prompt import PromptBuilder, load_tokenizer

    art = resolve(export_dir)
    builder = PromptBuilder(load_tokenizer(art.tokenizer_path), art.prompt, max_items=8)
    from hllm.runtime.slates import read_slates

    three = build_calibration_set(read_slates(files["train"]), builder, count=4, seed=0, graph_inputs=art.graph_inputs)
    three.save(tmp_path / "three")
    code, _, err = _run(["calibrate", context_export_dir, "-o", tmp_path / "q", "--calibration", tmp_path / "three",
                         "--eval-slates", files["eval"]], capsys)
    assert code == 2 and "context_positions" in err and "Traceback" not in err
    assert not (tmp_path / "q").exists()
    with pytest.raises(ShapeError, match="context_positions"):
        feed_dict(resolve(context_export_dir).graph_inputs, three.batches[0])


def test_encode_writes_all_four_inputs(context_export_dir, files, tmp_path, capsys):
    from hllm.engines.ort import OnnxRuntimeEngine
    from hllm.engines.tensorrt.interop import read_polygraphy_inputs

    code, out, err = _run(["encode", context_export_dir, "-s", files["eval"], "-o", tmp_path / "in.json", "-b", "4",
                           "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["inputs"] == FOUR
    feeds = read_polygraphy_inputs((tmp_path / "in.json").read_text())
    with OnnxRuntimeEngine(context_export_dir / "model.onnx", 8, context=True) as eng, \
            Ranker.from_path(context_export_dir) as ranker:
        scores = eng.run(*(feeds[0][n] for n in FOUR))
        want = ranker.scores(ranker.builder.encode(files["evals"][:4]))
    np.testing.assert_allclose(scores, want, atol=1e-6)
