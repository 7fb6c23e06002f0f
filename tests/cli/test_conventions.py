"""CLI conventions: one name per concept, bounded counts, choices in
--help, the packaged sample, stdin/stdout, --json, the exit-code policy and SIGTERM, `hllm info`,
`hllm encode` (Polygraphy's input format), `hllm build --dry-run` (trtexec / polygraphy lines), ONNX
metadata_props."""

from __future__ import annotations

import base64
import errno
import gzip
import io
import json
import os
import signal
import subprocess
import sys
import typing
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.main import get_command

from hllm.cli import app, main
from hllm.errors import HllmError

cli_app = sys.modules["hllm.cli.app"]  # the module (the package attribute `hllm.cli.app` is the Typer app)
cli_io = sys.modules["hllm.cli.io"]
cli_options = sys.modules["hllm.cli.options"]
from hllm.testing import tiny_slates
from tests.cli.conftest import ALIASES, commands, options, run

REPO = Path(__file__).resolve().parents[2]


def _is_int(p) -> bool:
    ann = p.type_descriptor.annotation
    return ann is int or int in typing.get_args(ann)


# -- naming and bounds -----------------------------------------------------------------------------------

def test_one_name_per_concept_and_short_flags():
    seen = {}
    for path, cmd in commands():
        for p in options(cmd):
            if p.hidden:
                continue
            for opt in p.opts:
                seen.setdefault(opt, set()).add(path)
            if p.name in ("slates",):
                assert p.opts == ["--slates", "-s"], (path, p.opts)
            if "--out" in p.opts:
                assert p.opts == ["--out", "-o"], (path, p.opts)
            if "--batch-size" in p.opts:
                assert p.opts == ["--batch-size", "-b"], (path, p.opts)
            if p.name == "limit":
                assert p.opts == ["--limit"] and p.min == 1, path
            if p.name == "threads":
                assert p.min == 1 and p.max == cli_options.MAX_THREADS, path
    retired = {"--max-batch", "--max-batch-size", "--eval-slates", "--check-slates", "--max-slates", "--count", "--tol",
               "--candidates", "--summary", "--model-slates", "--eval-limit", "--bench-rounds"}
    assert not retired & set(seen), retired & set(seen)
    assert seen["--kind"] == {"teacher"} and seen["--target"] == {"build", "calibrate"}  # one meaning each
    assert seen["--report"] == {"calibrate", "debug precision", "teacher"}  # the side report of a command writing an artefact
    assert "-s" in seen and all(cmd in seen["--slates"] for cmd in seen["-s"])


def test_deprecated_spellings_are_hidden_aliases_listed_in_the_conventions_page():
    page = (REPO / "docs" / "cli-conventions.md").read_text()
    section = page[page.index("## Names"):]
    section = section[: section.index("\n## ", 5)]
    by_path = dict(commands())
    for (path, old), new in ALIASES.items():
        p = next(q for q in options(by_path[path]) if old in q.opts)
        assert p.hidden, (path, old)
        assert f"{path} {old}" in section, f"docs/cli-conventions.md's naming table does not list {path} {old}"


def test_every_count_option_is_bounded():
    unbounded = []
    for path, cmd in commands():
        for p in options(cmd):
            if _is_int(p) and not p.hidden and (p.min is None or (p.max is None and p.name not in ("limit",))):
                unbounded.append(f"{path} {p.opts[0]}")
    assert not unbounded, unbounded


