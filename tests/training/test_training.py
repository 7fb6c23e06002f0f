"""The training loop on a tiny random backbone: which parameters learn, the cached top-layer path,
resumption, and the written checkpoint."""

import json

import pytest
import torch
from safetensors.torch import load_file

from hllm.runtime.slates import write_jsonl
from hllm.testing import tiny_slates
from hllm.model.hllm import run_layers as lower_layers
from hllm.training.trainer import STATE_FILE, build_model, train
from tests.conftest import TINY_HEAD, train_config


@pytest.fixture(scope="module")
def train_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("train") / "train.jsonl"
    write_jsonl(p, tiny_slates(6, (2, 8), seed=5))
    return p


def test_gradients_reach_only_lora_and_head(backbones, train_file, tmp_path):
    model, _, _ = build_model(train_config(backbones["qwen3"], train_file, tmp_path / "x"))
    ids = torch.randint(1, 100, (2, 12))
    items = model.full(ids)[:, [3, 7, 11]]
    model.head(items, torch.ones(2, 3, dtype=torch.bool)).pow(2).sum().backward()
    named = dict(model.model.named_parameters())
    with_grad = {n for n, p in named.items() if p.grad is not None and p.grad.abs().sum() > 0}
    assert with_grad, "nothing learned"
    assert all(("lora_" in n) or n.startswith("head.") for n in with_grad), with_grad
    assert any("lora_B" in n for n in with_grad) and any(n.startswith("head.") for n in with_grad)
    frozen = [n for n in named if "lora_" not in n and not n.startswith("head.")]
    assert frozen and all(not named[n].requires_grad for n in frozen)


def test_frozen_backbone_trains_only_the_head(backbones, train_file, tmp_path):
    model, _, _ = build_model(train_config(backbones["llama"], train_file, tmp_path / "x", lora_rank=0))
    assert {n.split(".")[0] for n, p in model.model.named_parameters() if p.requires_grad} == {"head"}


def test_top_layer_split_equals_full_forward(backbones, train_file, tmp_path):
    model, _, _ = build_model(train_config(backbones["llama"], train_file, tmp_path / "x", lora_layers=1))
    assert model.start_layer == 1
    lora_layers = {n.split("layers.")[1].split(".")[0] for n, _ in model.named_parameters() if "lora_A" in n}
    assert lora_layers == {"1"}  # LoRA only on the top layer
    ids = torch.randint(1, 100, (2, 10))
    with torch.no_grad():
        for n, p in model.named_parameters():  # non-zero LoRA, so the top layer really differs
            if "lora_B" in n:
                p.normal_(0, 0.1)
        assert torch.allclose(model.upper(lower_layers(model.backbone, ids, 0, 1)), model.full(ids), atol=1e-5)


@pytest.mark.parametrize("lora_layers", [None, 1])
def test_resume_reaches_the_same_weights(backbones, train_file, tmp_path, lora_layers):
    bb = backbones["llama"]
    full = train(train_config(bb, train_file, tmp_path / "a", steps=4, lora_layers=lora_layers))
    train(train_config(bb, train_file, tmp_path / "b", steps=2, lora_layers=lora_layers))
    resumed = train(train_config(bb, train_file, tmp_path / "b", steps=4, lora_layers=lora_layers), resume=True)
    assert resumed.losses == pytest.approx(full.losses, abs=1e-6) and len(resumed.losses) == 4
    for f in ("head.safetensors", "adapter/adapter_model.safetensors"):
        a, b = load_file(str(tmp_path / "a" / f)), load_file(str(tmp_path / "b" / f))
        assert a.keys() == b.keys()
        for k in a:
            assert torch.allclose(a[k], b[k], atol=1e-6), (f, k)
    other = train(train_config(bb, train_file, tmp_path / "c", steps=4, lora_layers=lora_layers, seed=1))
    assert other.losses != pytest.approx(full.losses, abs=1e-6)  # the seed matters


