"""Hostile input with bounded resources (docs/hardening.md, "Memory, outputs vs inputs, caches, library file
errors"): memory bounded by hostile text (peak RSS of a subprocess, bounds stated here), streaming stdin
honouring --limit, parallel writers, ``calibrate`` never writing into its input export, and the small
policies (HLLM_DEBUG, duplicate keys, telemetry)."""

from __future__ import annotations

import gzip
import json
import multiprocessing as mp
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from hllm.testing import tiny_slates

REPO = Path(__file__).resolve().parents[2]

#: Peak RSS of `hllm rank` on a slate with a 100 MB title (bound: 1 GB).
RANK_PEAK_RSS_BOUND = 1 << 30
#: Peak RSS of loading a calibration set whose .npz declares a 512 MiB member (numpy + hllm.formats only).
NPZ_PEAK_RSS_BOUND = 200 << 20

# Runs argv in a fresh Python whose only child it is, then prints that child's exit code and peak RSS
# (getrusage(RUSAGE_CHILDREN).ru_maxrss, KiB on Linux): the figure belongs to the command alone.
_MEASURE = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, "
            "stderr=subprocess.PIPE); sys.stderr.buffer.write(r.stderr); "
            "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)")


def _measure(argv: list[str], env: dict | None = None) -> tuple[int, int, str]:
    """(exit code, peak RSS in bytes, stderr) of ``argv`` run as a subprocess."""
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    p = subprocess.run([sys.executable, "-c", _MEASURE, *argv], capture_output=True, text=True, env=env, timeout=600)
    rc, rss = p.stdout.split()
    return int(rc), int(rss), p.stderr


def _hllm(*args: str) -> list[str]:
    return [sys.executable, "-m", "hllm", *args]


# -- 1. memory bounded by hostile text ------------------------------------------------------------------

def _slate_with_title(path: Path, title_bytes: int) -> Path:
    slate = tiny_slates(1, 3, seed=4)[0]
    head, tail = json.dumps({**slate, "candidates": slate["candidates"][:2] + [{"item_id": "huge", "title": "@@"}]}).split("@@")
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(head.encode())
        chunk = (b"lorem ipsum dolor sit amet " * 40000)[: 1 << 20]
        for _ in range(title_bytes >> 20):
            f.write(chunk)
        f.write(tail.encode() + b"\n")
    return path


def test_rank_a_100_mb_title_stays_under_1_gb_and_says_truncated(tmp_path, export_dir):
    slates = _slate_with_title(tmp_path / "huge.jsonl.gz", 100 << 20)
    out = tmp_path / "r.jsonl"
    rc, rss, err = _measure(_hllm("rank", str(export_dir), "-s", str(slates), "-o", str(out)))
    assert rc == 0, err
    assert rss < RANK_PEAK_RSS_BOUND, f"peak RSS {rss / 2**20:.0f} MiB"
    rec = json.loads(out.read_text())
    assert rec["truncated"] == [2] and sorted(rec["ranking"]) == sorted(["huge"] + [c["item_id"] for c in tiny_slates(1, 3, seed=4)[0]["candidates"][:2]])


def test_rank_a_line_over_the_limit_is_refused_naming_it_in_bounded_memory(tmp_path, export_dir):
    from hllm.runtime.slates import MAX_LINE_BYTES

    slates = _slate_with_title(tmp_path / "huge.jsonl.gz", MAX_LINE_BYTES + (4 << 20))
    rc, rss, err = _measure(_hllm("rank", str(export_dir), "-s", str(slates), "-o", str(tmp_path / "r.jsonl")))
    assert rc == 2 and "line longer than the limit of 134217728 bytes" in err, err
    assert rss < RANK_PEAK_RSS_BOUND, f"peak RSS {rss / 2**20:.0f} MiB"
    assert not (tmp_path / "r.jsonl").exists()


