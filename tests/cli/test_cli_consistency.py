"""CLI consistency: `-h` on every command, help text shown literally (no Rich markup), deprecated spellings
warn on stderr and are gone from the Makefile and docs, `--json` on every command that produces something,
`parity` refuses a reference that is not a PyTorch checkpoint, a port in use is `error:` + exit 2."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest

from hllm.cli import main
from tests.cli.conftest import ALIASES, commands, options, run
from tests.conftest import REPO

#: Commands that write nothing a script would read (they run a server).
NO_JSON = {"serve"}
#: Value given to a deprecated option, by the parameter's Python type.
VALUES = {int: "3", float: "0.5", str: "cpu", Path: "alias-value.json"}


def test_dash_h_is_help_on_every_command(capsys):
    code, out, _ = run(["-h"], capsys)
    assert code == 0 and "Usage: hllm" in out
    for path, _cmd in commands():
        code, out, err = run([*path.split(), "-h"], capsys)
        assert code == 0 and f"Usage: hllm {path}" in out, (path, err)


def test_help_text_is_shown_literally_not_as_markup(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    code, out, _ = run(["rank", "--help"], capsys)
    assert code == 0 and "pip install 'hllm[ray]'" in out
    code, out, _ = run(["triton-repo", "--help"], capsys)
    assert "[x86_64|aarch64]" in out  # a choice list is not eaten as a style tag either


def _alias_value(cmd, old: str) -> str:
    p = next(q for q in options(cmd) if old in q.opts)
    ann = p.type_descriptor.annotation
    kind = next((t for t in VALUES if ann is t or t in getattr(ann, "__args__", ())), str)
    return VALUES[kind]


@pytest.mark.parametrize("path,old", [k for k in ALIASES if k != ("calibrate", "--out")])
def test_deprecated_spellings_warn_one_line(path, old, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cmd = dict(commands())[path]
    code, _, err = run([*path.split(), old, _alias_value(cmd, old)], capsys)  # then most fail: arguments missing
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: {old} is deprecated; use {ALIASES[(path, old)]}"], err
    assert code in (0, 2)  # `bench lapjv` needs no argument and runs


def _command_lines(text: str) -> list[str]:
    """Shell command lines (backslash continuations joined) that run `hllm` or `$(HLLM)`."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line for line in joined.splitlines() if re.search(r"(\bhllm|\$\(HLLM\)) [a-z]", line)]


def test_makefile_and_docs_use_the_current_option_names():
    files = [REPO / "Makefile", REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    stale = []
    for f in files:
        for line in _command_lines(f.read_text(encoding="utf-8")):
            if "deprecated" in line or line.lstrip().startswith("|"):  # the naming table lists them on purpose
                continue
            for (path, old), new in ALIASES.items():
                if (path, old) == ("calibrate", "--out"):  # calibrate EXPORT --out/-o DIR → calibrate EXPORT OUT_DIR
                    if re.search(r"(\bhllm|\$\(HLLM\)) calibrate \S+ (-o|--out) ", line):
                        stale.append(f"{f.name}: calibrate -o (use OUT_DIR): {line.strip()[:120]}")
                    continue
                if re.search(rf"(\bhllm|\$\(HLLM\)) {re.escape(path)}\b.*\s{re.escape(old)}(\s|=|$)", line):
                    stale.append(f"{f.name}: {path} {old} (use {new}): {line.strip()[:120]}")
    assert not stale, "\n".join(stale)


def test_every_command_that_produces_something_has_json():
    missing = [path for path, cmd in commands() if path not in NO_JSON and not any("--json" in p.opts for p in options(cmd))]
    assert not missing, missing


def test_json_of_init_triton_repo_and_bench_markdown(qwen3_backbone, export_dir, tmp_path, capsys):
    code, out, err = run(["init", str(qwen3_backbone), str(tmp_path / "ck"), "-k", "8", "--json"], capsys)
    assert code == 0, err
    d = json.loads(out)
    assert d["command"] == "init" and d["num_positions"] == 8 and d["out_dir"] == str(tmp_path / "ck")
    code, out, err = run(["triton-repo", str(export_dir), str(tmp_path / "tr"), "--instance-kind", "cpu", "--json"], capsys)
    assert code == 0, err
    d = json.loads(out)
    assert d["command"] == "triton-repo" and d["num_positions"] == 8 and "hllm_ranker" in d["models"]
    assert (tmp_path / "tr/models/hllm_ranker/config.pbtxt").is_file()
    code, out, err = run(["bench", "markdown", str(REPO / "results/bench/lapjv.json"), "--json"], capsys)
    assert code == 0, err
    (doc,) = json.loads(out)
    assert doc["kind"] == "lapjv" and doc["markdown"].lstrip().startswith("|")


def test_parity_refuses_a_reference_that_is_not_pytorch(export_dir, tmp_path, capsys):
    src = str(REPO / "examples/beauty-eval-sample.jsonl.gz")
    code, out, err = run(["parity", str(export_dir), str(export_dir), "--limit", "1"], capsys)
    assert code == 2 and err.startswith("error:") and "not a PyTorch checkpoint" in " ".join(err.split())
    assert "--allow-non-torch-reference" in err
    from hllm.testing import tiny_slates
    from hllm.runtime.slates import write_jsonl

    write_jsonl(tmp_path / "s.jsonl", tiny_slates(2, (2, 8), seed=5))
    code, out, err = run(["parity", str(export_dir), str(export_dir), "-s", str(tmp_path / "s.jsonl"),
                          "--allow-non-torch-reference", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["max_abs_diff"] == 0.0 and src


def test_serve_on_a_busy_port_is_an_error_with_exit_2(export_dir, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        with pytest.raises(SystemExit) as e:
            main(["serve", str(export_dir), "--port", str(port)])
    err = capsys.readouterr().err
    assert e.value.code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-1].startswith("error:") and f"127.0.0.1:{port}" in lines[-1] and "in use" in lines[-1].lower()
