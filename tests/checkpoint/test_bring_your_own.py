"""docs/bring-your-own.md runs as written: its one bash block, line by line, in a fresh directory — the
example's artefacts, import, parity against the team's own scores and rankings, merge, export, and the
real cohere client through `hllm serve` (a subprocess on a free loopback port)."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from examples.bring_your_own import main as make_team
from tests.cli.conftest import run

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "bring-your-own.md"


def doc_commands() -> list[str]:
    """The lines of the page's bash block, comments cut."""
    block = re.search(r"```bash\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert block, "docs/bring-your-own.md lost its bash block"
    return [re.sub(r"\s+#.*$", "", line).strip() for line in block.group(1).splitlines() if line.strip()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_walk_runs_as_written(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lines = doc_commands()
    assert [shlex.split(c)[1] for c in lines[:3]] == \
        ["examples/bring_your_own.py", "import", "parity"]
    port = str(_free_port())
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    server = None
    try:
        for line in lines:
            argv = shlex.split(line.replace("8000", port).rstrip("&").strip())
            if argv[:2] == ["python", "examples/bring_your_own.py"]:
                make_team(argv[2:])
            elif argv[:2] == ["hllm", "serve"]:
                server = subprocess.Popen([sys.executable, "-m", "hllm", *argv[1:]], env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True)
                deadline = time.monotonic() + 120
                while True:
                    assert server.poll() is None, server.stdout.read()
                    assert time.monotonic() < deadline, "the server did not become ready"
                    try:
                        if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    time.sleep(0.5)
            elif argv[0] == "hllm":
                code, out, err = run(argv[1:], capsys)
                assert code == 0, f"{line}\n{out}\n{err}"
                if argv[1] == "parity":
                    assert "100% agree" in out + err
            else:  # the cohere client, as a user runs it
                assert argv[0] == "python"
                r = subprocess.run([sys.executable, *argv[1:]], env=env, capture_output=True, text=True, timeout=120)
                assert r.returncode == 0, r.stderr
                assert sorted(eval(r.stdout)) == [0, 1, 2]  # a permutation of the three documents
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=60)
    assert server is not None and (tmp_path / "work" / "byo" / "export" / "model.onnx").is_file()
