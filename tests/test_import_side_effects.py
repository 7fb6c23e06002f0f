"""Importing ``hllm`` changes nothing outside it: no environment variable, no ``sys.modules`` entry but hllm's
own (the telemetry switches belong to the command's entry, :func:`hllm.extras.quiet_telemetry`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_PROBE = """
import json, os, sys
env, mods = dict(os.environ), set(sys.modules)
import hllm
after_env, after = dict(os.environ), set(sys.modules)
from hllm import __version__  # read on first use (it imports importlib.metadata then)
print(json.dumps({"env": sorted(k for k in set(env) | set(after_env) if env.get(k) != after_env.get(k)),
                  "added": sorted(m for m in after - mods if m != "hllm" and not m.startswith("hllm.")),
                  "removed": sorted(mods - after), "version": __version__}))
"""


def _probe(code: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("ORT_DISABLE_TELEMETRY", None)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_importing_hllm_changes_no_environment_variable_and_no_module_entry():
    got = _probe(_PROBE)
    assert got["env"] == [] and got["added"] == [] and got["removed"] == []
    assert got["version"]


def test_the_probe_sees_a_side_effect():
    """The same comparison after the command's entry: the telemetry switches show up."""
    got = _probe(_PROBE.replace("import hllm\n", "import hllm\nfrom hllm.extras import quiet_telemetry\nquiet_telemetry()\n"))
    assert "ORT_DISABLE_TELEMETRY" in got["env"]
