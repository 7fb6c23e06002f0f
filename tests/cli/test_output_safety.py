"""Outputs against inputs: every CLI option or argument that names a written path goes through the one
output check (:func:`hllm.cli.io.check_output_file` / :func:`hllm.cli.io.check_output_dir`) before any
work. The test enumerates the CLI's output parameters by introspecting the Typer app, so a new writer
option without a row in :data:`CASES` fails here; each is then aimed at an input of its command (exit 2,
a message naming the input, every input byte-for-byte and entry-for-entry unchanged, no probe file
created inside it), and every file output at a FIFO, a directory and a link to ``/dev/null``."""

from __future__ import annotations

import os
import re
import stat
import tempfile
from pathlib import Path

import pytest

from tests.cli.conftest import commands, run

#: A parameter whose name says it is written: out, output, report, summary, plan, log, timing_cache, reference_scores.
OUTPUT_NAME = re.compile(r"(^|_)(out|output|report|summary|plan|log|timing_cache|reference_scores)(_|$)")

#: (command, parameter) → (argv with {OUT} where the output goes, an {OUT} that is or lies inside an input,
#: kind). Placeholders: {EXP} export dir, {CKPT} checkpoint dir, {BB} backbone dir, {S} slates JSONL,
#: {ST} a stages benchmark JSON, {GGUF} a GGUF file in {GDIR}, {W} a scratch directory (not an input).
CASES: dict[tuple[str, str], tuple[str, str, str]] = {
    ("convert-gguf", "out_dir"): ("convert-gguf {OUT} --gguf {GGUF}", "{GDIR}", "dir"),
    ("init", "out_dir"): ("init {BB} {OUT}", "{BB}/ckpt", "dir"),
    ("import", "out_dir"): ("import {BB} {OUT} --head {CKPT}/head.safetensors --head-kind self_attention --num-heads 4",
                            "{BB}/ckpt", "dir"),
    ("merge", "out_dir"): ("merge {CKPT} {OUT}", "{CKPT}/merged", "dir"),
    ("export", "out_dir"): ("export {CKPT} {OUT}", "{CKPT}", "dir"),
    ("rank", "out_path"): ("rank {EXP} -s {S} -o {OUT}", "{EXP}/x.jsonl", "file"),
    ("parity", "out_path"): ("parity {CKPT} {EXP} -s {S} -o {OUT}", "{CKPT}/hllm.json", "file"),
    ("parity", "report"): ("parity {CKPT} {EXP} -s {S} --report {OUT}", "{S}", "file"),
    ("encode", "out_path"): ("encode {EXP} -s {S} -o {OUT}", "{EXP}/model.onnx", "file"),
    ("loadtest", "out_path"): ("loadtest {EXP} -s {S} -o {OUT}", "{EXP}/load.json", "file"),
    ("triton-repo", "out_dir"): ("triton-repo {EXP} {OUT}", "{EXP}/repo", "dir"),
    ("calibrate", "out_dir"): ("calibrate {EXP} {OUT} -s {S}", "{EXP}/sub", "dir"),
    ("calibrate", "out_alias"): ("calibrate {EXP} -o {OUT} -s {S}", "{EXP}", "dir"),
    ("calibrate", "reference_scores_path"): ("calibrate {EXP} {W}/q -s {S} --reference-scores {OUT}", "{EXP}/ref.npz", "file"),
    ("calibrate", "report"): ("calibrate {EXP} {W}/q -s {S} --report {OUT}", "{S}", "file"),
    ("build", "plan"): ("build {EXP} {OUT}", "{EXP}/model.plan", "file"),
    ("build", "timing_cache"): ("build {EXP} {W}/m.plan --timing-cache {OUT}", "{EXP}/timing.cache", "file"),
    ("train", "out_dir"): ("train {BB} {OUT} -s {S}", "{BB}/ckpt", "dir"),
    ("teacher", "out_file"): ("teacher {BB} -s {S} -o {OUT}", "{S}", "file"),
    ("teacher", "report"): ("teacher {BB} -s {S} -o {W}/t.jsonl --report {OUT}", "{BB}/config.json", "file"),
    ("teacher", "summary"): ("teacher {BB} -s {S} -o {W}/t.jsonl --summary {OUT}", "{BB}/summary.json", "file"),
    ("features", "out_dir"): ("features {BB} {OUT} -s {S} --layer 1", "{BB}/cache", "dir"),
    ("eval", "out_json"): ("eval random {EXP} -s {S} -o {OUT}", "{EXP}/metrics.json", "file"),
    ("bench stages", "out_path"): ("bench stages {EXP} -s {S} -o {OUT}", "{EXP}/stages.json", "file"),
    ("bench lapjv", "out_path"): ("bench lapjv --model {EXP} -s {S} -o {OUT}", "{EXP}/lapjv.json", "file"),
    ("bench scaling", "out_path"): ("bench scaling {CKPT} {EXP} -o {OUT}", "{CKPT}/hllm.json", "file"),
    ("bench versus-ar", "out_path"): ("bench versus-ar {EXP} --ar {BB} -s {S} -o {OUT}", "{BB}/config.json", "file"),
    ("bench chart", "out_path"): ("bench chart --stages {ST} -o {OUT}", "{ST}", "file"),
    ("bench frontier", "out_path"): ("bench frontier {CKPT} -c a|{EXP}|onnxruntime|fp32 -s {S} -o {OUT}",
                                     "{EXP}/frontier.json", "file"),
    ("debug precision", "islands_out"): ("debug precision {EXP} -s {S} -o {OUT}", "{EXP}/model.onnx", "file"),
    ("debug precision", "report"): ("debug precision {EXP} -s {S} -o {W}/isl.json --report {OUT}", "{EXP}/model.onnx", "file"),
}

