"""Libraries that keep quiet: OpenVINO and NNCF send no telemetry (no file under ``$HOME``, no socket) and
their progress output never lands on a ``--json`` stdout (docs/hardening.md, "Libraries and protocol input")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hllm.testing import tiny_slates

pytest.importorskip("openvino")
pytest.importorskip("nncf")

REPO = Path(__file__).resolve().parents[2]

# A sitecustomize for the subprocess: an audit hook (PEP 578) that records every socket connect and name lookup
# in $SOCKET_LOG and refuses it, so one attempt anywhere in the process (threads included) is seen.
_GUARD = '''
import os, sys
_log = os.environ["SOCKET_LOG"]
def _guard(event, args):
    if event in ("socket.connect", "socket.getaddrinfo", "socket.sendto"):
        with open(_log, "a") as f:
            f.write(f"{event} {args[1:2]!r}\\n")
        raise OSError(f"socket guard: {event} refused")
sys.addaudithook(_guard)
'''


def _run_guarded(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """Run ``hllm ARGS`` with HOME a fresh empty directory and the socket guard; (result, home, socket log)."""
    home, guard = tmp_path / "home", tmp_path / "guard"
    home.mkdir()
    guard.mkdir()
    (guard / "sitecustomize.py").write_text(_GUARD)
    log = tmp_path / "sockets.log"
    drop = ("ORT_DISABLE_TELEMETRY", "XDG_CACHE_HOME", "CI", "NNCF_CI", "NNCF_DEV", "TF_BUILD", "JENKINS_URL",
            "PYTEST_CURRENT_TEST")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update({"HOME": str(home), "PYTHONPATH": os.pathsep.join([str(guard), str(REPO)]), "SOCKET_LOG": str(log)})
    r = subprocess.run([sys.executable, "-m", "hllm", *args], env=env, capture_output=True, text=True, timeout=600)
    return r, home, log


def _slates(path: Path, n: int, seed: int) -> Path:
    path.write_text("".join(json.dumps(s) + "\n" for s in tiny_slates(n, (4, 8), seed=seed)))
    return path


def test_socket_guard_sees_a_connection(tmp_path):
    """The guard itself works: a plain connect in the guarded interpreter is logged and refused."""
    home, guard = tmp_path / "home", tmp_path / "guard"
    home.mkdir()
    guard.mkdir()
    (guard / "sitecustomize.py").write_text(_GUARD)
    log = tmp_path / "sockets.log"
    env = {**os.environ, "PYTHONPATH": str(guard), "SOCKET_LOG": str(log)}
    code = "import socket\ntry:\n    socket.create_connection(('127.0.0.1', 9), timeout=1)\nexcept OSError as e:\n    print(e)"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert "socket guard" in r.stdout, r.stdout + r.stderr
    assert log.read_text().count("socket.") >= 1


def test_openvino_rank_writes_nothing_under_home_and_opens_no_socket(tmp_path, standard_export_dir):
    """``rank --engine openvino``: `import openvino` would otherwise write ~/intel/{openvino_ga_cid,stats}
    and send a Google Analytics event (openvino.tools.ovc's telemetry)."""
    out = tmp_path / "r.jsonl"
    r, home, log = _run_guarded(tmp_path, "rank", str(standard_export_dir), "--engine", "openvino",
                                "-s", str(_slates(tmp_path / "s.jsonl", 2, 1)), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert len(out.read_text().splitlines()) == 2
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == []
    assert not log.exists(), log.read_text()


def test_int8_precision_debug_is_quiet_and_its_json_stdout_parses(tmp_path, standard_export_dir):
    """``debug precision --precision int8 --json``: NNCF quantizes (its progress bars and log go to stderr, so
    stdout is one JSON document), nothing is written under $HOME and no socket is opened."""
    slates = _slates(tmp_path / "s.jsonl", 6, 2)
    r, home, log = _run_guarded(tmp_path, "debug", "precision", str(standard_export_dir), "--precision", "int8",
                                "-o", str(tmp_path / "isl.json"), "-s", str(slates), "--limit", "2",
                                "--layers", "0", "--parts", "mlp", "--calib-slates", str(slates),
                                "--calib-count", "2", "--max-islands", "1", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)  # the whole of stdout, nothing before or after
    assert doc["target"] == "int8" and "baseline" in doc
    assert "Statistics collection" in r.stderr  # NNCF's progress went to stderr
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == []
    assert not log.exists(), log.read_text()


def test_nncf_output_to_stderr_restores_the_streams(capsys):
    """The redirection lasts for the block only: NNCF's log handler and sys.stdout are restored after it."""
    import logging

    from hllm.calibration.recipes.openvino_int8 import nncf_output_to_stderr

    before = sys.stdout
    with nncf_output_to_stderr():
        logging.getLogger("nncf").warning("inside the block")
        print("printed inside")
    assert sys.stdout is before
    got = capsys.readouterr()
    assert "inside the block" in got.err and "printed inside" in got.err
    assert "inside" not in got.out