def test_checkpoint_loads_and_scores_like_the_trained_model(backbones, train_file, tmp_path):
    from hllm.formats.checkpoint import load_manifest
    from hllm.model.hllm import load_model

    out = tmp_path / "ck"
    res = train(train_config(backbones["qwen3"], train_file, out, steps=3, save_every=10))
    m = load_manifest(out)
    assert m.adapter_path is not None and m.extra["provenance"]["trained"] is True
    assert m.extra["provenance"]["step"] == 3 and (out / STATE_FILE).is_file()
    assert len(res.losses) == 3 and all(l == l for l in res.losses)
    model = load_model(out)
    lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert lora_b and any(p.abs().sum() > 0 for p in lora_b)  # trained away from peft's zero init


def test_resume_refuses_changed_options(backbones, train_file, tmp_path):
    from hllm.errors import CheckpointError

    train(train_config(backbones["llama"], train_file, tmp_path / "d", steps=1))
    with pytest.raises(CheckpointError, match="lr"):
        train(train_config(backbones["llama"], train_file, tmp_path / "d", steps=2, lr=0.5), resume=True)
    with pytest.raises(CheckpointError, match="not found"):
        train(train_config(backbones["llama"], train_file, tmp_path / "e", steps=2), resume=True)


def test_teacher_target_needs_teacher(backbones, train_file, tmp_path):
    from hllm.errors import HllmError

    with pytest.raises(HllmError, match="teacher"):
        train(train_config(backbones["llama"], train_file, tmp_path / "f", target="teacher"))


def test_teacher_target_trains(backbones, train_file, tmp_path):
    from hllm.runtime.slates import read_slates

    teacher = tmp_path / "teacher.jsonl"
    write_jsonl(teacher, [{"slate_id": s["slate_id"], "order": list(range(len(s["candidates"])))[::-1]}
                          for s in read_slates(train_file)])
    res = train(train_config(backbones["llama"], train_file, tmp_path / "g", target="clicks+teacher", teacher=str(teacher),
                     lora_rank=0, steps=2))
    assert res.steps == 2 and json.loads((tmp_path / "g" / "hllm.json").read_text())["adapter"] is None


def _run(argv, capsys):
    from hllm.cli import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    cap = capsys.readouterr()
    return e.value.code, cap.out, cap.err


def test_cli_teacher_train_eval(backbones, train_file, tmp_path, capsys):
    from hllm.verify.metrics import evaluate
    from hllm.runtime.slates import read_slates

    bb = str(backbones["llama"])
    teacher = tmp_path / "t.jsonl"
    code, out, err = _run(["teacher", bb, str(train_file), str(teacher), "--limit", "3", "--threads", "1",
                           "--batch-size", "2", "--summary", str(tmp_path / "t.json")], capsys)
    assert code == 0, err
    recs = [json.loads(x) for x in teacher.read_text().splitlines()]
    assert len(recs) == 3 and all(r["valid"] and r["decode_passes"] > 0 for r in recs)  # a batch of 2, then 1
    summ = json.loads((tmp_path / "t.json").read_text())
    assert summ["valid_rate"] == 1.0 and summ["batch_size"] == 2
    assert (summ["kind"], summ["teacher"]) == ("teacher", "ar") and summ["machine"]["logical_cpus"] >= 1  # the envelope

    ck = tmp_path / "ck"
    code, out, err = _run(["train", bb, str(train_file), str(ck), "-k", "8", "--head-dim", "32", "--head-heads", "4",
                           "--head-ff", "64", "--lora-rank", "2", "--steps", "2", "--accum", "1", "--threads", "1"], capsys)
    assert code == 0 and "trained" in out, err
    code, _, err = _run(["train", bb, str(train_file), str(ck)], capsys)
    assert code == 2 and "already exists" in err

    code, out, err = _run(["eval", "random", f"teach={teacher}", str(ck), "--slates", str(train_file), "--limit", "2",
                           "--out", str(tmp_path / "q.json")], capsys)
    assert code == 0, err
    q = json.loads((tmp_path / "q.json").read_text())
    assert set(q["rankers"]) == {"random", "teach", str(ck)} and q["subset"]["first"] == 2
    rows = read_slates(train_file, limit=2)
    want = evaluate([r["order"] for r in recs[:2]], [s["labels"] for s in rows]).to_dict()
    for k in ("auc", "recall@1", "recall@10", "ndcg@1", "ndcg@10", "slates"):
        assert q["rankers"]["teach"][k] == want[k]
    assert "NDCG@10" in out

    code, _, err = _run(["eval", f"teach={teacher}", "--slates", str(train_file)], capsys)  # 6 slates, teacher has 3
    assert code == 2 and "no ranking" in err