#: The cases first reported (output, option): the export's graph, the slates, the checkpoint's manifest.
REPORTED = [
    ("debug precision", "report", "{EXP}/model.onnx"),
    ("debug precision", "report", "{S}"),
    ("bench frontier", "out_path", "{CKPT}/hllm.json"),
]


def output_params() -> set[tuple[str, str]]:
    """(command, parameter name) of every Path-valued parameter of the CLI whose name says it is written."""
    found = set()
    for path, cmd in commands():
        for p in cmd.params:
            ann = p.type_descriptor.annotation
            is_path = ann is Path or Path in getattr(ann, "__args__", ())
            if is_path and OUTPUT_NAME.search(p.name):
                found.add((path, p.name))
    return found


def test_every_output_parameter_of_the_cli_has_a_case():
    found = output_params()
    assert found == set(CASES), (f"output parameters without a case (add them to CASES and check them with "
                                 f"check_output_file / check_output_dir): {sorted(found - set(CASES))}; "
                                 f"stale cases: {sorted(set(CASES) - found)}")
    assert len(found) >= 25  # the enumeration sees the whole CLI, bench and debug sub-commands included


@pytest.fixture
def inputs(tmp_path, monkeypatch) -> dict[str, str]:
    """Small stand-ins for a command's inputs (the check runs before they are read, so their contents do
    not matter), in ``tmp_path/in``; ``W`` is a scratch directory outside them."""
    root = tmp_path / "in"
    exp, ckpt, bb, gdir, w = root / "exp", root / "ckpt", root / "bb", root / "gguf", tmp_path / "work"
    for d in (exp, ckpt, bb, gdir, w):
        d.mkdir(parents=True)
    (exp / "model.onnx").write_bytes(b"\x08\x09graph bytes")
    (exp / "export.json").write_text('{"format": "hllm-export"}\n')
    (exp / "tokenizer.json").write_text("{}\n")
    (ckpt / "hllm.json").write_text('{"format": "hllm-checkpoint"}\n')
    (bb / "config.json").write_text('{"model_type": "qwen3"}\n')
    (gdir / "m.gguf").write_bytes(b"GGUF\x03\x00")
    s = root / "slates.jsonl"
    s.write_text('{"slate_id": "a", "candidates": [{"title": "x"}, {"title": "y"}]}\n')
    st = root / "stages.json"
    st.write_text('{"kind": "stages", "records": []}\n')
    monkeypatch.chdir(w)  # default outputs (results/bench/...) land in the scratch directory
    return {"EXP": str(exp), "CKPT": str(ckpt), "BB": str(bb), "S": str(s), "ST": str(st), "GDIR": str(gdir),
            "GGUF": str(gdir / "m.gguf"), "W": str(w), "ROOT": str(root)}


def snapshot(root: str) -> dict[str, tuple]:
    """Every entry under ``root`` (and ``root`` itself): its kind, bytes (files), mode and mtime (a probe
    file created and removed in a directory changes the directory's mtime)."""
    snap = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [""] + dirnames + filenames:
            p = os.path.join(dirpath, name) if name else dirpath
            st = os.lstat(p)
            data = Path(p).read_bytes() if stat.S_ISREG(st.st_mode) else None
            snap[p] = (stat.S_IFMT(st.st_mode), st.st_mode, st.st_mtime_ns, data)
    return snap