def test_titles_are_cut_by_characters_before_tokenizing_with_the_same_tokens(export_dir):
    from hllm.formats.export import read_export
    from hllm.runtime.prompt import CHARS_PER_TOKEN_CEILING, PromptBuilder, cut_text, load_tokenizer

    exp = read_export(export_dir)
    tok = load_tokenizer(exp.tokenizer_path)
    builder = PromptBuilder(tok, exp.prompt, max_items=exp.num_positions)
    budget = exp.prompt.candidate_token_budget
    long = " ".join(f"word{i} item, colour" for i in range(5000))  # natural-ish text far over the budget
    assert cut_text(long, budget) == (long[: budget * CHARS_PER_TOKEN_CEILING], True)
    assert cut_text("short", budget) == ("short", False)
    slate = {"slate_id": "s", "history": [long, "b"], "candidates": [{"title": long}, {"title": "x"}]}
    enc = builder.encode_one(slate)
    full = tok.encode(exp.prompt.candidate_template.format(title=long, index=1), add_special_tokens=False).ids[:budget]
    first = enc.ids[enc.readout[0] - budget + 1: enc.readout[0] + 1]
    assert first == full  # the same first `budget` tokens as tokenizing the whole title
    assert enc.truncated == [0]
    # a degenerate title (one character repeated: tokens of many characters) is still cut and recorded
    enc = builder.encode_one({"slate_id": "d", "candidates": [{"title": "=" * (budget * CHARS_PER_TOKEN_CEILING * 10)}]})
    assert enc.truncated == [0]


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def post_oversized(port: int, title_bytes: int) -> tuple[int, dict]:
    """POST a slate whose title makes the body ``title_bytes`` long: headers (Content-Length) and the first
    64 KiB of the body, then the answer (the server refuses before reading the rest; sending it all
    would meet a reset connection)."""
    import socket

    head = b'{"slates": [{"slate_id": "t", "candidates": [{"item_id": "a", "title": "'
    n = len(head) + title_bytes + len(b'"}]}]}')
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(f"POST /v1/rank HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {n}\r\nConnection: close\r\n\r\n".encode() + head + b"z" * (64 << 10))
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, json.loads(data.split(b"\r\n\r\n", 1)[1])


def test_server_refuses_oversized_titles_and_its_rss_returns(tmp_path, export_dir):
    """20 requests whose title makes the body exceed max_body_bytes (4 MiB) → 413 envelopes; 20 with a
    3.5 MB title (under the limit) → ranked, ``truncated``; RSS after within 100 MB of the RSS after warm-up."""
    import socket
    import urllib.error
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(_hllm("serve", str(export_dir), "--port", str(port)), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"

    def post(title: str) -> tuple[int, dict]:
        body = json.dumps({"slates": [{"slate_id": "t", "candidates": [{"item_id": "a", "title": title},
                                                                      {"item_id": "b", "title": "x"}]}]}).encode()
        req = urllib.request.Request(f"{url}/v1/rank", data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"{url}/readyz", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.2)
        assert post("warm")[0] == 200
        start = _rss(proc.pid)
        for _ in range(20):
            code, doc = post_oversized(port, 5 << 20)
            assert code == 413 and doc["error"]["kind"] == "too_large", doc
        for _ in range(20):
            code, doc = post("lorem ipsum " * 300_000)  # 3.6 MB, under the body limit
            assert code == 200 and doc["rankings"][0]["truncated"] == [0], doc
        grown = _rss(proc.pid) - start
        assert grown < 100 << 20, f"RSS grew {grown / 2**20:.0f} MiB"
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_calibration_npz_headers_are_checked_before_the_data(tmp_path):
    """A calibration set whose .npz declares a 512 MiB member (compressed to ~0.5 MB) is refused from the
    header: peak RSS stays under NPZ_PEAK_RSS_BOUND (numpy alone would decompress the whole member)."""
    import zipfile

    meta = {"format": "hllm-calibration/1", "shapes": [{"batch": 1, "seq": 8, "items": 2}], "data_sha256": "0" * 64}
    (tmp_path / "c.json").write_text(json.dumps(meta))
    with zipfile.ZipFile(tmp_path / "c.npz", "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        with zf.open("input_ids/0.npy", "w", force_zip64=True) as f:
            np.lib.format.write_array_header_1_0(f, {"descr": "<i8", "fortran_order": False, "shape": (1, 1 << 26)})
            for _ in range(64):
                f.write(bytes(8 << 20))
        for name in ("readout_positions/0", "item_mask/0"):
            with zf.open(name + ".npy", "w") as f:
                np.save(f, np.zeros((1, 2), np.int64 if name.startswith("r") else bool))
    code = ("import sys; from hllm.errors import SlateError; from hllm.formats.calibration_set import load_calibration_set\n"
            "try:\n    load_calibration_set(sys.argv[1])\nexcept SlateError as e:\n    print(e, file=sys.stderr); sys.exit(2)")
    rc, rss, err = _measure([sys.executable, "-c", code, str(tmp_path / "c")])
    assert rc == 2 and "input_ids/0" in err and "expected (1, 8)" in err, err
    assert rss < NPZ_PEAK_RSS_BOUND, f"peak RSS {rss / 2**20:.0f} MiB"


# -- 3. stdin is streamed ---------------------------------------------------------------------------------

def test_stdin_is_streamed_and_limit_stops_an_endless_producer(tmp_path, export_dir):
    """`-s -` with --limit 2 from a producer that never ends: ranks 2 slates and exits 0; nothing is left in
    $TMPDIR (stdin is not spooled to a file)."""
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmpdir)}
    proc = subprocess.Popen(_hllm("rank", str(export_dir), "-s", "-", "--limit", "2", "-o", str(tmp_path / "r.jsonl")),
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    lines = [(json.dumps(s) + "\n").encode() for s in tiny_slates(8, (2, 6), seed=5)]
    sent = 0

    def produce() -> None:
        nonlocal sent
        try:
            while True:
                proc.stdin.write(lines[sent % len(lines)])
                sent += 1
        except (BrokenPipeError, ValueError, OSError):
            pass

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    rc = proc.wait(timeout=300)  # a hang guard, not a timing assertion
    err = proc.stderr.read().decode()
    assert rc == 0, err
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == 2
    assert list(tmpdir.iterdir()) == []


def test_stdin_gzip_is_streamed(tmp_path, export_dir, monkeypatch, capsys):
    import io

    from hllm.cli.io import load_slates

    data = gzip.compress("".join(json.dumps(s) + "\n" for s in tiny_slates(5, (2, 6), seed=6)).encode())
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(io.BytesIO(data))))
    rows = load_slates(Path("-"), limit=3)
    assert [r["slate_id"] for r in rows] == [s["slate_id"] for s in tiny_slates(5, (2, 6), seed=6)[:3]]


