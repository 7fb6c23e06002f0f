"""Policies for inputs that are valid but easy to misread (docs/hardening.md, "Outputs against inputs"):
`hllm rank` streams its slates (rankings leave before the input ends) and refuses an endless run of blank
lines; `calibrate --backend auto` refuses the single-recipe options it would ignore; unlabelled gate slates
are warned about; a sidecar naming an unknown engine is refused; a selected export never shares an inode
with the export it was made from."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hllm.testing import tiny_slates
from tests.cli.conftest import run

import hllm

HLLM = [sys.executable, "-m", "hllm"]
#: Subprocesses run the hllm this test imported (not whichever one the interpreter would find from their cwd).
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(hllm.__file__).resolve().parents[1]),
                                                   os.environ.get("PYTHONPATH", "")])}


def _slate_line(i: int, labels: bool = True) -> str:
    s = tiny_slates(1, 4, seed=i)[0]
    s["slate_id"] = f"s{i}"
    if not labels:
        s.pop("labels")
    return json.dumps(s) + "\n"


def test_rank_streams_a_ranking_out_before_the_input_ends(export_dir, tmp_path):
    """A pipe that stays open after one slate: its ranking arrives on stdout while stdin is still open
    (the whole input is never held: one batch at a time)."""
    p = subprocess.Popen([*HLLM, "rank", str(export_dir), "-s", "-", "-o", "-"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path, env=ENV)
    try:
        p.stdin.write(_slate_line(0).encode())
        p.stdin.flush()
        ready, _, _ = select.select([p.stdout], [], [], 120)
        assert ready, "no ranking before stdin was closed: the input is read whole before ranking"
        first = json.loads(p.stdout.readline())
        assert first["slate_id"] == "s0" and sorted(first["order"]) == [0, 1, 2, 3]
        assert p.poll() is None  # still waiting for more slates
        p.stdin.write(_slate_line(1).encode())
        p.stdin.close()
        rest = p.stdout.read().decode().splitlines()
        assert p.wait(60) == 0, p.stderr.read().decode()
        assert [json.loads(r)["slate_id"] for r in rest] == ["s1"]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_rank_streamed_to_a_file_is_the_same_as_ranked_whole_and_names_id_less_slates_by_index(export_dir, tmp_path, capsys):
    src = tmp_path / "s.jsonl"
    lines = [_slate_line(i) for i in range(5)]
    lines[3] = json.dumps({k: v for k, v in json.loads(lines[3]).items() if k != "slate_id"}) + "\n"
    src.write_text("".join(lines))
    code, _, err = run(["rank", str(export_dir), "-s", str(src), "-o", str(tmp_path / "r.jsonl"), "-b", "2"], capsys)
    assert code == 0, err
    got = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [g["slate_id"] for g in got] == ["s0", "s1", "s2", "3", "s4"]
    from hllm.runtime import Ranker

    with Ranker.from_path(export_dir) as r:
        whole = r.rank([json.loads(x) for x in lines])
    assert [g["order"] for g in got] == [w.order for w in whole]


def test_blank_lines_are_skipped_but_an_endless_run_of_them_is_refused(export_dir, tmp_path, capsys):
    src = tmp_path / "spaced.jsonl"
    src.write_text("\n\n" + _slate_line(0) + "\n \n\t\n" + _slate_line(1) + "\n\n")
    code, _, err = run(["rank", str(export_dir), "-s", str(src), "-o", str(tmp_path / "r.jsonl")], capsys)
    assert code == 0, err
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == 2
    p = subprocess.Popen(f"yes '' | {' '.join(HLLM)} rank {export_dir} -s - --limit 1 -o {tmp_path / 'y.jsonl'}",
                         shell=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=ENV,
                         start_new_session=True)
    try:
        _, err = p.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # the shell, yes and hllm: the session this test started
        p.communicate()
        pytest.fail("`yes '' | hllm rank -s - --limit 1` still reading blank lines after 90 s")
    assert p.returncode == 2, err
    assert "blank lines in a row" in err and "<stdin>:10001" in err, err
    assert not (tmp_path / "y.jsonl").exists()


@pytest.mark.parametrize("extra", [["--precision", "int8"], ["-x", "head"], ["--exclude-node", "n1", "--auto"],
                                   ["--per-channel"], ["--target", "a100"]])
def test_calibrate_backend_auto_refuses_the_options_it_would_ignore(extra, tmp_path, capsys):
    exp = tmp_path / "exp"
    exp.mkdir()
    code, _, err = run(["calibrate", str(exp), str(tmp_path / "q"), "--backend", "auto", *extra], capsys)
    assert code == 2
    named = {"-x": "--exclude"}.get(extra[0], extra[0])  # the message names an option by its long name
    assert "--backend auto" in err and f"does not use {named}" in err, err
    assert not (tmp_path / "q").exists()


def test_calibrate_warns_when_no_gate_slate_is_labelled(export_dir, tmp_path, capsys):
    src = tmp_path / "unlabelled.jsonl"
    src.write_text("".join(_slate_line(i, labels=False) for i in range(3)))
    code, _, err = run(["calibrate", str(export_dir), str(tmp_path / "q"), "--backend", "ort-dynamic", "-s", str(src),
                        "--min-top1", "0"], capsys)
    assert code in (0, 1), err
    warning = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and "none of the 3 gate slates has a positive label" in warning[0], err
    assert "ΔRecall@10, ΔAUC" in warning[0]


def test_labelled_gate_slates_get_no_warning(capsys):
    from hllm.cli.calibrate_cmds import warn_unlabelled

    warn_unlabelled([json.loads(_slate_line(0, labels=False)), json.loads(_slate_line(1))])
    assert "warning" not in capsys.readouterr().err
    warn_unlabelled([{**json.loads(_slate_line(2)), "labels": [0, 0, 0, 0]}])  # labels, but no positive
    assert "has a positive label" in capsys.readouterr().err


@pytest.mark.parametrize("engine", [5, "tensorrt", None, ["openvino"]])
def test_a_sidecar_engine_hllm_cannot_run_is_refused_naming_the_field(engine, export_dir, tmp_path, capsys):
    exp = tmp_path / "exp"
    shutil.copytree(export_dir, exp)
    side = json.loads((exp / "export.json").read_text())
    side["engine"] = engine
    (exp / "export.json").write_text(json.dumps(side))
    src = tmp_path / "s.jsonl"
    src.write_text(_slate_line(0))
    code, _, err = run(["rank", str(exp), "-s", str(src), "-o", str(tmp_path / "r.jsonl")], capsys)
    if engine is None:  # null: as good as absent, ONNX Runtime
        assert code in (0, 2)
        if code == 2:
            assert "engine" in err
        return
    assert code == 2 and "engine" in err and str(engine if not isinstance(engine, list) else "list") in err, err
    assert not (tmp_path / "r.jsonl").exists()


def test_a_selected_fp32_export_shares_no_inode_with_its_input(export_dir, tmp_path):
    """The ``onnxruntime-fp32`` selection is a copy: writing the selected graph in place leaves the input's
    graph byte for byte as it was (a hard link would change both)."""
    from hllm.calibration.recipes.table import BASELINE, RECIPES

    exp = tmp_path / "exp"
    shutil.copytree(export_dir, exp)
    before = {p.name: p.read_bytes() for p in exp.iterdir() if p.is_file()}
    dst = next(c for c in RECIPES if c.name == BASELINE).build(exp, tmp_path / "selected").root
    for name in before:
        assert not os.path.samefile(dst / name, exp / name), name
        with open(dst / name, "r+b") as f:
            f.write(b"X")
    assert {p.name: p.read_bytes() for p in exp.iterdir() if p.is_file()} == before
