"""No private name crosses a module boundary: nothing does ``from hllm.x import _name`` (a name with a leading
underscore is its module's own; what another module needs is public, documented and tested as such)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: Trees scanned: the package, its tests, scripts and experiments.
TREES = ("hllm", "tests", "scripts", "experiments")


def private_imports(root: Path, trees=TREES) -> list[str]:
    """``"path:line: module._name"`` of every ``from hllm... import _name`` under ``trees`` of ``root``
    (dunder names such as ``__version__`` are public)."""
    found = []
    for tree in trees:
        for path in sorted((root / tree).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                        (node.module == "hllm" or node.module.startswith("hllm.")):
                    for a in node.names:
                        if a.name.startswith("_") and not (a.name.startswith("__") and a.name.endswith("__")):
                            found.append(f"{path.relative_to(root)}:{node.lineno}: {node.module}.{a.name}")
    return found


def test_no_private_name_is_imported_across_modules():
    assert private_imports(REPO) == []


def test_the_scan_sees_a_private_import(tmp_path):
    (tmp_path / "hllm").mkdir()
    (tmp_path / "hllm" / "m.py").write_text("from hllm.files import (\n    atomic_write_json,\n    _staging_prefix,\n)\n"
                                            "from hllm import __version__\n")
    assert private_imports(tmp_path, ("hllm",)) == ["hllm/m.py:1: hllm.files._staging_prefix"]
