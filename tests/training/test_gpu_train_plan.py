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
