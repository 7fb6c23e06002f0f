"""The training state's files read strictly: ``hllm train-status`` and ``hllm train --resume`` share one
typed reader of ``training_state.json`` (exit 2 naming the file for a corrupt one, before any work), paths
compare resolved on resume, resumed runs record how each computed, and ``--features`` is refused where
nothing below the trained layers could come from it."""

import json
import re
import os
import time
from pathlib import Path

import pytest

from hllm.errors import CheckpointError, HllmError
from hllm.training.state import MAX_JSON_BYTES, read_state_json
from hllm.training.status import cache_status, training_status
from tests.conftest import train_config
from tests.training.conftest import run as _run

GOOD = {"step": 2, "losses": [1.5, 1.25], "config": {"steps": 4, "batch_size": 2, "accum": 1},
        "validation": [], "train_s": 3.0, "param_groups": []}


def _ckpt(d: Path, state_text: str, manifest: str | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "training_state.json").write_text(state_text)
    if manifest is not None:
        (d / "hllm.json").write_text(manifest)
    return d


def _with(**kw) -> str:
    return json.dumps({**GOOD, **kw})


BAD_STATES = {
    "nan-train-s": _with().replace('"train_s": 3.0', '"train_s": NaN'),
    "huge-train-s": _with().replace('"train_s": 3.0', '"train_s": 1e400'),
    "absurd-train-s": _with(train_s=1e308),
    "inf-step": _with().replace('"step": 2', '"step": 1e400'),
    "float-step": _with(step=5.7),
    "string-step": _with(step="2"),
    "bool-step": _with(step=True, losses=[1.0]),
    "step-1e29": _with(step=1e29),
    "negative-step": _with(step=-1, losses=[]),
    "negative-steps": _with(config={"steps": -4}),
    "negative-batch": _with(config={"steps": 4, "batch_size": -2}),
    "validation-string": _with(validation="abc"),
    "validation-list-of-int": _with(validation=[5]),
    "validation-no-step": _with(validation=[{"a": 1}]),
    "duplicate-key": '{"step": 2, ' + _with()[1:],
    "bad-precision": _with(config={"steps": 4, "precision": "fp64"}),
    "losses-mismatch": _with(losses=[1.0]),
    "int-past-float-train-s": _with(train_s=10**400),  # 1e400 written out as an integer: OverflowError (exit 70)
    "int-past-float-loss": _with(losses=[1.0, -10**400]),
}


@pytest.mark.parametrize("name", sorted(BAD_STATES))
def test_status_refuses_a_malformed_state_with_exit_2(name, tmp_path, capsys):
    d = _ckpt(tmp_path / "ck", BAD_STATES[name])
    code, _, err = _run(["train-status", str(d)], capsys)
    assert code == 2, err
    assert "training_state.json" in err and ("malformed" in err or "duplicate key" in err)


@pytest.mark.parametrize("manifest", ['{"provenance": "x"}', '{"provenance": {"compute": "bf16"}}',
                                      '{"provenance": {"train_slates": "abc"}}',
                                      '{"provenance": {"train_slates": -3}}'])
def test_status_refuses_a_malformed_provenance(manifest, tmp_path, capsys):
    d = _ckpt(tmp_path / "ck", _with(), manifest)
    code, _, err = _run(["train-status", str(d)], capsys)
    assert code == 2 and "hllm.json: malformed" in err


def test_status_of_a_good_state_and_the_size_cap(tmp_path):
    d = _ckpt(tmp_path / "ck", _with(), '{"provenance": {"train_slates": 4, "compute": {"precision": "bf16"}}}')
    t = training_status(d)
    assert (t["step"], t["steps"], t["slates_seen"], t["epochs"], t["s_per_step"], t["eta_s"]) == (2, 4, 4, 1.0, 1.5, 3)
    assert t["precision"] == "bf16" and t["loss_last10"] == 1.375
    with open(d / "training_state.json", "ab") as f:
        f.truncate(MAX_JSON_BYTES + 1)
    with pytest.raises(CheckpointError, match="MiB limit"):
        training_status(d)


