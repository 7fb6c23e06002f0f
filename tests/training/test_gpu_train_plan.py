"""scripts/gpu_train.sh on a machine without a GPU: ``--plan`` runs every step of the GPU recipe on the CPU with
a tiny random model (teacher file, LoRA on every layer + head, merge parity, the fp32 check of what is written
under OUT); a real run without a GPU and an unknown option exit 2 with one line."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SH = ROOT / "scripts" / "gpu_train.sh"
SAMPLE = ROOT / "examples" / "beauty-eval-sample.jsonl.gz"


def _env(tmp_path, **kw):
    return {**os.environ, "PYTHON": sys.executable, "TRAIN": str(SAMPLE), "PLAN_WORK": str(tmp_path / "plan"),
            "WORK": str(tmp_path / "work"), "OUT": str(tmp_path / "out"), "HLLM_DEBUG": "", **kw}


def test_plan_runs_every_step_on_a_tiny_model(tmp_path):
    r = subprocess.run(["bash", str(SH), "--plan"], cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "plan" / "out"
    rec = json.loads((out / "gpu_train.json").read_text())
    assert rec["non_fp32_tensors"] == [] and rec["tensors"] > 0 and rec["step"] == 2
    assert rec["compute"]["device"] == "cpu" and rec["train"]["steps"] == 2 and rec["train"]["train_slates"] == 6
    assert (out / "ckpt" / "adapter" / "adapter_model.safetensors").is_file() and (out / "ckpt" / "head.safetensors").is_file()
    assert not (out / "ckpt" / "training_state.safetensors").exists()  # the optimizer state stays in WORK
    merge = json.loads((out / "merge.json").read_text())
    assert merge["max_abs_diff"] <= 1e-4
    arith = json.loads((out / "arithmetic.json").read_text())
    assert arith["lora_rank"] == 4 and arith["tokens_per_epoch"] == 6 * 1350
    assert not (tmp_path / "out").exists()  # the plan writes only under its own work directory


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU machine")
def test_without_a_gpu_or_with_a_bad_option_it_exits_2(tmp_path):
    r = subprocess.run(["bash", str(SH)], cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip().startswith("gpu_train: no NVIDIA GPU")
    r = subprocess.run(["bash", str(SH), "--bogus"], cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip().startswith("gpu_train: unknown option --bogus")


def test_arithmetic_of_the_header():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gpu_train
    finally:
        sys.path.pop(0)
    a = gpu_train.arithmetic(gpu_train.SMOLLM2_135M, 12000, 1350, 1, 64, 790.0, 0.15)
    assert a["backbone"]["decoder_linear_params"] == 106_168_320
    assert a["lora_params"] == 19_537_920 and a["tokens_per_epoch"] == 16_200_000
    assert a["forward_gflop_per_slate"] == pytest.approx(349.6, abs=0.1)
    assert a["train_gflop_per_slate"] == pytest.approx(857.5, abs=0.1) and a["expected_train_s"] == 87


def _sh(tmp_path, *args, **kw):
    return subprocess.run(["bash", str(SH), *args], cwd=ROOT, env=_env(tmp_path, **kw), capture_output=True,
                          text=True, timeout=60)


def _victim(tmp_path):
    v = tmp_path / "victim"
    v.mkdir()
    (v / "slates.jsonl").write_bytes(SAMPLE.read_bytes())
    (v / "other.txt").write_text("keep me")
    return v


def test_plan_never_deletes_a_folder_it_did_not_make(tmp_path):
    v = _victim(tmp_path)
    for train, says in ((v / "slates.jsonl", "holds TRAIN"), (SAMPLE, "was not made by this script")):
        r = _sh(tmp_path, "--plan", PLAN_WORK=str(v), TRAIN=str(train), PYTHON="/bin/false")
        assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert sorted(p.name for p in v.iterdir()) == ["other.txt", "slates.jsonl"]
        assert (v / "other.txt").read_text() == "keep me" and (v / "slates.jsonl").read_bytes() == SAMPLE.read_bytes()
    home = tmp_path / "home"
    (home / "keep").mkdir(parents=True)
    for work, says in ((ROOT, "holds TRAIN"), (home, "holds HOME"), (tmp_path, "holds HOME")):
        r = _sh(tmp_path, "--plan", PLAN_WORK=str(work), HOME=str(home), PYTHON="/bin/false")
        assert r.returncode == 2 and says in r.stderr, r.stderr
    assert (ROOT / "pyproject.toml").is_file() and (home / "keep").is_dir()


def test_gpu_work_folder_is_checked_before_anything_is_written(tmp_path):
    v = _victim(tmp_path)
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "nvidia-smi").write_text("#!/bin/sh\necho stub GPU\n")
    (bin_ / "nvidia-smi").chmod(0o755)
    r = _sh(tmp_path, WORK=str(v), PYTHON="/bin/true", WHEELS=str(tmp_path / "none"),
            PATH=f"{bin_}:{os.environ['PATH']}")
    assert r.returncode == 2 and "WORK=" in r.stderr and "was not made by this script" in r.stderr, r.stderr
    assert sorted(p.name for p in v.iterdir()) == ["other.txt", "slates.jsonl"]


def test_plan_replaces_only_its_own_folder_and_stops_when_the_tiny_step_fails(tmp_path):
    own = tmp_path / "plan"
    own.mkdir()
    (own / ".gpu_train-work").touch()
    (own / "stale.txt").write_text("from an earlier plan")
    r = _sh(tmp_path, "--plan", PYTHON="/bin/false")
    assert r.returncode == 2 and r.stderr.strip() == "gpu_train: --plan: the tiny-model step failed " \
        "(/bin/false scripts/gpu_train.py tiny)", r.stderr
    assert sorted(p.name for p in own.iterdir()) == [".gpu_train-work"]  # replaced; nothing after the tiny step ran
    empty = tmp_path / "empty"
    empty.mkdir()
    r = _sh(tmp_path, "--plan", PLAN_WORK=str(empty), PYTHON="/bin/false")
    assert r.returncode == 2 and "tiny-model step failed" in r.stderr  # an empty folder is adopted
    assert sorted(p.name for p in empty.iterdir()) == [".gpu_train-work"]


@pytest.mark.parametrize("args,env,says", [
    (["--plan", "--fetch-wheels"], {}, "gpu_train: one option at most"),
    (["--plan"], {"BATCH": "0"}, "gpu_train: BATCH must be at least 1"),
    (["--plan"], {"LIMIT": "12k"}, "gpu_train: LIMIT must be a whole number"),
    (["--plan"], {"VAL": "200", "LIMIT": "200"}, "gpu_train: VAL (200 validation slates) must be below LIMIT"),
    (["--plan"], {"EPOCHS": "1+__import__('os').getpid()"}, "gpu_train: EPOCHS must be a positive number"),
    (["--plan"], {"LR": "0"}, "gpu_train: LR must be a positive number"),
])
def test_bad_arguments_and_numbers_exit_2_naming_them(tmp_path, args, env, says):
    r = _sh(tmp_path, *args, PYTHON="/bin/false", **env)
    assert r.returncode == 2 and r.stderr.startswith(says) and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "plan").exists()


def test_check_replaces_only_an_out_ckpt_it_wrote(tmp_path, capsys):
    import torch
    from safetensors.torch import save_file

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gpu_train
    finally:
        sys.path.pop(0)
    ck = tmp_path / "ckpt"
    (ck / "adapter").mkdir(parents=True)
    (ck / "hllm.json").write_text(json.dumps({"provenance": {"step": 3}}))
    save_file({"w": torch.ones(2, 3)}, str(ck / "head.safetensors"))
    save_file({"a": torch.zeros(4)}, str(ck / "adapter" / "adapter_model.safetensors"))
    out = tmp_path / "out"
    (out / "ckpt").mkdir(parents=True)
    (out / "ckpt" / "mine.txt").write_text("keep me")
    assert gpu_train.main(["check", str(ck), str(out)]) == 2
    assert "not written by gpu_train check" in capsys.readouterr().err
    assert (out / "ckpt" / "mine.txt").read_text() == "keep me"
    assert gpu_train.main(["check", str(ck), str(tmp_path)]) == 2  # OUT/ckpt is the checkpoint itself
    assert "overlaps the checkpoint" in capsys.readouterr().err and (ck / "head.safetensors").is_file()
    out2 = tmp_path / "out2"
    for _ in range(2):  # the second run replaces what the first wrote
        assert gpu_train.main(["check", str(ck), str(out2)]) == 0
    assert sorted(p.name for p in (out2 / "ckpt").iterdir()) == [".gpu_train-ckpt", "adapter", "head.safetensors", "hllm.json"]
    rec = json.loads((out2 / "gpu_train.json").read_text())
    assert rec["tensors"] == 2 and rec["params"] == 10 and rec["step"] == 3 and rec["non_fp32_tensors"] == []