@pytest.fixture
def temp_files_made(monkeypatch) -> list[str]:
    """Directories in which hllm created a temporary or probe file (``tempfile.mkstemp``/``mkdtemp``)."""
    made: list[str] = []
    real_mkstemp, real_mkdtemp = tempfile.mkstemp, tempfile.mkdtemp

    def mkstemp(*a, **k):
        made.append(os.path.realpath(k.get("dir") or tempfile.gettempdir()))
        return real_mkstemp(*a, **k)

    def mkdtemp(*a, **k):
        made.append(os.path.realpath(k.get("dir") or tempfile.gettempdir()))
        return real_mkdtemp(*a, **k)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    return made


def argv_of(template: str, values: dict[str, str], out: str) -> list[str]:
    return [part.format(OUT=out, **values) for part in template.split(" ")]


def assert_refused(argv, capsys, inputs, before, made, words=("input",)):
    code, stdout, err = run(argv, capsys)
    assert code == 2, (argv, code, err)
    line = err.strip().splitlines()[-1]
    assert line.startswith("error:") and all(w in line for w in words), (argv, err)
    assert snapshot(inputs["ROOT"]) == before, f"{argv}: an input changed"
    root = os.path.realpath(inputs["ROOT"])
    inside = [d for d in made if d == root or d.startswith(root + os.sep)]
    assert not inside, f"{argv}: a temporary or probe file was created inside an input ({inside})"
    return line


@pytest.mark.parametrize("key", sorted(CASES), ids=lambda k: f"{k[0]}:{k[1]}")
def test_an_output_that_is_or_lies_inside_an_input_is_refused_before_any_work(key, inputs, capsys, temp_files_made):
    template, target, _kind = CASES[key]
    before = snapshot(inputs["ROOT"])
    out = target.format(**inputs)
    line = assert_refused(argv_of(template, inputs, out), capsys, inputs, before, temp_files_made)
    assert re.search(r"is the input|inside the input|contains the input", line), line
    assert not os.listdir(inputs["W"]) or key[0] == "calibrate", f"{key}: something was written before the refusal"


@pytest.mark.parametrize("command,param,target", REPORTED, ids=lambda v: str(v))
def test_the_reported_destructive_outputs_are_refused(command, param, target, inputs, capsys, temp_files_made):
    template, _target, _kind = CASES[(command, param)]
    before = snapshot(inputs["ROOT"])
    assert_refused(argv_of(template, inputs, target.format(**inputs)), capsys, inputs, before, temp_files_made)


def _special(kind: str, where: Path) -> tuple[Path, str]:
    """An output path of the given wrong kind, and the words its refusal must contain."""
    if kind == "fifo":
        p = where / "fifo"
        os.mkfifo(p)
        return p, "FIFO"
    if kind == "dir":
        p = where / "a-directory"
        p.mkdir()
        return p, "directory"
    p = where / "null-link"
    p.symlink_to("/dev/null")
    return p, "character device"


FILE_CASES = sorted(k for k, v in CASES.items() if v[2] == "file")


@pytest.mark.parametrize("special", ["fifo", "dir", "devnull-link"])
@pytest.mark.parametrize("key", FILE_CASES, ids=lambda k: f"{k[0]}:{k[1]}")
def test_a_fifo_directory_or_dev_null_link_as_a_file_output_is_refused_before_any_work(key, special, inputs, capsys,
                                                                                       tmp_path, temp_files_made):
    template, _target, _kind = CASES[key]
    spot = tmp_path / "spot"
    spot.mkdir()
    out, word = _special(special, spot)
    before = snapshot(inputs["ROOT"])
    spot_before = sorted(os.listdir(spot))
    assert_refused(argv_of(template, inputs, str(out)), capsys, inputs, before, temp_files_made, (word,))
    assert sorted(os.listdir(spot)) == spot_before
    if special == "fifo":
        assert stat.S_ISFIFO(os.lstat(out).st_mode)
    if special == "devnull-link":
        assert os.path.islink(out) and os.readlink(out) == "/dev/null"
    assert not os.listdir(inputs["W"]) or key[0] == "calibrate", f"{key}: another output was written before the refusal"


@pytest.mark.parametrize("argv", [["calibrate", "{EXP}", "{EXP}/sub"], ["rank", "{EXP}", "-o", "{EXP}/x.jsonl"]])
def test_a_read_only_input_used_as_output_parent_is_inside_the_input_and_gets_no_probe(argv, inputs, capsys,
                                                                                      temp_files_made):
    exp = Path(inputs["EXP"])
    exp.chmod(0o555)
    try:
        before = snapshot(inputs["ROOT"])
        line = assert_refused([a.format(**inputs) for a in argv], capsys, inputs, before, temp_files_made)
        assert "inside the input" in line and "not writable" not in line, line
        assert not any(n.startswith(".hllm-probe") for n in os.listdir(exp))
    finally:
        exp.chmod(0o755)