def test_choice_options_list_their_choices_in_help(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    code, out, _ = run(["init", "--help"], capsys)
    assert code == 0 and "linear|self_attention|slot_query" in out
    code, out, _ = run(["export", "--help"], capsys)
    assert "fp32|fp16" in out and "ort-cpu|standard" in out
    code, out, _ = run(["calibrate", "--help"], capsys)
    assert "ort-static|ort-dynamic|ort-weight-only|modelopt" in out


def test_choice_lists_match_the_library():
    from hllm.cli.train_cmds import AGGREGATIONS, OBJECTIVES
    from hllm.teacher.embedding import AGGREGATIONS as LIB_AGG
    from hllm.training.targets import TARGET_KINDS

    assert OBJECTIVES is TARGET_KINDS and AGGREGATIONS is LIB_AGG  # one definition (hllm.training.choices)


def test_version_and_completion(capsys):
    import hllm

    code, out, _ = run(["--version"], capsys)
    assert code == 0 and out.strip() == f"hllm {hllm.__version__}"
    root = get_command(app)
    assert {"--install-completion", "--show-completion"} <= {o for p in root.params for o in getattr(p, "opts", [])}


def test_progress_bars_show_an_eta():
    from rich.progress import TimeRemainingColumn

    assert any(isinstance(c, TimeRemainingColumn) for c in cli_app.progress().columns)


# -- the packaged sample ----------------------------------------------------------------------------------

def test_sample_slates_ship_as_package_data(tmp_path, monkeypatch):
    import tomllib

    from hllm.data import SAMPLE_NAME, sample_slates

    p = sample_slates()
    assert p.parent == REPO / "hllm" / "data" and p.is_file()
    assert (REPO / "examples" / SAMPLE_NAME).resolve() == p.resolve()  # one copy in git: examples/ links to it
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert any(SAMPLE_NAME.endswith(pat.lstrip("*")) for pat in data["hllm.data"])
    monkeypatch.chdir(tmp_path)  # the default no longer depends on the current directory
    rows = cli_io.load_slates(None, limit=3)
    assert len(rows) == 3 and all(len(s["candidates"]) == 50 for s in rows)


# -- stdin / stdout / --json ----------------------------------------------------------------------------

def _stdin(monkeypatch, data: bytes):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def test_rank_reads_stdin_and_writes_stdout(export_dir, monkeypatch, capsys):
    slates = tiny_slates(3, (2, 8), seed=5)
    text = "".join(json.dumps(s) + "\n" for s in slates).encode()
    for payload in (text, gzip.compress(text)):
        _stdin(monkeypatch, payload)
        code, out, err = run(["rank", str(export_dir), "-s", "-", "-o", "-", "-b", "2"], capsys)
        assert code == 0, err
        rows = [json.loads(x) for x in out.splitlines()]
        assert [r["slate_id"] for r in rows] == [s["slate_id"] for s in slates]
        assert "ranked 3 slates" in err  # the human summary moved to stderr


def test_stdin_errors_name_stdin_and_the_line(export_dir, monkeypatch, capsys, tmp_path):
    _stdin(monkeypatch, b'{"slate_id": "a", "candidates": [}\n')
    code, out, err = run(["rank", str(export_dir), "-s", "-", "-o", str(tmp_path / "r.jsonl")], capsys)
    assert code == 2 and "<stdin>:1" in err and "malformed JSON" in err and out == ""
    assert not (tmp_path / "r.jsonl").exists()


def test_json_summaries(export_dir, merged_checkpoint, tmp_path, capsys):
    src = tmp_path / "s.jsonl"
    src.write_text("".join(json.dumps(s) + "\n" for s in tiny_slates(3, (2, 8), seed=6)))
    code, out, err = run(["rank", str(export_dir), "-s", str(src), "-o", str(tmp_path / "r.jsonl"), "--json"], capsys)
    assert code == 0, err
    d = json.loads(out)
    assert d["command"] == "rank" and d["slates"] == 3 and d["out"] == str(tmp_path / "r.jsonl")
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == 3
    code, out, err = run(["parity", str(merged_checkpoint), str(export_dir), "-s", str(src), "--json"], capsys)
    assert code == 0, err
    d = json.loads(out)
    assert d["slates"] == 3 and d["passed"] is True and d["max_abs_diff"] <= 1e-4
    code, out, err = run(["parity", str(merged_checkpoint), str(export_dir), "-s", str(src), "-o", "-"], capsys)
    assert code == 0 and json.loads(out)["slates"] == 3
    code, out, err = run(["eval", "random", "-s", str(src), "--json"], capsys)
    assert code == 0 and json.loads(out)["rankers"]["random"]["slates"] == 3
    code, out, err = run(["rank", str(export_dir), "-s", str(src), "-o", "-", "--json"], capsys)
    assert code == 2 and "only one thing can go to stdout" in err
    code, out, err = run(["bench", "lapjv", "-n", "3,4", "--families", "gaussian", "--matrices", "2", "-o", "-"], capsys)
    assert code == 0, err
    doc = json.loads(out)  # the table went to stderr, the document alone to stdout
    assert doc["kind"] == "lapjv" and [r["n_items"] for r in doc["records"]] == [3, 4] and "LAP solve" in err


# -- exit-code policy ---------------------------------------------------------------------------------------

def _policy_app(monkeypatch, action):
    t = typer.Typer()
    t.callback()(cli_app._root)

    @t.command("go")
    def go() -> None:
        action()

    monkeypatch.setattr(cli_app, "app", t)


def _raise(exc):
    def f():
        raise exc
    return f


@pytest.mark.parametrize("exc,code,needle", [
    (HllmError("bad slate"), 2, "error: bad slate"),
    (FileExistsError("x already exists (pass --overwrite to replace it)"), 2, "--overwrite"),
    (FileNotFoundError(errno.ENOENT, "No such file or directory", "/nope"), 2, "/nope"),
    (OSError(errno.ENOSPC, "No space left on device", "/full/x"), 2, "no space left"),
    (PermissionError(errno.EACCES, "Permission denied", "locked/x"), 2, "Permission denied"),
    (ModuleNotFoundError("No module named 'fastapi'", name="fastapi"), 2, "pip install 'hllm[serve]'"),
    (MemoryError(), 2, "out of memory"),
    (typer.Exit(1), 1, None),
    (KeyboardInterrupt(), 130, "interrupted"),
    (BrokenPipeError(errno.EPIPE, "Broken pipe"), 0, None),
    (ValueError("an unexpected bug"), 70, "rerun with --debug"),
    (ModuleNotFoundError("No module named 'nothing_of_ours'", name="nothing_of_ours"), 70, "internal error"),
])
def test_exit_code_policy(monkeypatch, capsys, exc, code, needle):
    _policy_app(monkeypatch, _raise(exc))
    stdout = sys.stdout
    got, out, err = run(["go"], capsys)
    sys.stdout = stdout  # click wraps stdout after EPIPE
    assert got == code
    assert "Traceback" not in err
    if needle:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], err


