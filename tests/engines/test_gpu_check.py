"""scripts/gpu_check.{sh,py} on a machine without a GPU: the checks fail fast with one line and exit code 2,
the plan of a run is printed and checked, and the paper-shape model builds and scores (tiny, on CPU)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
SH = ROOT / "scripts" / "gpu_check.sh"
CKPT, SLATES = "checkpoints/smollm2-beauty", "examples/beauty-eval-sample.jsonl.gz"


def _run(args, env=None, script=SCRIPT):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": "", **(env or {})}
    cmd = [sys.executable, str(script), *args] if script.suffix == ".py" else ["bash", str(script), *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args", [["proxy", "--checkpoint", CKPT, "--slates", SLATES],
                                  ["paper-latency"]])
def test_gpu_steps_fail_fast_without_a_gpu(args, tmp_path):
    r = _run(args + ["-o", str(tmp_path / "x.json")])
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check: no CUDA GPU") and "Traceback" not in r.stderr
    assert not (tmp_path / "x.json").exists()


def test_plan_is_checked_and_printed():
    r = _run(["plan", "--checkpoint", CKPT, "--slates", SLATES])
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    proxy, paper, summary = plan["steps"]
    assert proxy["precisions"] == ["fp32", "fp16", "bf16"] and proxy["slates"] >= 100 and proxy["n_items"] == 50
    assert (paper["layers"], paper["hidden"], paper["seq"], paper["n_items"]) == (28, 1024, 1350, 50)
    assert proxy["out"].startswith("results/gpu/") and paper["out"] == "results/gpu/paper_latency.json"
    assert plan["paper_ms"]["hllm"] == 28.0 and plan["budget_s"] <= 480
    r = _run(["plan", "--checkpoint", "nowhere", "--slates", SLATES, "--limit", "10"])
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == ("gpu_check plan: checkpoint not found: nowhere; "
                                "--limit must be 100..5000 real slates (got 10)")
    r = _run(["plan", "--precisions", "fp16,fp8"])
    assert r.returncode == 2 and r.stderr.strip() == "gpu_check: --precisions takes fp16,bf16, got ['fp8']"


def test_shell_script_fails_fast_and_plans(tmp_path):
    bin_dir = tmp_path / "bin"  # a PATH with bash and coreutils but no nvidia-smi
    bin_dir.mkdir()
    for tool in ("bash", "env", "grep", "mkdir", "ls", "dirname", "cat"):
        if shutil.which(tool):
            (bin_dir / tool).symlink_to(shutil.which(tool))
    env = {"PATH": str(bin_dir), "PYTHON": sys.executable}
    r = _run(["--proxy"], env=env, script=SH)
    assert r.returncode == 2 and r.stderr.strip() == "gpu_check: no NVIDIA GPU (nvidia-smi missing)"
    r = _run(["--bogus"], env=env, script=SH)
    assert r.returncode == 2 and r.stderr.strip().startswith("gpu_check: unknown option --bogus")
    r = _run(["--plan"], env={**env, "LIMIT": "120"}, script=SH)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["steps"][0]["slates"] == 120


def test_paper_shape_model_scores_on_cpu():
    """The paper-shape model builder at toy size (2 layers, hidden 64): scores [1, N, K] float32, finite."""
    import torch

    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model = mod.paper_model(2, 64, "fp32", "cpu", k=8)
    assert model.num_layers == 2 and model.backbone.config.vocab_size == 151936
    ids = torch.randint(0, 151936, (1, 40))
    with torch.inference_mode():
        out = model(ids, torch.arange(30, 38).view(1, 8), torch.ones(1, 8, dtype=torch.bool))
    assert out.shape == (1, 8, 8) and out.dtype == torch.float32 and torch.isfinite(out).all()
    half = mod.paper_model(1, 64, "bf16", "cpu", k=8)
    assert half.head.out.weight.dtype == torch.float32  # the scores island
    assert next(half.backbone.parameters()).dtype == torch.bfloat16