def test_training_state_holds_no_pickle(backbones, train_file, tmp_path):
    from hllm.training.state import STATE_JSON, STATE_TENSORS

    train(train_config(backbones["llama"], train_file, tmp_path / "s", steps=1))
    names = {p.name for p in (tmp_path / "s").iterdir()}
    assert {STATE_TENSORS, STATE_JSON} <= names and not any(n.endswith((".pt", ".pkl", ".bin")) for n in names)
    json.loads((tmp_path / "s" / STATE_JSON).read_text())  # plain JSON
    # a crafted file where the state should be is refused with a message, never unpickled
    (tmp_path / "s" / STATE_TENSORS).write_bytes(b"\x80\x04cos\nsystem\n(S'touch pwned'\ntR.")
    from hllm.errors import CheckpointError

    with pytest.raises(CheckpointError, match="unreadable training state"):
        train(train_config(backbones["llama"], train_file, tmp_path / "s", steps=2), resume=True)


def test_no_pickle_loading_in_the_package():
    """No pickle loading anywhere in hllm (enforced; docs/hardening.md): no pickle.load, and torch.load only with
    ``weights_only=True`` (PyTorch's restricted unpickler: tensors and plain containers, no code) — the one use
    reads a team's ``torch.save``'d head state dict in ``hllm import``."""
    import re
    from pathlib import Path

    import hllm

    root = Path(hllm.__file__).parent
    bad = [f"{p.relative_to(root)}:{i}" for p in root.rglob("*.py")
           for i, line in enumerate(p.read_text().splitlines(), 1)
           if re.search(r"\bpickle\.loads?\(|allow_pickle\s*=\s*True|weights_only\s*=\s*False", line)
           or (re.search(r"\btorch\.load\(", line) and "weights_only=True" not in line)]
    assert not bad, bad


def test_cosine_schedule_and_learning_curve(backbones, train_file, tmp_path):
    cfg = train_config(backbones["llama"], train_file, tmp_path / "v", steps=4, lr=1e-2, lr_schedule="cosine",
               warmup_steps=2, min_lr_ratio=0.1, val_slates=2, val_every=2, lora_rank=0)
    assert [round(cfg.lr_at(s), 6) for s in range(4)] == [0.005, 0.01, 0.01, round(0.01 * (0.1 + 0.9 * 0.5), 6)]
    res = train(cfg)
    assert [r["step"] for r in res.validation] == [2, 4]
    assert all(0.0 <= r["auc"] <= 1.0 and r["slates"] == 2 for r in res.validation)
    prov = json.loads((tmp_path / "v" / "hllm.json").read_text())["provenance"]
    assert prov["validation"] == res.validation and prov["val_slates"] == 2


def test_init_head_starts_from_a_trained_head_and_refuses_another_size(backbones, train_file, tmp_path):
    """Linear probe, then LoRA + head: the second run's head starts at the first run's trained weights
    (not the seeded init), its LoRA still starts at zero; a head of other sizes is refused by name."""
    from hllm.errors import CheckpointError

    train(train_config(backbones["qwen3"], train_file, tmp_path / "probe", lora_rank=0, steps=2))
    probe = load_file(str(tmp_path / "probe" / "head.safetensors"))
    model, _, _ = build_model(train_config(backbones["qwen3"], train_file, tmp_path / "ft", init_head=str(tmp_path / "probe")))
    start = {k: v for k, v in model.model.head.state_dict().items()}
    assert start.keys() == probe.keys() and all(torch.equal(start[k], probe[k]) for k in probe)
    fresh, _, _ = build_model(train_config(backbones["qwen3"], train_file, tmp_path / "ft2"))
    assert any(not torch.equal(fresh.model.head.state_dict()[k], probe[k]) for k in probe)  # not the seeded init
    assert all(p.abs().sum() == 0 for n, p in model.named_parameters() if "lora_B" in n)
    assert all(p.requires_grad for p in model.model.head.parameters())
    with pytest.raises(CheckpointError, match="d_model"):
        build_model(train_config(backbones["qwen3"], train_file, tmp_path / "ft3", init_head=str(tmp_path / "probe"),
                         head_kwargs={**TINY_HEAD, "d_model": 16}))