def test_debug_shows_the_exception(monkeypatch, capsys):
    _policy_app(monkeypatch, _raise(ValueError("boom")))
    with pytest.raises(ValueError, match="boom"):
        main(["--debug", "go"])
    monkeypatch.setenv("HLLM_DEBUG", "1")
    with pytest.raises(ValueError, match="boom"):
        main(["go"])


SIGTERM_SCRIPT = """
import os, signal, sys
from pathlib import Path
import typer
import hllm.cli  # registers the commands
from hllm.files import atomic_path

cli_app = sys.modules["hllm.cli.app"]

target = Path(sys.argv[1])
t = typer.Typer()
t.callback()(cli_app._root)

@t.command("go")
def go() -> None:
    with atomic_path(target) as tmp:
        tmp.write_text("half")
        os.kill(os.getpid(), signal.SIGTERM)  # delivered to the main thread: raises Terminated here
        tmp.write_text("never")

cli_app.app = t
before = signal.getsignal(signal.SIGTERM)
code = cli_app.run(["go"])
assert signal.getsignal(signal.SIGTERM) is before, "the handler is not restored after the run"
sys.exit(code)
"""


def test_sigterm_exits_143_and_atomic_writes_clean_up(tmp_path):
    """SIGTERM mid-write: exit 143, one error line, the old file intact, no temporary left, handler restored.
    Runs in a fresh interpreter, so that no other test's library state (OpenVINO's per-thread signal stack,
    tests/engines/test_openvino_signals.py) takes part."""
    target = tmp_path / "out.jsonl"
    target.write_text("good\n")
    r = subprocess.run([sys.executable, "-c", SIGTERM_SCRIPT, str(target)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 143 and r.stderr.startswith("error: terminated (SIGTERM)"), (r.returncode, r.stderr[-1000:])
    assert target.read_text() == "good\n" and sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]


# -- hllm info ------------------------------------------------------------------------------------------

def _info(path, capsys) -> dict:
    code, out, err = run(["info", str(path), "--json"], capsys)
    assert code == 0, err
    return json.loads(out)


def test_info_checkpoint_export_and_onnx_metadata(lora_checkpoint, merged_checkpoint, export_dir, capsys):
    d = _info(lora_checkpoint, capsys)
    assert d["kind"] == "checkpoint" and d["num_positions"] == 8 and d["head"]["kind"] == "self_attention"
    assert d["adapter"]["rank"] == 4 and d["backbone"]["model_type"] == "qwen3" and d["bytes"] > 0
    assert len(d["tokenizer"]["sha256"]) == 64
    assert _info(merged_checkpoint, capsys)["adapter"] is None
    side = json.loads((export_dir / "export.json").read_text())
    d = _info(export_dir, capsys)
    assert d["kind"] == "onnx-export" and d["flavour"] == "ort-cpu" and d["precision"] == "fp32"
    assert d["num_positions"] == 8 and d["pad_id"] == side["pad_id"] and d["opset"] == side["opset"]
    assert d["graph"]["bytes"] == side["onnx_bytes"] and d["tokenizer"]["sha256"] == side["tokenizer_sha256"]
    assert [i["name"] for i in d["inputs"]] == ["input_ids", "readout_positions", "item_mask"]
    props = d["onnx_header"]["metadata_props"]  # what `hllm export` stamped into the graph itself
    assert props["hllm.format"] == "hllm-onnx" and props["hllm.num_positions"] == "8"
    assert props["hllm.flavour"] == "ort-cpu" and props["hllm.pad_id"] == str(side["pad_id"])
    assert json.loads(props["hllm.prompt"]) == side["prompt"] and props["hllm.context"] == "false"
    assert props["hllm.inputs"] == "input_ids,readout_positions,item_mask"
    assert [i["name"] for i in d["onnx_header"]["inputs"]] == props["hllm.inputs"].split(",")
    assert _info(export_dir / "model.onnx", capsys)["path"] == str(export_dir)


def test_info_plan_calibration_set_feature_cache_backbone_slates(standard_export_dir, qwen3_backbone, tmp_path, capsys):
    from hllm.formats.calibration_set import CalibrationSet, FORMAT
    from hllm.formats.plan import write_sidecar
    from hllm.engines.tensorrt.profiles import default_profile

    side = json.loads((standard_export_dir / "export.json").read_text())
    plan = tmp_path / "m.plan"
    plan.write_bytes(b"\0" * 1000)
    write_sidecar(plan, {"tensorrt_version": "10.13.0", "compute_capability": "8.0", "gpu_name": "NVIDIA A100",
                         "profiles": [default_profile(8, 64).to_dict()], "precision": "fp16", "num_positions": 8,
                         "prompt": side["prompt"], "tokenizer": "m.tokenizer.json", "onnx_sha256": "ab" * 32})
    d = _info(plan, capsys)
    assert d["kind"] == "tensorrt-plan" and d["bytes"] == 1000 and d["precision"] == "fp16"
    assert d["profiles"][0]["items"] == {"min": 1, "opt": 8, "max": 8} and d["build"]["gpu_name"] == "NVIDIA A100"
    batch = {"input_ids": np.ones((2, 5), np.int64), "readout_positions": np.zeros((2, 3), np.int64),
             "item_mask": np.ones((2, 3), bool)}
    CalibrationSet([batch], {"format": FORMAT, "shapes": [[2, 5, 3]], "slate_ids": ["a", "b"], "seed": 7}).save(tmp_path / "cal")
    d = _info(tmp_path / "cal.npz", capsys)
    assert d["kind"] == "calibration-set" and d["batches"] == 1 and d["slates"] == 2 and d["provenance"]["seed"] == 7
    cache = tmp_path / "feat"
    cache.mkdir()
    (cache / "meta.json").write_text(json.dumps({"version": 1, "layer": 1, "num_layers": 2, "slate_ids": ["a", "b"],
                                                 "prompt": side["prompt"], "fingerprint": "f"}))
    d = _info(cache, capsys)
    assert d["kind"] == "feature-cache" and d["complete"] and d["layer"] == 1 and d["slates"] == 2
    d = _info(qwen3_backbone, capsys)
    assert d["kind"] == "backbone" and d["model_type"] == "qwen3" and d["tokenizer"] is True
    src = tmp_path / "s.jsonl.gz"
    with gzip.open(src, "wt") as f:
        f.write("".join(json.dumps(s) + "\n" for s in tiny_slates(4, 5)))
    d = _info(src, capsys)
    assert d["kind"] == "slates" and d["slates"] == 4 and d["candidates"]["max"] == 5 and d["labelled_slates"] == 4


def test_info_is_torch_free():
    import subprocess

    code = ("import sys; from hllm.cli.describe import describe; import hllm.engines.tensorrt.interop; "
            "print('torch' in sys.modules or 'transformers' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr


# -- hllm encode: Polygraphy's --load-inputs format -------------------------------------------------------

def _decode_polygraphy(text: str) -> list[dict]:
    """Independent reader of Polygraphy's JSON (polygraphy/json/serde.py: ndarray → {"array": base64 .npy,
    "polygraphy_class": "ndarray"}), pickle disabled."""
    return [{k: np.load(io.BytesIO(base64.b64decode(v["array"])), allow_pickle=False) for k, v in feed.items()
             if v["polygraphy_class"] == "ndarray"} for feed in json.loads(text)]


def test_encode_writes_polygraphy_inputs(export_dir, tmp_path, capsys):
    from hllm.runtime.artefact import resolve
    from hllm.runtime.prompt import PromptBuilder, load_tokenizer

    slates = tiny_slates(5, (1, 8), seed=9)
    src = tmp_path / "s.jsonl"
    src.write_text("".join(json.dumps(s) + "\n" for s in slates))
    code, out, err = run(["encode", str(export_dir), "-s", str(src), "-o", str(tmp_path / "in.json"), "-b", "2", "--json"],
                         capsys)
    assert code == 0, err
    assert json.loads(out)["feeds"] == 3
    feeds = _decode_polygraphy((tmp_path / "in.json").read_text())
    art = resolve(export_dir)
    builder = PromptBuilder(load_tokenizer(art.tokenizer_path), art.prompt, max_items=8)
    for i, feed in enumerate(feeds):
        want = builder.encode(slates[2 * i: 2 * i + 2]).inputs(art.graph_inputs)
        assert list(feed) == list(want)
        for name in want:
            assert feed[name].dtype == want[name].dtype
            np.testing.assert_array_equal(feed[name], want[name])
    from hllm.engines.ort import OnnxRuntimeEngine  # the file really feeds the graph

    with OnnxRuntimeEngine(art.path, 8) as eng:
        assert eng.run(*feeds[0].values()).shape == (2, feeds[0]["item_mask"].shape[1], 8)
    try:
        from polygraphy.json import load_json
    except ImportError:
        return
    for got, want in zip(load_json(str(tmp_path / "in.json")), feeds):
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])


