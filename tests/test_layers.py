"""The package's layers (``[tool.importlinter]`` in pyproject.toml) hold, and the check really catches a break.

import-linter builds the import graph with grimp (function-level imports included) and checks a ``layers``
contract (no import from a lower layer to a higher one, hence no cycle between layers) and a ``forbidden``
contract (hllm.runtime and hllm.formats reach neither torch, transformers, onnx nor fastapi, directly or
through other modules). Source: import-linter docs, "Contract types" (layers, forbidden).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter", reason="import-linter is not installed (pip install -e '.[dev]')")

REPO = Path(__file__).resolve().parents[1]

#: Run import-linter on the config in the working directory, without its cache; exit status = broken or not.
LINT = ("import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True))")


def lint(cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run([sys.executable, "-c", LINT], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_layer_contracts_hold_on_the_tree():
    r = lint(REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Contracts: 2 kept, 0 broken." in r.stdout, r.stdout


def test_every_package_and_module_of_hllm_sits_in_a_layer():
    """A new top-level package or module must be placed in the layers, or nothing would check its imports."""
    import tomllib

    contract = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]["contracts"][0]
    assert contract["type"] == "layers"
    declared = {name.strip() for layer in contract["layers"] for name in layer.replace(":", "|").split("|")}
    pkg = REPO / "hllm"
    present = {f"hllm.{p.stem}" for p in pkg.glob("*.py") if p.stem not in ("__init__", "__main__")}
    present |= {f"hllm.{p.name}" for p in pkg.iterdir() if (p / "__init__.py").is_file()}
    assert present - declared == set(), "place these in [tool.importlinter] layers"
    assert declared - present == set(), "layers name modules that do not exist"


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory) -> Path:
    """A copy of the package and pyproject.toml, to break on purpose (the checkout is never touched)."""
    root = tmp_path_factory.mktemp("layers")
    shutil.copytree(REPO / "hllm", root / "src" / "hllm", ignore=shutil.ignore_patterns("__pycache__", "*.gz"))
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


@pytest.mark.parametrize("module, added, broken", [
    # a file format importing the CLI: an upward import across the layers
    ("formats/prompt.py", "import hllm.cli  # deliberate upward import\n",
     "hllm.formats is not allowed to import hllm.cli"),
    # the lean runtime importing onnx inside a function: function-level imports count
    ("runtime/decode.py", "\n\ndef _deliberate():\n    import onnx\n\n    return onnx\n",
     "hllm.runtime is not allowed to import onnx"),
    # a torch-free engine reaching torch through another module counts too
    ("engines/ort.py", "\n\ndef _deliberate():\n    from hllm.model import load_model\n\n    return load_model\n",
     "hllm.runtime is not allowed to import torch"),
])
def test_a_deliberate_bad_import_breaks_the_contracts(tree_copy, module, added, broken):
    path = tree_copy / "src" / "hllm" / module
    original = path.read_text(encoding="utf-8")
    try:
        path.write_text(original + added, encoding="utf-8")
        r = lint(tree_copy, pythonpath=tree_copy / "src")
    finally:
        path.write_text(original, encoding="utf-8")
    assert r.returncode == 1, r.stdout + r.stderr
    assert broken in r.stdout, r.stdout
    assert f"hllm.{module[:-3].replace('/', '.')} ->" in r.stdout  # the offending module is named
    # and the untouched copy passes: the copy, not a stale graph, is what was checked
    assert lint(tree_copy, pythonpath=tree_copy / "src").returncode == 0