# -- 2. parallel writers and outputs over inputs ------------------------------------------------------------

def _writer(path: str, tag: str, overwrite: bool, barrier, results) -> None:
    from hllm.files import atomic_dir

    try:
        with atomic_dir(path, overwrite=overwrite) as tmp:
            for i in range(20):
                (tmp / f"part{i}.txt").write_text(tag)
            barrier.wait(timeout=60)  # every writer commits at the same moment
        results.put((tag, "ok"))
    except FileExistsError:
        results.put((tag, "exists"))
    except Exception as e:  # noqa: BLE001 - the test reports any failure
        results.put((tag, f"{type(e).__name__}: {e}"))


def _run_writers(path: Path, n: int, overwrite: bool) -> list[str]:
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(str(path), f"w{i}", overwrite, barrier, results)) for i in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    return sorted(results.get(timeout=10)[1] for _ in procs)


def _one_writers_output(path: Path) -> None:
    files = sorted(path.iterdir())
    assert [f.name for f in files] == sorted(f"part{i}.txt" for i in range(20))
    assert len({f.read_text() for f in files}) == 1  # all from one writer: never a mix
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []  # no staging left


def test_parallel_overwrites_never_fail_and_never_mix(tmp_path):
    out = tmp_path / "out"
    for _ in range(3):
        assert _run_writers(out, 6, overwrite=True) == ["ok"] * 6
        _one_writers_output(out)


def test_parallel_writers_without_overwrite_one_wins_the_others_are_refused(tmp_path):
    out = tmp_path / "new"
    assert _run_writers(out, 4, overwrite=False) == ["exists"] * 3 + ["ok"]
    _one_writers_output(out)


def test_refuse_overlap_names_both_paths(tmp_path):
    from hllm.errors import OutputError
    from hllm.files import refuse_overlap

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "f.jsonl").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "in")
    with pytest.raises(OutputError, match="is the input"):
        refuse_overlap(tmp_path / "link" / "f.jsonl", [tmp_path / "in" / "f.jsonl"])
    with pytest.raises(OutputError, match="inside the input"):
        refuse_overlap(tmp_path / "in" / "new.onnx", [tmp_path / "link"])
    with pytest.raises(OutputError, match="contains the input"):
        refuse_overlap(tmp_path, [tmp_path / "in" / "f.jsonl"], "dir")
    refuse_overlap(tmp_path / "other", [tmp_path / "in", tmp_path / "missing", "-"], "dir")  # fine