def test_polygraphy_json_round_trip():
    from hllm.engines.tensorrt.interop import polygraphy_inputs_json, read_polygraphy_inputs

    feeds = [{"a": np.arange(6, dtype=np.int64).reshape(2, 3), "m": np.array([[True, False]])}]
    text = polygraphy_inputs_json(feeds)
    assert '"polygraphy_class": "ndarray"' in text and "pickle" not in text
    back = read_polygraphy_inputs(text)
    assert back[0]["a"].dtype == np.int64 and back[0]["m"].dtype == bool
    np.testing.assert_array_equal(back[0]["a"], feeds[0]["a"])
    with pytest.raises(ValueError):
        read_polygraphy_inputs('{"a": 1}')


# -- hllm build --dry-run: trtexec and polygraphy convert -------------------------------------------------

def test_build_dry_run_prints_trtexec_and_polygraphy(standard_export_dir, tmp_path, capsys):
    plan, cache = tmp_path / "x.plan", tmp_path / "t.cache"
    code, out, err = run(["build", str(standard_export_dir), str(plan), "--dry-run", "--json",
                          "-p", "1:1:4/2:64:128/1:8:8", "-p", "1/8:512:1024/8", "--timing-cache", str(cache),
                          "--hardware-compat", "ampere_plus", "--workspace-gb", "2", "--opt-level", "4"], capsys)
    assert code == 0, err
    d = json.loads(out)
    onnx = str(standard_export_dir / "model.onnx")
    t = d["trtexec"]
    assert t[:3] == ["trtexec", f"--onnx={onnx}", f"--saveEngine={plan}"] and "--stronglyTyped" in t
    assert t[t.index("--profile=0") + 1] == "--minShapes=input_ids:1x2,readout_positions:1x1,item_mask:1x1"
    assert "--optShapes=input_ids:1x64,readout_positions:1x8,item_mask:1x8" in t
    assert t[t.index("--profile=1") + 3] == "--maxShapes=input_ids:1x1024,readout_positions:1x8,item_mask:1x8"
    assert {"--builderOptimizationLevel=4", f"--timingCacheFile={cache}", "--hardwareCompatibilityLevel=ampere+",
            "--memPoolSize=workspace:2048M", "--skipInference"} <= set(t)
    p = d["polygraphy"]
    assert p[:7] == ["polygraphy", "convert", onnx, "--convert-to", "trt", "-o", str(plan)] and "--strongly-typed" in p
    i = p.index("--trt-min-shapes")
    assert p[i + 1: i + 4] == ["input_ids:[1,2]", "readout_positions:[1,1]", "item_mask:[1,1]"]
    assert p.count("--trt-max-shapes") == 2 and p[p.index("--hardware-compatibility-level") + 1] == "ampere_plus"
    assert p[p.index("--pool-limit") + 1] == f"workspace:{2 * 1024**3}"
    assert "trtexec --onnx=" in err and "polygraphy convert" in err  # the human lines (stderr under --json)
    assert not plan.exists()