def test_cache_status_names_a_dangling_file_and_is_not_complete_without_files(tmp_path):
    c = tmp_path / "cache"
    c.mkdir()
    (c / "meta.json").write_text(json.dumps({"slate_ids": ["a", "b"], "layer": 1}))
    s = cache_status(c)
    assert s["complete"] is False and s["slates_done"] == 0 and s["slates_total"] == 2
    for i in range(2):
        (c / f"{i:05d}.npz").write_bytes(b"x")
    future = time.time() + 10_000
    os.utime(c / "00001.npz", (future, future))
    s = cache_status(c)
    assert s["complete"] is True and s["last_write_age_s"] is None  # a write in the future: no age
    (c / "00002.npz").symlink_to(c / "gone.npz")
    with pytest.raises(CheckpointError, match="00002.npz"):
        cache_status(c)
    (c / "00002.npz").unlink()
    (c / "meta.json").write_text('{"slate_ids": [], "slate_ids": ["a"]}')
    with pytest.raises(CheckpointError, match="duplicate key"):
        cache_status(c)


def test_resume_refuses_a_corrupt_state_before_touching_the_checkpoint(backbones, train_file, tmp_path):
    from hllm.training.trainer import train

    out = tmp_path / "ck"
    train(train_config(backbones["llama"], train_file, out, steps=2))
    js = out / "training_state.json"
    before = {f: (out / f).read_bytes() for f in ("head.safetensors", "training_state.safetensors")}
    for bad in ('"train_s": NaN', '"step": -3', '"step": 1000000001'):
        key = bad.split(":")[0].strip('"')
        st = json.loads(js.read_text())
        js.write_text(json.dumps(st).replace(f'"{key}": {json.dumps(st[key])}', bad))
        with pytest.raises(CheckpointError, match="malformed"):
            train(train_config(backbones["llama"], train_file, out, steps=4), resume=True)
        assert {f: (out / f).read_bytes() for f in before} == before
        js.write_text(json.dumps(st))
    st = json.loads(js.read_text())
    st["config"]["device"] = "tpu"
    js.write_text(json.dumps(st))
    with pytest.raises(CheckpointError, match="config.device"):
        read_state_json(js)


def test_resume_accepts_the_folder_spelled_differently(backbones, train_file, tmp_path, monkeypatch):
    from hllm.training.trainer import train

    monkeypatch.chdir(tmp_path)
    train(train_config(backbones["llama"], train_file, "ck_r", steps=1))
    assert read_state_json(tmp_path / "ck_r" / "training_state.json").config["out_dir"] == str(tmp_path / "ck_r")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    res = train(train_config(backbones["llama"], os.path.relpath(train_file), "../ck_r", steps=2), resume=True)
    assert res.steps == 2 and len(res.losses) == 2


def test_resumed_run_in_another_precision_is_recorded_as_mixed(backbones, train_file, tmp_path, monkeypatch):
    from hllm.formats.checkpoint import load_manifest
    from hllm.formats.precision import Precision
    from hllm.training import trainer
    from hllm.training.precision import Compute

    out = tmp_path / "ck"
    trainer.train(train_config(backbones["llama"], train_file, out, steps=1, precision="fp32"))
    # this CPU may lack bf16 instructions: record the second run as bf16 while computing in fp32
    monkeypatch.setattr(trainer, "resolve_compute", lambda p, d: Compute("cpu", Precision.BF16, "test"))
    trainer.train(train_config(backbones["llama"], train_file, out, steps=3, precision="bf16"), resume=True)
    runs = [{"from_step": 0, "precision": "fp32", "device": "cpu"}, {"from_step": 1, "precision": "bf16", "device": "cpu"}]
    assert read_state_json(out / "training_state.json").runs == runs
    assert load_manifest(out).extra["provenance"]["compute_runs"] == runs
    assert training_status(out)["precision"] == "mixed (fp32 from step 0, bf16 from step 1)"


def test_features_with_every_layer_trained_is_refused(backbones, train_file, tmp_path):
    from hllm.training.trainer import train

    cfg = train_config(backbones["llama"], train_file, tmp_path / "ck", lora_layers=2, features=str(tmp_path / "cache"))
    with pytest.raises(HllmError, match="trains all 2 layers"):
        train(cfg)
    with pytest.raises(HllmError, match=r"--lora-layers N \(fewer"):
        train_config(backbones["llama"], train_file, tmp_path / "ck", features="c").validate()