@pytest.mark.parametrize("argv", [["eval", "mine={EXP}", "-s", "{S}", "-o", "{EXP}/metrics.json"],
                                  ["bench", "frontier", "{CKPT}", "-c", "a|{EXP}|onnxruntime|fp32", "-o", "{EXP}/f.json"]])
def test_a_path_named_inside_a_value_is_an_input_too(argv, inputs, capsys, temp_files_made):
    """``eval NAME=PATH`` and ``bench frontier -c NAME|PATH|…`` name an input inside a value: an output
    inside it is refused, and no probe file is created there first."""
    before = snapshot(inputs["ROOT"])
    line = assert_refused([a.format(**inputs) for a in argv], capsys, inputs, before, temp_files_made)
    assert "inside the input" in line and inputs["EXP"] in line, line


#: (command, parameter, parameter) → argv with {X} for both outputs, and the two option names the refusal
#: names. Every pair of outputs of a command is here (calibrate's OUT_DIR and -o are one output given two
#: ways, refused as such).
SHARED: dict[tuple[str, str, str], tuple[str, str, str]] = {
    ("parity", "out_path", "report"): ("parity {CKPT} {EXP} -s {S} -o {X} --report {X}", "--out", "--report"),
    ("build", "plan", "timing_cache"): ("build {EXP} {X} --timing-cache {X}", "PLAN", "--timing-cache"),
    ("teacher", "out_file", "report"): ("teacher {BB} -s {S} -o {X} --report {X}", "--out", "--report"),
    ("teacher", "out_file", "summary"): ("teacher {BB} -s {S} -o {X} --summary {X}", "--out", "--summary"),
    ("teacher", "report", "summary"): ("teacher {BB} -s {S} -o {W}/t.jsonl --report {X} --summary {X}",
                                       "--report", "--summary"),
    ("debug precision", "islands_out", "report"): ("debug precision {EXP} -s {S} -o {X} --report {X}",
                                                   "--out", "--report"),
    ("calibrate", "reference_scores_path", "report"): ("calibrate {EXP} {W}/q -s {S} --reference-scores {X} "
                                                       "--report {X}", "--reference-scores", "--report"),
    ("calibrate", "out_dir", "report"): ("calibrate {EXP} {X} -s {S} --report {X}", "OUT_DIR", "--report"),
    ("calibrate", "out_dir", "reference_scores_path"): ("calibrate {EXP} {X} -s {S} --reference-scores {X}",
                                                        "OUT_DIR", "--reference-scores"),
    ("calibrate", "out_alias", "report"): ("calibrate {EXP} -o {X} -s {S} --report {X}", "--out", "--report"),
}


def test_every_command_with_several_outputs_has_its_pairs_tried():
    from hllm.cli.io import OUTPUT_PARAM_NAME

    # the distinct-outputs rule sees the outputs this test enumerates
    assert OUTPUT_PARAM_NAME.pattern == OUTPUT_NAME.pattern
    by_command: dict[str, set[str]] = {}
    for command, param in output_params():
        by_command.setdefault(command, set()).add(param)
    several = {c: ps for c, ps in by_command.items() if len(ps) >= 2}
    assert set(several) == {c for c, _, _ in SHARED} and len(several) >= 5
    for c, ps in several.items():
        tried = {p for k in SHARED if k[0] == c for p in k[1:]}
        assert tried == ps, (c, sorted(ps - tried))


@pytest.mark.parametrize("exists", [False, True], ids=["new", "existing"])
@pytest.mark.parametrize("key", sorted(SHARED), ids=lambda k: f"{k[0]}:{k[1]}+{k[2]}")
def test_two_outputs_of_one_command_at_one_path_are_refused_before_any_work(key, exists, inputs, capsys,
                                                                             temp_files_made):
    """``debug precision -o f.json --report f.json`` would write the islands file then replace it with the
    report: refused (exit 2) naming both options, before anything is written, whether the path exists or not."""
    template, a, b = SHARED[key]
    x = Path(inputs["W"]) / "same.out"
    if exists:
        x.write_bytes(b"kept")
    before = snapshot(inputs["ROOT"])
    line = assert_refused(argv_of(template.replace("{X}", "{OUT}"), inputs, str(x)), capsys, inputs, before,
                          temp_files_made, (a, b, "same path", str(x)))
    assert "input" not in line, line
    assert sorted(os.listdir(inputs["W"])) == (["same.out"] if exists else [])
    if exists:
        assert x.read_bytes() == b"kept"
