"""Helpers shared by the serving tests: the KServe v2 stub server (``kserve_stub.py``) in a subprocess,
the rankings hllm's own Ranker gives, and the comparison of two lists of ranking records."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hllm.runtime import Ranker

HERE = Path(__file__).resolve().parent


def pb2_path() -> Path:
    """Triton's ``model_config_pb2.py`` inside the installed tritonclient (skips the test without it)."""
    tc = pytest.importorskip("tritonclient", reason="tritonclient not installed")
    return Path(tc.__file__).parent / "grpc" / "model_config_pb2.py"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a server started in a subprocess)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ranker_rankings(export_dir, slates) -> list[dict]:
    """The ranking records (:meth:`hllm.runtime.ranker.Ranking.to_dict`) hllm's Ranker gives for ``slates``."""
    with Ranker.from_path(export_dir) as ranker:
        return [r.to_dict() for r in ranker.rank(slates)]


def assert_same_rankings(got: list[dict], want: list[dict]) -> None:
    """Same slate ids, orders, rankings and truncation flags; scores within 1e-4."""
    assert [g["slate_id"] for g in got] == [w["slate_id"] for w in want]
    assert [g["order"] for g in got] == [w["order"] for w in want]
    assert [g["ranking"] for g in got] == [w["ranking"] for w in want]
    assert [g["truncated"] for g in got] == [w["truncated"] for w in want]
    np.testing.assert_allclose([s for g in got for s in g["scores"]], [s for w in want for s in w["scores"]], atol=1e-4)


class KServeStub:
    """The KServe v2 stub server (tests/serve/kserve_stub.py) in a subprocess on 127.0.0.1."""

    def __init__(self, models: Path, python_args: list[str], env: dict | None = None):
        cmd = [sys.executable, *python_args, str(HERE / "kserve_stub.py"), "--repo", str(models), "--pb2", str(pb2_path())]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.info = {}
        for line in self.proc.stdout:  # blocks until the stub prints PORT (or dies)
            key, _, value = line.strip().partition(" ")
            self.info[key] = value if key == "PORT" else json.loads(value)
            if key == "PORT":
                break
        if "PORT" not in self.info:
            self.proc.wait(10)
            raise AssertionError(f"stub server failed: {self.proc.stderr.read()[-3000:]}")
        self.url = f"127.0.0.1:{self.info['PORT']}"

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self.proc.stdout.close()
        self.proc.stderr.close()
