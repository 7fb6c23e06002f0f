"""bf16 autocast in training and feature caching: it trains, saves fp32 tensors, lands near the fp32 loss,
and is refused with exit code 2 where the CPU has no bf16 instructions (the detection is monkeypatched,
so these tests run on any CPU: autocast itself works everywhere, it is only slow without them)."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import hllm.measure
from hllm.errors import CheckpointError, HllmError
from hllm.formats.prompt import PromptSpec
from hllm.runtime.slates import read_slates, write_jsonl
from hllm.testing import tiny_slates
from hllm.training.features import build_cache
from hllm.formats.precision import Precision
from hllm.training.precision import resolve_compute
from hllm.training.trainer import train
from tests.conftest import train_config


@pytest.fixture(scope="module")
def train_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("prec") / "train.jsonl"
    write_jsonl(p, tiny_slates(6, (2, 8), seed=5))
    return p


@pytest.fixture
def cpu_bf16(monkeypatch):
    """This CPU 'has' bf16 instructions, whatever it has."""
    monkeypatch.setattr(hllm.measure, "bf16_support", lambda: (True, "bf16 GEMM instructions: yes (test)"))


@pytest.fixture
def no_bf16(monkeypatch):
    monkeypatch.setattr(hllm.measure, "bf16_support", lambda: (False, "bf16 GEMM instructions: none (CPU features: avx2)"))


def test_resolve_compute(cpu_bf16):
    auto = resolve_compute("auto", "cpu")
    assert auto.precision is Precision.BF16 and auto.to_dict()["precision"] == "bf16"
    assert type(auto.to_dict()["precision"]) is str  # plain JSON string in provenance
    assert resolve_compute("fp32", "cpu").precision is Precision.FP32
    with pytest.raises(HllmError, match="precision must be one of"):
        resolve_compute("fp16", "cpu")


def test_auto_falls_back_to_fp32_and_bf16_is_refused_without_instructions(no_bf16):
    c = resolve_compute("auto", "cpu")
    assert (c.device, c.precision) == ("cpu", "fp32") and "none" in c.reason
    with pytest.raises(HllmError, match=r"--precision bf16 needs bf16 matrix instructions on the CPU .*avx2"):
        resolve_compute("bf16", "cpu")


@pytest.mark.parametrize("family,lora_layers,context", [("llama", None, False), ("qwen3", 1, False),
                                                         ("qwen2", None, True)])
def test_bf16_training_saves_fp32_and_its_loss_is_near_fp32(backbones, train_file, tmp_path, cpu_bf16, family,
                                                              lora_layers, context):
    """bf16 autocast trains (also with a head that reads the user context: ``context_positions``), saves fp32."""
    from tests.conftest import TINY_HEAD

    bb = backbones[family]
    kw = dict(steps=6, save_every=10, lora_layers=lora_layers, device="cpu", head_kwargs={**TINY_HEAD, "context": context})
    a = train(train_config(bb, train_file, tmp_path / "fp32", precision="fp32", **kw))
    b = train(train_config(bb, train_file, tmp_path / "bf16", precision="bf16", **kw))
    assert len(b.losses) == 6 and all(np.isfinite(b.losses))
    # bf16 matmuls keep 8 significant bits: the losses follow the fp32 run closely, but not exactly
    assert b.losses == pytest.approx(a.losses, rel=0.03)
    assert b.losses != a.losses
    for f in ("head.safetensors", "adapter/adapter_model.safetensors", "training_state.safetensors"):
        tensors = load_file(str(tmp_path / "bf16" / f))
        assert tensors and {t.dtype for k, t in tensors.items() if not k.endswith("/step")} == {torch.float32}, f
    head = json.loads((tmp_path / "bf16" / "hllm.json").read_text())["head"]
    assert head.get("context", False) is context, head  # the head reads the user context row
    prov = json.loads((tmp_path / "bf16" / "hllm.json").read_text())["provenance"]
    assert prov["compute"]["precision"] == "bf16" and prov["config"]["precision"] == "bf16"
    prov32 = json.loads((tmp_path / "fp32" / "hllm.json").read_text())["provenance"]
    assert prov32["compute"] == {**prov32["compute"], "device": "cpu", "precision": "fp32"}


def test_a_run_resumes_in_another_precision(backbones, train_file, tmp_path, cpu_bf16):
    bb = backbones["llama"]
    train(train_config(bb, train_file, tmp_path / "r", steps=2, precision="bf16", device="cpu"))
    res = train(train_config(bb, train_file, tmp_path / "r", steps=4, precision="fp32", device="cpu"), resume=True)
    assert len(res.losses) == 4 and res.steps == 4


def test_bf16_feature_cache_is_float32_near_fp32_and_not_mixed(backbones, train_file, tmp_path, cpu_bf16):
    bb = backbones["qwen3"]
    slates = read_slates(train_file)
    prompt = PromptSpec().to_dict()
    a = build_cache(bb, slates, tmp_path / "a", 1, prompt, 8, threads=1, precision="fp32", device="cpu")
    b = build_cache(bb, slates, tmp_path / "b", 1, prompt, 8, threads=1, precision="auto", device="cpu")
    assert (a.precision, b.precision) == ("fp32", "bf16")
    ha, hb = a.get(0).hidden, b.get(0).hidden
    assert hb.dtype == np.float32 and hb.shape == ha.shape
    rel = np.abs(hb - ha).max() / np.abs(ha).max()
    assert 0 < rel < 0.05, rel
    with pytest.raises(CheckpointError, match="different feature cache"):  # the finished fp32 cache, now asked in bf16
        build_cache(bb, slates, tmp_path / "a", 1, prompt, 8, threads=1, precision="bf16", device="cpu")


def _run(argv, capsys):
    from hllm.cli import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    cap = capsys.readouterr()
    return e.value.code, cap.out, cap.err


def test_cli_refuses_bf16_on_a_cpu_without_it(backbones, train_file, tmp_path, capsys, no_bf16):
    bb = str(backbones["llama"])
    code, _, err = _run(["train", bb, str(tmp_path / "ck"), "-s", str(train_file), "-k", "8", "--head-dim", "32",
                         "--head-heads", "4", "--head-ff", "64", "--steps", "1", "--precision", "bf16"], capsys)
    assert code == 2 and "error: --precision bf16 needs bf16 matrix instructions" in err and "Traceback" not in err
    assert not (tmp_path / "ck" / "hllm.json").exists()
    code, _, err = _run(["features", bb, str(tmp_path / "f"), "-s", str(train_file), "--layer", "1", "-k", "8",
                         "--precision", "bf16"], capsys)
    assert code == 2 and "needs bf16 matrix instructions" in err
    code, _, err = _run(["train", bb, str(tmp_path / "ck2"), "-s", str(train_file), "--precision", "fp8"], capsys)
    assert code == 2 and "precision must be one of auto, fp32, bf16" in err


def test_cli_trains_in_bf16_and_says_so(backbones, train_file, tmp_path, capsys, cpu_bf16):
    bb = str(backbones["llama"])
    code, out, err = _run(["train", bb, str(tmp_path / "ck"), "-s", str(train_file), "-k", "8", "--head-dim", "32",
                           "--head-heads", "4", "--head-ff", "64", "--lora-rank", "2", "--steps", "2", "--accum", "1",
                           "--threads", "1", "--device", "cpu", "--json"], capsys)
    assert code == 0, err
    assert "compute: cpu, bf16" in err
    prov = json.loads((tmp_path / "ck" / "hllm.json").read_text())["provenance"]
    assert prov["compute"]["precision"] == "bf16" and prov["config"]["precision"] == "auto"


def test_train_speed_script_measures_both_precisions(backbones, train_file, tmp_path, cpu_bf16):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "train_speed.py"
    spec = importlib.util.spec_from_file_location("train_speed", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rec = mod.measure(str(backbones["llama"]), str(train_file), limit=2, layer=1, rank=2, threads=1)
    assert rec["slates"] == 2 and len(rec["prompt_tokens"]) == 2 and rec["num_layers"] == 2
    for name in ("cache_step", "lora_step_top_layers", "lora_step_all_layers"):
        assert set(rec["runs"][name]) == {"fp32", "bf16"} and all(len(v) == 2 for v in rec["runs"][name].values())
        assert all(t > 0 for v in rec["runs"][name].values() for t in v)
    import statistics

    s = mod.summarize(rec)["cache_step"]
    med = {p: statistics.median(rec["runs"]["cache_step"][p]) for p in ("fp32", "bf16")}
    assert s["bf16_speedup"] == pytest.approx(med["fp32"] / med["bf16"], abs=0.006)
    out = tmp_path / "o.json"
    out.write_text("{}")
    assert mod.main([str(backbones["llama"]), str(train_file), "--out", str(out)]) == 2  # never replaced
    assert out.read_text() == "{}"


def test_frozen_weights_cast_once_give_the_same_results_as_autocast(backbones, cpu_bf16):
    """Converting the frozen linear weights to bf16 up front is what autocast does at every call: the
    outputs are identical, and trainable (LoRA) weights stay fp32."""
    from hllm.training.trainer import build_model

    cfg = train_config(backbones["qwen3"], "unused.jsonl", "unused", precision="bf16", device="cpu")
    model, _, _ = build_model(cfg)
    compute = resolve_compute("bf16", "cpu")
    ids = torch.randint(1, 100, (2, 12))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
        with compute.autocast():
            before = model.full(ids)
        converted = compute.cast_frozen(model.backbone)
        with compute.autocast():
            after = model.full(ids)
    assert converted > 0 and torch.equal(before, after)
    params = dict(model.named_parameters())
    assert {p.dtype for n, p in params.items() if "lora_" in n or n.startswith("head.")} == {torch.float32}
    assert any(p.dtype == torch.bfloat16 for n, p in params.items() if "base_layer" in n)
    assert resolve_compute("fp32", "cpu").cast_frozen(model.backbone) == 0
