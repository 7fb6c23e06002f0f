"""SIGINT / SIGTERM at any moment of `hllm`'s start-up: the policy's exit code (130 / 143) and one `error:` line,
never a traceback, a death by the signal or exit 70. The signal is sent by the process to itself from an import
hook, at the moment a given module starts importing (no timing)."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

KICK = """
import os, signal, sys
SIG, AT = getattr(signal, sys.argv[1]), sys.argv[2]

class Kick:  # the signal arrives while module AT is being imported
    def find_spec(self, name, path=None, target=None):
        if name == AT and not getattr(self, "sent", False):
            self.sent = True
            os.kill(os.getpid(), SIG)
        return None

sys.meta_path.insert(0, Kick())
sys.argv = ["hllm", *sys.argv[3:]]
import runpy
runpy.run_module("hllm", run_name="__main__")
"""


@pytest.mark.parametrize("sig, code", [("SIGINT", 130), ("SIGTERM", 143)])
@pytest.mark.parametrize("at, args", [
    ("typer", ["--version"]),  # while the CLI's own modules are imported, before its handlers
    ("onnxruntime", ["rank", "{export}", "--limit", "1", "-o", "{tmp}/out.jsonl"]),  # while a command imports its engine
    ("onnxruntime", ["serve", "{export}", "--port", "{port}", "--log-level", "warning"]),  # the server is up, its engine still loading
])
def test_a_signal_while_starting_exits_with_the_policys_code(export_dir, tmp_path, sig, code, at, args):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [a.format(export=export_dir, tmp=tmp_path, port=port) for a in args]
    r = subprocess.run([sys.executable, "-c", KICK, sig, at, *argv], capture_output=True, text=True, timeout=300)
    assert r.returncode == code, (r.returncode, r.stderr[-2000:])
    lines = [line for line in r.stderr.strip().splitlines() if not line.startswith("serving ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr[-2000:]  # serve too (SIGTERM: was no prefix)
    assert ("interrupted (SIGINT)" if sig == "SIGINT" else "terminated (SIGTERM)") in lines[0]
    assert "Traceback" not in r.stderr


KICK_IN_EXEC = KICK.replace("            os.kill(os.getpid(), SIG)",
                            "            exec('import os; os.kill(os.getpid(), SIG)', {'SIG': SIG})")


def test_sigint_inside_a_string_exec_under_python_m_exits_130(export_dir, tmp_path):
    """CPython marks a KeyboardInterrupt that leaves a string ``exec`` (a dataclass being built during an import)
    as unhandled, and under ``python -m`` killed the process with SIGINT (exit -2) after the CLI had printed its
    line and chosen 130; the entry point clears the mark."""
    (tmp_path / "kick_in_exec.py").write_text(KICK_IN_EXEC)
    import os
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), root])}
    argv = ["SIGINT", "onnxruntime", "rank", str(export_dir), "--limit", "1", "-o", str(tmp_path / "out.jsonl")]
    r = subprocess.run([sys.executable, "-m", "kick_in_exec", *argv], capture_output=True, text=True, timeout=300,
                       env=env, cwd=tmp_path)
    assert r.returncode == 130, (r.returncode, r.stderr[-2000:])
    assert "interrupted (SIGINT)" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out.jsonl").exists()