@pytest.mark.parametrize("field, value, named", [
    ("betas", "x", "param_groups[0].betas"),
    ("betas", [0.9, 1.5], "param_groups[0].betas"),
    ("lr", -1.0, "param_groups[0].lr"),
    ("lr", True, "param_groups[0].lr"),
    pytest.param("lr", 10**400, "param_groups[0].lr must be a finite number", id="lr-int-past-float"),  # OverflowError
    pytest.param("betas", [0.9, 10**400], "param_groups[0].betas must be a list of 2 finite", id="betas-int-past-float"),
    ("amsgrad", "yes", "param_groups[0].amsgrad"),
    ("params", "dup", "param_groups[0].params"),
    ("bogus", 1, "param_groups[0] has fields"),
    ("groups", "extra", "param_groups must list 1 group"),
    # well-typed but not this run's optimizer: amsgrad/capturable failed in the first step (exit 70), the
    # others silently changed the run (maximize: gradient ascent; eps, weight decay, betas other than its options)
    ("amsgrad", True, "param_groups[0].amsgrad is True, but this run's optimizer has False"),
    ("capturable", True, "param_groups[0].capturable is True, but this run's optimizer has False"),
    ("maximize", True, "param_groups[0].maximize is True, but this run's optimizer has False"),
    ("decoupled_weight_decay", False, "param_groups[0].decoupled_weight_decay is False, but this run's optimizer has True"),
    ("eps", 0.0, "param_groups[0].eps is 0.0, but this run's optimizer has 1e-08"),
    ("weight_decay", 5.0, "param_groups[0].weight_decay is 5.0, but this run's optimizer has 0.0"),
    ("betas", [0.5, 0.999], "param_groups[0].betas is [0.5, 0.999], but this run's optimizer has [0.9, 0.999]"),
])
def test_resume_refuses_a_corrupt_optimizer_state_naming_the_field(backbones, train_file, tmp_path, field, value,
                                                                    named):
    """Optimizer.load_state_dict accepted these; the first optimizer step then failed (exit 70), or ran with
    the saved flags instead of the run's options."""
    from hllm.training.trainer import train

    out = tmp_path / "ck"
    train(train_config(backbones["llama"], train_file, out, steps=2))
    js = out / "training_state.json"
    st = json.loads(js.read_text())
    group = st["param_groups"][0]
    if field == "params":
        group["params"] = [group["params"][0]] * len(group["params"])  # a duplicated index
    elif field == "groups":
        st["param_groups"].append(dict(group))
    else:
        group[field] = value
    js.write_text(json.dumps(st))
    before = {f: (out / f).read_bytes() for f in ("head.safetensors", "training_state.safetensors")}
    with pytest.raises(CheckpointError, match=re.escape(named)) as e:
        train(train_config(backbones["llama"], train_file, out, steps=4), resume=True)
    assert "training_state.json: malformed" in str(e.value)
    assert {f: (out / f).read_bytes() for f in before} == before


def test_resume_refuses_optimizer_moments_of_another_shape_and_accepts_its_own(backbones, train_file, tmp_path):
    from safetensors.torch import load_file, save_file

    from hllm.training.trainer import train

    out = tmp_path / "ck"
    train(train_config(backbones["llama"], train_file, out, steps=2))
    ts = out / "training_state.safetensors"
    good = ts.read_bytes()
    t = load_file(str(ts))
    t["opt/0/exp_avg"] = t["opt/0/exp_avg"].flatten()[:3].clone()
    save_file(t, str(ts))
    with pytest.raises(CheckpointError, match=r"optimizer tensor opt/0/exp_avg must be floating point of the "):
        train(train_config(backbones["llama"], train_file, out, steps=4), resume=True)
    ts.write_bytes(good)
    res = train(train_config(backbones["llama"], train_file, out, steps=4), resume=True)
    assert json.loads((out / "training_state.json").read_text())["step"] == 4 and res is not None
