"""The measurement scripts behind committed results: ``scripts/demo_timings.py`` (``make demo`` by step)
and ``scripts/lora_readout_shift.py`` (what a checkpoint's adapter changes)."""

import ast
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hllm.runtime.slates import read_slates, write_jsonl
from hllm.testing import tiny_slates
from hllm.training.features import build_cache
from hllm.training.trainer import train
from hllm.formats.prompt import PromptSpec
from tests.conftest import TINY_HEAD, train_config

ROOT = Path(__file__).resolve().parents[1]
PROMPT = PromptSpec().to_dict()

FAKE_MAKEFILE = """\
demo:
\t@echo "== 1/2 merge"
\t@echo "merged → x; max|ΔM| merged vs adapter = 2.3e-05 on 2 slates (atol 0.0001)"
\t@echo "== 2/2 parity"
\t@mkdir -p $(WORK)/demo && echo '{"slates": 8, "perm_match_rate": 1.0, "passed": true}' > $(WORK)/demo/parity.json
\t@test "$(FAIL)" != 1
"""


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_demo_timings_records_steps_proofs_and_exit_status(tmp_path):
    (tmp_path / "Makefile").write_text(FAKE_MAKEFILE)
    script = [sys.executable, str(ROOT / "scripts" / "demo_timings.py")]
    r = subprocess.run([*script, "--out", "t.json", "WORK=w"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rec = json.loads((tmp_path / "t.json").read_text())
    assert rec["rc"] == 0 and rec["command"] == "make demo WORK=w"
    assert list(rec["steps_wall_s"]) == ["setup (make setup: venv, pinned installs)", "1/2 merge", "2/2 parity"]
    assert all(v >= 0 for v in rec["steps_wall_s"].values())
    assert rec["merge_max_abs_dM_vs_adapter"] == pytest.approx(2.3e-5)
    assert rec["parity"]["passed"] is True and rec["parity"]["slates"] == 8
    assert rec["machine"]["logical_cpus"] >= 1 and rec["export_validation"] is None
    # an existing output is never replaced; a failing demo is recorded with its exit status
    before = (tmp_path / "t.json").read_bytes()
    r = subprocess.run([*script, "--out", "t.json"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 2 and "exists" in r.stderr and (tmp_path / "t.json").read_bytes() == before
    r = subprocess.run([*script, "--out", "f.json", "FAIL=1", "WORK=w"], cwd=tmp_path, capture_output=True, text=True)
    failed = json.loads((tmp_path / "f.json").read_text())
    assert r.returncode != 0 and failed["rc"] == r.returncode
    # a proof left by an earlier run is not this run's: the demo below fails before writing one
    (tmp_path / "Makefile").write_text("demo:\n\t@echo '== 1/1 parity'\n\t@printf 'caf\\351\\n'\n\t@false\n")
    r = subprocess.run([*script, "--out", "g.json", "WORK=w"], cwd=tmp_path, capture_output=True, text=True)
    stale = json.loads((tmp_path / "g.json").read_text())
    assert r.returncode == stale["rc"] != 0 and stale["parity"] is None  # non-UTF-8 output did not stop it
    # paths are checked before make starts: nothing runs, nothing is replaced
    for args, words in ((["--out", "missing/t.json"], "does not exist"), (["--out", "h.json", "--log", "t.json"], "exists"),
                        (["--out", "h.json", "--log", "h.json"], "same file")):
        r = subprocess.run([*script, *args], cwd=tmp_path, capture_output=True, text=True)
        assert r.returncode == 2 and words in r.stderr and not (tmp_path / "h.json").exists(), r.stderr


def _shift(ckpt, cache, slates, out):
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "lora_readout_shift.py"), str(ckpt), str(cache),
                        str(slates), "--out", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return json.loads(Path(out).read_text())


def test_lora_readout_shift_measures_the_adapter(backbones, tmp_path):
    """A trained top-layer adapter (context head) moves the readout rows; the same checkpoint with its
    LoRA B matrices zeroed (peft's initial state: ΔW = 0) measures exactly no change."""
    bb = backbones["qwen3"]
    slates = tmp_path / "s.jsonl"
    write_jsonl(slates, tiny_slates(5, (3, 8), seed=11))
    ck = tmp_path / "ck"
    train(train_config(bb, slates, ck, lora_rank=4, lora_layers=1, steps=3, save_every=10, lr=5e-2,
                       head_kwargs={**TINY_HEAD, "context": True}))
    build_cache(bb, read_slates(slates), tmp_path / "cache", 1, PROMPT, 8, threads=1)

    moved = _shift(ck, tmp_path / "cache", slates, tmp_path / "moved.json")
    assert moved["slates"] == 5 and moved["cache_layer"] == 1
    assert moved["readout_rel_change"]["mean"] > 1e-4
    assert moved["adapter_delta_over_weight"]["max"] > 0
    assert set(moved["adapter_delta_over_weight"]["per_module"]) >= {"layers.1.self_attn.q_proj", "layers.1.mlp.down_proj"}
    assert -1.0 <= moved["ranking_adapter_off_vs_on"]["kendall_tau_mean"] <= 1.0
    assert moved["metrics"]["lora"]["slates"] == moved["metrics"]["adapter_off"]["slates"] == 5
    assert moved["paired_delta_on_minus_off"]["delta"]["auc"] == pytest.approx(
        moved["metrics"]["lora"]["auc"] - moved["metrics"]["adapter_off"]["auc"], abs=1e-5)

    adapter = ck / "adapter" / "adapter_model.safetensors"
    tensors = load_file(str(adapter))
    save_file({k: torch.zeros_like(v) if "lora_B" in k else v for k, v in tensors.items()}, str(adapter))
    still = _shift(ck, tmp_path / "cache", slates, tmp_path / "still.json")
    assert still["readout_rel_change"]["max"] == 0.0 and still["adapter_delta_over_weight"]["max"] == 0.0
    assert still["ranking_adapter_off_vs_on"] == {"kendall_tau_mean": 1.0, "top1_agreement": 1.0}
    pair = still["paired_delta_on_minus_off"]
    assert pair["slates"] == 5 and pair["delta"]["auc"] == 0.0 and pair["ci95"] is None  # 5 slates: no interval

    # bad input: exit 2 with one line, nothing written, inputs untouched
    script = [sys.executable, str(ROOT / "scripts" / "lora_readout_shift.py")]
    build_cache(bb, read_slates(slates), tmp_path / "cache2", 2, PROMPT, 8, threads=1)
    before = slates.read_bytes()
    for args, words in (([ck, tmp_path / "cache2", slates, "--out", tmp_path / "x.json"], "below the cached layer 2"),
                        ([ck, tmp_path / "cache", slates, "--out", slates], "exists"),
                        ([ck, tmp_path / "cache", slates, "--out", ck / "adapter" / "new.json"], "inside the input"),
                        ([ck, tmp_path / "cache", slates, "--limit", "0", "--out", tmp_path / "x.json"], "must be ≥ 1"),
                        ([bb, tmp_path / "cache", slates, "--out", tmp_path / "x.json"], "")):
        r = subprocess.run([*script, *map(str, args)], capture_output=True, text=True, cwd=ROOT)
        assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert slates.read_bytes() == before and not (tmp_path / "x.json").exists()
    assert not (ck / "adapter" / "new.json").exists()


SCRIPTS = sorted((ROOT / "scripts").rglob("*.py"))
ABSOLUTE_PATH = re.compile(r"""["'\s](/work|/root|/home|/tmp|/Users)/|\.\./shared""")


def _hllm_names(path: Path) -> list[tuple[str, str | None]]:
    """Every ``from hllm.X import Y`` / ``import hllm.X`` of a script, at any depth (function-level too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "hllm":
            found += [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names if a.name.split(".")[0] == "hllm"]
    return found


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_script_imports_and_names_only_what_hllm_has(script):
    """A script kept under scripts/ must not rot: it imports (module level, as ``import`` does, not run as
    ``__main__``), every hllm module and name it imports inside its functions exists, and it carries no
    absolute or workplace-specific data path (research one-offs live in experiments/ instead)."""
    r = subprocess.run([sys.executable, "-c", f"import runpy; runpy.run_path({str(script)!r}, run_name='_smoke')"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    missing = []
    for module, name in _hllm_names(script):
        try:
            m = importlib.import_module(module)
        except ModuleNotFoundError:
            missing.append(module)
            continue
        if name is not None and not hasattr(m, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ModuleNotFoundError:
                missing.append(f"{module}.{name}")
    assert not missing, f"{script.name} imports what hllm no longer has: {missing}"
    assert not ABSOLUTE_PATH.search(script.read_text(encoding="utf-8")), f"{script.name} names an absolute data path"


def test_the_smoke_check_catches_a_rotted_script(tmp_path):
    """The check above fails on a script importing a module that does not exist (inside a function)."""
    rotted = tmp_path / "rotted.py"
    rotted.write_text("def main():\n    from hllm.bench.slates import subslate\n")
    assert _hllm_names(rotted) == [("hllm.bench.slates", "subslate")]
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("hllm.bench.slates")



@pytest.mark.skipif(shutil.which("make") is None or shutil.which("touch") is None, reason="needs make and touch")
def test_demo_timings_keeps_a_proof_whose_mtime_reads_before_the_start(tmp_path):
    """The kernel stamps files from a coarse clock a few ms behind ``time.time()``: a parity report written at once
    looked older than the run and was dropped (CI saw ``parity`` None). A proof the run wrote or changed counts,
    whatever its mtime."""
    (tmp_path / "Makefile").write_text(
        "demo:\n\t@echo '== 1/1 parity'\n\t@mkdir -p $(WORK)/demo && echo '{\"slates\": 8, \"passed\": true}' "
        "> $(WORK)/demo/parity.json && touch -d '2 seconds ago' $(WORK)/demo/parity.json\n")
    script = [sys.executable, str(ROOT / "scripts" / "demo_timings.py")]
    r = subprocess.run([*script, "--out", "t.json", "WORK=w"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "t.json").read_text())["parity"]["slates"] == 8

def test_experiments_name_their_commit_and_output():
    """Research one-offs in experiments/ each name the commit they last ran at and the committed JSON they wrote."""
    for p in sorted((ROOT / "experiments").rglob("*.py")):
        head = p.read_text(encoding="utf-8").split("\n", 1)[0]
        m = re.search(r"last run at commit ([0-9a-f]{7,40}); output: (\S+?)\.? ", head)
        assert m, f"{p.name}: first line lacks the provenance header"
        assert (ROOT / m.group(2).rstrip(".;")).is_file(), f"{p.name}: {m.group(2)} is not committed"


def test_docs_cli_md_is_generated_from_the_app():
    """docs/cli.md is Typer's own Markdown of the app (scripts/cli_docs.py); run `make docs` after changing a command."""
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "cli_docs.py"), "--check"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert "## `hllm rank`" in text and "## `hllm serve`" in text


def _checkout(tmp_path, script):
    """A copy of ``scripts/<script>`` and the argument checks it sources in a checkout of its own under tmp_path,
    with a stand-in backbone (4 layers), a slates file and a HOME beside it: {name: path}."""
    co = tmp_path / "checkout"
    (co / "scripts").mkdir(parents=True)
    for name in (script, "args.sh"):
        shutil.copy(ROOT / "scripts" / name, co / "scripts" / name)
    bb = tmp_path / "bb"
    bb.mkdir()
    (bb / "config.json").write_text(json.dumps({"num_hidden_layers": 4}))
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text("{}\n")
    (tmp_path / "home").mkdir()
    return {"co": co, "bb": bb, "train": data / "train.jsonl", "data": data, "home": tmp_path / "home"}


#: (variable settings, the one line it must print after "<script>: "); {bb} {data} {co} {home} name the
#: stand-ins of _checkout, {tmp} the test's folder.
RANGES = [
    ({"LR": "11"}, "LR must be at most 1 (got 11)"),
    ({"LR": "1.5e0"}, "LR must be at most 1 (got 1.5e0)"),
    ({"LR": "1e-999"}, "LR must be a positive number (got '1e-999')"),  # a float underflows to 0: was accepted
    ({"BATCH": "1025"}, "BATCH must be at most 1024 (got 1025)"),
    ({"RANK": "4097"}, "RANK must be at most 4096 (got 4097)"),
    ({"VAL": "1000001", "LIMIT": "2000000"}, "VAL must be at most 1000000 (got 1000001)"),
    ({"EPOCHS": "1001"}, "EPOCHS must be at most 1000 (got 1001)"),
    ({"EPOCHS": "1000", "LIMIT": "999999", "VAL": "0", "BATCH": "1"},
     "EPOCHS=1000 over 999999 slates in batches of 1 makes 999999000 steps, over 10000000"),
]
CPU_ONLY = [
    ({"STEPS": "10000001"}, "STEPS must be at most 10000000 (got 10000001)"),
    ({"SAVE_EVERY": "1000001"}, "SAVE_EVERY must be at most 1000000 (got 1000001)"),
    ({"THREADS": "999999999"}, "THREADS must be at most"),
    ({"PRECISION": "fp16"}, "PRECISION must be one of auto fp32 bf16 (got 'fp16')"),
    ({"OBJECTIVE": "pairs"}, "OBJECTIVE must be one of clicks teacher clicks+teacher (got 'pairs')"),
    ({"WORK": "{bb}/w"}, "WORK={bb}/w is inside BACKBONE ({bb}); choose a folder of its own"),
    ({"WORK": "{bb}"}, "WORK={bb} holds BACKBONE ({bb}); choose a folder of its own"),
    ({"WORK": "{tmp}"}, "WORK={tmp} holds BACKBONE ({bb}); choose a folder of its own"),
    ({"WORK": "{data}"}, "WORK={data} holds TRAIN ({data}/train.jsonl); choose a folder of its own"),
    ({"WORK": "{co}"}, "WORK={co} holds REPO ({co}); choose a folder of its own"),
    ({"WORK": "{home}"}, "WORK={home} holds HOME ({home}); choose a folder of its own"),
    ({"WORK": "/"}, "WORK=/ holds BACKBONE ({bb}); choose a folder of its own"),  # "/"/* matched nothing: was let through
    ({"WORK": "//"}, "WORK=// holds BACKBONE ({bb}); choose a folder of its own"),
    ({"WORK": "{home}/t", "TEACHER": "{home}/t/teacher.jsonl"},
     "WORK={home}/t holds TEACHER ({home}/t/teacher.jsonl); choose a folder of its own"),
]


@pytest.mark.parametrize("env,says", RANGES + CPU_ONLY, ids=lambda x: ",".join(x) if isinstance(x, dict) else None)
def test_cpu_train_refuses_values_out_of_range_and_work_folders_before_any_work(tmp_path, env, says):
    """scripts/cpu_train.sh run: a value `hllm train` would refuse, or a WORK that is, holds or lies in an input,
    the checkout or HOME, stops the script with one line naming it and exit 2 before anything is made (no WORK,
    no features step), where it used to start the features step first."""
    at = _checkout(tmp_path, "cpu_train.sh")
    fill = {k: str(v) for k, v in at.items()} | {"tmp": str(tmp_path)}
    env = {k: v.format(**fill) for k, v in env.items()}
    base = {**os.environ, "PYTHON": sys.executable, "BACKBONE": str(at["bb"]), "TRAIN": str(at["train"]),
            "WORK": str(tmp_path / "w"), "OBJECTIVE": "clicks", "HOME": str(at["home"]), "LIMIT": "6", "VAL": "2"}
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    r = subprocess.run(["bash", str(at["co"] / "scripts" / "cpu_train.sh"), "run"], cwd=at["co"], env={**base, **env},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("cpu_train: " + says.format(**fill)), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing made, nothing moved


@pytest.mark.parametrize("env,says", RANGES, ids=lambda x: ",".join(x) if isinstance(x, dict) else None)
def test_gpu_train_plan_refuses_values_out_of_range_before_any_work(tmp_path, env, says):
    """scripts/gpu_train.sh --plan: the same bounds, checked before the work folder or the tiny model is made."""
    at = _checkout(tmp_path, "gpu_train.sh")
    base = {**os.environ, "PYTHON": "/bin/false", "TRAIN": str(at["train"]), "PLAN_WORK": str(tmp_path / "plan"),
            "WORK": str(tmp_path / "work"), "OUT": str(tmp_path / "out"), "HOME": str(at["home"])}
    r = subprocess.run(["bash", str(at["co"] / "scripts" / "gpu_train.sh"), "--plan"], cwd=at["co"],
                       env={**base, **env}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("gpu_train: " + says), r.stderr
    assert not (tmp_path / "plan").exists() and not (tmp_path / "work").exists()


def test_gpu_train_out_never_lies_in_an_input(tmp_path):
    """scripts/gpu_train.sh (a stand-in nvidia-smi and /bin/true for Python): OUT inside the backbone, or OUT
    holding the slates, is refused naming OUT before the work folder is made, where arithmetic.json and the
    run's records used to be written into the backbone."""
    at = _checkout(tmp_path, "gpu_train.sh")
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "nvidia-smi").write_text("#!/bin/sh\necho stub GPU\n")
    (stub / "nvidia-smi").chmod(0o755)
    base = {**os.environ, "PYTHON": "/bin/true", "TRAIN": str(at["train"]), "BACKBONE": str(at["bb"]),
            "TEACHER": str(tmp_path / "teacher.jsonl"), "WORK": str(tmp_path / "work"), "HOME": str(at["home"]),
            "WHEELS": str(tmp_path / "none"), "PATH": f"{stub}:{os.environ['PATH']}"}
    for out, says in ((at["bb"] / "out", f"OUT={at['bb']}/out is inside BACKBONE ({at['bb']})"),
                      (at["data"], f"OUT={at['data']} holds TRAIN ({at['train']})")):
        r = subprocess.run(["bash", str(at["co"] / "scripts" / "gpu_train.sh")], cwd=at["co"],
                           env={**base, "OUT": str(out)}, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and r.stderr.startswith(f"gpu_train: {says}"), r.stderr
    assert sorted(p.name for p in at["bb"].iterdir()) == ["config.json"] and not (tmp_path / "work").exists()
    assert sorted(p.name for p in at["data"].iterdir()) == ["train.jsonl"]