def test_fp16_export_keeps_the_metadata(merged_checkpoint, tmp_path):
    onnx = pytest.importorskip("onnx")
    from hllm.exporter.onnx import export_onnx

    export_onnx(merged_checkpoint, tmp_path / "e16", precision="fp16", slates=[])
    for name in ("model.onnx", "model.fp16-emulated.onnx"):
        props = {p.key: p.value for p in onnx.load(str(tmp_path / "e16" / name), load_external_data=False).metadata_props}
        assert props["hllm.num_positions"] == "8" and props["hllm.flavour"] == "standard" and "hllm.prompt" in props
        assert props.get("hllm.precision") in ("fp16", "fp16-emulated") or "hllm.fp32_islands" in props


def test_eval_names_inputs_and_pairs(tmp_path, capsys):
    """eval: a name given twice is refused (it would replace a row), -o never replaces a NAME=PATH ranker's
    JSONL, Rich markup in a name is printed literally, and the paired line under the table names both rows."""
    slates = tiny_slates(12, 5, seed=8)
    src = tmp_path / "s.jsonl"
    src.write_text("".join(json.dumps(s) + "\n" for s in slates))
    best = tmp_path / "best.jsonl"
    text = "".join(json.dumps({"slate_id": s["slate_id"], "order": sorted(range(5), key=lambda i: -s["labels"][i])}) + "\n"
                   for s in slates)
    best.write_text(text)
    code, out, err = run(["eval", "a=random", f"a={best}", "-s", str(src)], capsys)
    assert code == 2 and "'a' is given more than once" in err
    code, out, err = run(["eval", "random", f"b={best}", "-s", str(src), "-o", str(best)], capsys)
    assert code == 2 and "refusing to replace an input" in err and best.read_text() == text
    code, out, err = run(["eval", "random", f"[/x]={best}", "-s", str(src), "-o", "-"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["rankers"]["[/x]"]["auc"] == 1.0 and doc["rankers"]["[/x]"]["paired_vs_first"]["baseline"] == "random"
    assert "[/x] − random, paired over 12 slates (95% interval): ΔAUC +" in err
    code, out, err = run(["eval", "random", f"b={best}", "-s", str(src), "--limit", "3"], capsys)
    assert code == 0 and "paired over 3 slates: ΔAUC +" in out and "no interval below 10 slates" in out