def test_calibrate_never_writes_into_its_input_export(tmp_path, standard_export_dir):
    """ONNX Runtime's quantizer writes ``<graph>-inferred.onnx`` beside the graph it is given; calibrate
    gives it a view inside its staging directory: the export is byte-for-byte unchanged and a user's file
    of that name is kept."""
    import shutil

    from hllm.cli import main

    export = tmp_path / "export"
    shutil.copytree(standard_export_dir, export)
    (export / "model-inferred.onnx").write_text("the user's own file\n")
    before = {p.name: p.read_bytes() for p in export.iterdir()}
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps(s) + "\n" for s in tiny_slates(3, (2, 6), seed=1)))
    with pytest.raises(SystemExit) as e:
        main(["calibrate", str(export), str(tmp_path / "q"), "--backend", "ort-dynamic", "-s", str(good),
              "--min-top1", "0", "--max-recall10-delta", "1"])
    assert e.value.code in (0, 1)
    assert {p.name: p.read_bytes() for p in export.iterdir()} == before


# -- 6. small policies ------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, on", [("1", True), ("true", True), ("ON", True), ("yes", True), ("", False),
                                       ("0", False), ("false", False), ("False", False), ("no", False), ("off", False)])
def test_hllm_debug_values(value, on):
    from hllm.cli.app import debug_from_env

    assert debug_from_env(value) is on


def test_hllm_debug_false_keeps_the_one_line_error(monkeypatch, capsys, tmp_path):
    from hllm.cli import main

    monkeypatch.setenv("HLLM_DEBUG", "false")
    with pytest.raises(SystemExit) as e:
        main(["info", str(tmp_path / "nope")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err


def test_duplicate_json_keys_are_refused_everywhere(tmp_path):
    from hllm.errors import CheckpointError, SlateError
    from hllm.reading import read_json
    from hllm.runtime.slates import loads_json

    with pytest.raises(SlateError, match="duplicate key 'a'"):
        loads_json('{"a": 1, "b": {"c": 2}, "a": 3}')
    with pytest.raises(SlateError, match="duplicate key 'c'"):
        loads_json('{"b": {"c": 2, "c": 2}}')
    (tmp_path / "m.json").write_text('{"x": 1, "x": 1}')
    with pytest.raises(CheckpointError, match="duplicate key 'x'"):
        read_json(tmp_path / "m.json", CheckpointError)
    assert loads_json('{"a": {"a": 1}}') == {"a": {"a": 1}}  # the same key in different objects is fine


def test_onnx_runtime_telemetry_writes_nothing_under_home(tmp_path, export_dir):
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("ORT_DISABLE_TELEMETRY", "XDG_CACHE_HOME")}
    env.update({"HOME": str(home), "PYTHONPATH": str(REPO)})
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps(s) + "\n" for s in tiny_slates(2, (2, 4), seed=1)))
    r = subprocess.run(_hllm("rank", str(export_dir), "-s", str(good), "-o", str(tmp_path / "r.jsonl")),
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert list(home.rglob("*")) == []


def test_loadtest_against_a_server_answering_non_json_is_exit_2(tmp_path, capsys):
    """``loadtest --url`` at something that answers 200 with HTML: one line naming the URL, exit 2."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from hllm.cli import main

    class Html(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's naming
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            body = b"<html>not an hllm server</html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Html)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps(s) + "\n" for s in tiny_slates(2, (2, 4), seed=1)))
    try:
        with pytest.raises(SystemExit) as e:
            main(["loadtest", "--url", f"http://127.0.0.1:{server.server_port}", "-s", str(good),
                  "--requests", "2", "--clients", "1"])
    finally:
        server.shutdown()
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert e.value.code == 2, err
    assert lines[-1].startswith("error:") and "not an hllm ranking response" in lines[-1], err


def test_library_file_errors_left_unmapped_are_exit_2_not_70(monkeypatch, capsys):
    """The exit-code policy's fallback: a library's error about an input file's bytes (here safetensors and
    zipfile, raised where no reader mapped them) is one line and exit 2; any other exception stays 70."""
    import zipfile

    from safetensors import SafetensorError

    from hllm.cli.app import library_file_error, run

    app_mod = sys.modules["hllm.cli.app"]  # the module (hllm.cli.app the attribute is the Typer app)

    assert "not a readable safetensors file" in library_file_error(SafetensorError("header too small"))
    assert "zip" in library_file_error(zipfile.BadZipFile("File is not a zip file"))
    assert library_file_error(ValueError("a bug")) is None

    def boom(*a, **k):
        raise zipfile.BadZipFile("File is not a zip file")

    monkeypatch.setattr(app_mod, "app", boom)
    assert run(["info", "x"]) == 2
    assert capsys.readouterr().err.startswith("error:")

    def bug(*a, **k):
        raise ValueError("a bug")

    monkeypatch.setattr(app_mod, "app", bug)
    assert run(["info", "x"]) == 70
