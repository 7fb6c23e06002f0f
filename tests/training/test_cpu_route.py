"""The resumable CPU route: scripts/cpu_train.sh run on a tiny model accumulates across runs (the cache is not
recomputed, training continues from its saved step), and ``hllm train-status`` reports slates done and an
ETA from the files alone, for a finished and an unfinished cache and a checkpoint."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hllm.errors import CheckpointError
from hllm.formats.prompt import PromptSpec
from hllm.runtime.slates import read_slates
from hllm.training.features import build_cache
from hllm.training.status import cache_status, hours, training_status
from hllm.training.trainer import train
from tests.conftest import train_config
from tests.training.conftest import run as _run

ROOT = Path(__file__).resolve().parents[2]
SH = ROOT / "scripts" / "cpu_train.sh"


def test_script_accumulates_across_runs_and_reports_status(backbones, train_file, tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "BACKBONE": str(backbones["llama"]), "TRAIN": str(train_file),
           "WORK": str(tmp_path / "w"), "OBJECTIVE": "clicks", "LIMIT": "6", "VAL": "2", "RANK": "2",
           "LORA_LAYERS": "1", "BATCH": "2", "SAVE_EVERY": "1", "PRECISION": "fp32", "THREADS": "1"}

    def sh(mode, **kw):
        return subprocess.run(["bash", str(SH), mode], cwd=ROOT, env={**env, **kw}, capture_output=True, text=True,
                              timeout=600)

    r = sh("run", STEPS="2")
    assert r.returncode == 0, r.stderr[-3000:]
    cache = tmp_path / "w" / "feat-L1"
    mtimes = {p.name: p.stat().st_mtime_ns for p in cache.glob("*.npz")}
    assert len(mtimes) == 6
    r = sh("run", STEPS="4")  # a second run continues: same cache files, training resumed at step 2
    assert r.returncode == 0, r.stderr[-3000:]
    assert {p.name: p.stat().st_mtime_ns for p in cache.glob("*.npz")} == mtimes
    state = json.loads((tmp_path / "w" / "ckpt" / "training_state.json").read_text())
    assert state["step"] == 4 and len(state["losses"]) == 4 and state["train_s"] > 0
    r = sh("status")
    assert r.returncode == 0, r.stderr
    assert "6 / 6 slates (layer 1, fp32, complete)" in r.stdout and "step 4 / 4" in r.stdout and "ETA 0 s" in r.stdout
    r = subprocess.run(["bash", str(SH), "bogus"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("cpu_train: give start, status or run")


def test_status_of_an_unfinished_cache_and_a_checkpoint(backbones, train_file, tmp_path, capsys):
    bb = backbones["llama"]
    slates = read_slates(train_file)

    def stop_after_two(done, total):
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_cache(bb, slates, tmp_path / "c", 1, PromptSpec().to_dict(), 8, threads=1, on_progress=stop_after_two)
    for i, p in enumerate(sorted((tmp_path / "c").glob("*.npz"))):  # slates written 10 s apart
        os.utime(p, (1000.0 + 10 * i, 1000.0 + 10 * i))
    c = cache_status(tmp_path / "c", now=1100.0)
    assert (c["slates_done"], c["slates_total"], c["complete"]) == (2, 6, False)
    assert c["s_per_slate"] == 10.0 and c["slates_per_hour"] == 360.0 and c["eta_s"] == 40
    assert c["last_write_age_s"] == 90 and c["precision"] == "fp32"

    res = train(train_config(bb, train_file, tmp_path / "ck", steps=4, save_every=2, val_slates=2, val_every=2))
    t = training_status(tmp_path / "ck")
    assert (t["step"], t["steps"], t["slates_per_step"], t["slates_seen"], t["train_slates"]) == (4, 4, 2, 8, 4)
    assert t["epochs"] == 2.0 and t["eta_s"] == 0 and t["s_per_step"] > 0
    assert t["loss_last10"] == pytest.approx(sum(res.losses) / 4, abs=1e-4) and t["validation_last"]["step"] == 4

    code, out, err = _run(["train-status", str(tmp_path / "ck"), "--features", str(tmp_path / "c"), "--json"], capsys)
    assert code == 0, err
    rec = json.loads(out)
    assert rec["cache"]["slates_done"] == 2 and rec["training"]["step"] == 4
    assert "2 / 6 slates" in err and "step 4 / 4" in err
    code, _, err = _run(["train-status", str(tmp_path / "nothing")], capsys)
    assert code == 2 and "no training_state.json" in err
    code, _, err = _run(["train-status"], capsys)
    assert code == 2 and "give CKPT" in err
    with pytest.raises(CheckpointError, match="not a feature cache"):
        cache_status(tmp_path)
    assert [hours(x) for x in (None, 42, 750, 36000)] == ["?", "42 s", "12.5 min", "10.0 h"]


@pytest.mark.parametrize("args,env,says", [
    (["status", "extra"], {}, "cpu_train: give one of start, status or run, nothing else (got: status extra)"),
    (["status"], {"LORA_LAYERS": "abc"}, "cpu_train: LORA_LAYERS must be a whole number (got 'abc')"),
    (["status"], {"LORA_LAYERS": "4"}, "cpu_train: LORA_LAYERS (4) must be below the backbone's 4 layers"),
    (["run"], {"BATCH": "0"}, "cpu_train: BATCH must be at least 1 (got 0)"),
    (["run"], {"LIMIT": "1e3"}, "cpu_train: LIMIT must be a whole number (got '1e3')"),
    (["run"], {"VAL": "12", "LIMIT": "12"}, "cpu_train: VAL (12 validation slates) must be below LIMIT (12)"),
    (["run"], {"EPOCHS": "1)+print('x'"}, "cpu_train: EPOCHS must be a positive number"),
    (["run"], {"STEPS": "-3"}, "cpu_train: STEPS must be a whole number (got '-3')"),
    (["run"], {"SAVE_EVERY": "0"}, "cpu_train: SAVE_EVERY must be at least 1 (got 0)"),
])
def test_bad_arguments_and_numbers_exit_2_naming_them(tmp_path, args, env, says):
    bb = tmp_path / "bb"
    bb.mkdir()
    (bb / "config.json").write_text(json.dumps({"num_hidden_layers": 4}))
    base = {**os.environ, "PYTHON": sys.executable, "BACKBONE": str(bb), "WORK": str(tmp_path / "w"),
            "TRAIN": str(tmp_path / "missing.jsonl")}
    r = subprocess.run(["bash", str(SH), *args], cwd=ROOT, env={**base, **env}, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and r.stderr.startswith(says) and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "w").exists()


def test_a_layer_count_is_never_evaluated_as_code(tmp_path):
    bb = tmp_path / "bb"
    bb.mkdir()
    (bb / "config.json").write_text(json.dumps({"num_hidden_layers": 4}))
    pwned = tmp_path / "pwned"
    env = {**os.environ, "PYTHON": sys.executable, "BACKBONE": str(bb), "WORK": str(tmp_path / "w"),
           "LORA_LAYERS": f"N_LAYERS[$(touch {pwned})]"}
    r = subprocess.run(["bash", str(SH), "status"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("cpu_train: LORA_LAYERS must be a whole number"), r.stderr
    assert not pwned.exists()
