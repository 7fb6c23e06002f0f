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
from pathlib import Path

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
    """The example and the hllm commands run in-process up to ``hllm serve``; from there the block's lines
    (serve in the background, the /readyz wait, the cohere client, ``kill %1``) run as one bash script, as
    written, with only the port changed."""
    monkeypatch.chdir(tmp_path)
    lines = doc_commands()
    assert [shlex.split(c)[1] for c in lines[:3]] == ["examples/bring_your_own.py", "import", "parity"]
    serve = next(i for i, c in enumerate(lines) if c.startswith("hllm serve"))
    for line in lines[:serve]:
        argv = shlex.split(line)
        if argv[:2] == ["python", "examples/bring_your_own.py"]:
            make_team(argv[2:])
            continue
        assert argv[0] == "hllm", line
        code, out, err = run(argv[1:], capsys)
        assert code == 0, f"{line}\n{out}\n{err}"
        if argv[1] == "parity":
            assert "100% agree" in out + err
    port = str(_free_port())
    script = "set -e\n" + "\n".join(c.replace("8000", port) for c in lines[serve:]) + "\nwait\n"
    assert "kill %1" in script and "readyz" in script
    env = {**os.environ, "PYTHONPATH": str(REPO), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    r = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    printed = [ln for ln in r.stdout.splitlines() if ln.startswith("[")]
    assert printed and sorted(eval(printed[-1])) == [0, 1, 2]  # a permutation of the three documents
    assert "stopped (SIGTERM)" in r.stdout + r.stderr  # kill %1 drained the server
    assert (tmp_path / "work" / "byo" / "export" / "model.onnx").is_file()
