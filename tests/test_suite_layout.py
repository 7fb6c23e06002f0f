"""How the test suite itself is laid out: test modules are grouped by subject and never import one another
(shared helpers live in a ``conftest.py`` or in :mod:`hllm.testing`, helper modules such as
``tests/serve/rerank_clients.py`` are not named ``test_*``), and no test file or test is named after a review
round or a tracker entry instead of its subject."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


def _module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, root: Path) -> set[str]:
    """Dotted names of every module ``path`` imports (relative imports resolved against its package),
    each ``from X import y`` counted as both ``X`` and ``X.y`` (``y`` may be a submodule)."""
    package = _module_name(path, root).rsplit(".", 1)[0] if path.name != "__init__.py" else _module_name(path, root)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)
    return found


def imports_of_test_modules(root: Path) -> dict[str, list[str]]:
    """{test file: the test modules (``test_*``) it imports} for every file under ``root``."""
    bad = {}
    for path in sorted(root.rglob("*.py")):
        hits = sorted(m for m in imported_modules(path, root) if m.rsplit(".", 1)[-1].startswith("test_"))
        if hits:
            bad[path.relative_to(root.parent).as_posix()] = hits
    return bad


def test_no_test_module_imports_another():
    found = imports_of_test_modules(TESTS)
    assert not found, f"move shared helpers to a conftest.py or hllm/testing.py: {found}"


def test_the_import_check_sees_absolute_relative_and_bare_imports(tmp_path):
    """The check finds each way one test module can reach another, and passes conftest and helper imports."""
    pkg = tmp_path / "tests" / "serve"
    pkg.mkdir(parents=True)
    for name in ("__init__.py", "test_a.py", "helpers.py", "conftest.py"):
        (pkg / name).write_text("")
    (tmp_path / "tests" / "__init__.py").write_text("")
    (pkg / "test_b.py").write_text("from tests.serve.test_a import x\nfrom tests.serve.conftest import y\n")
    (pkg / "test_c.py").write_text("from . import test_a\nfrom .helpers import z\n")
    (pkg / "test_d.py").write_text("import test_a\nimport tests.serve.helpers\n")
    (pkg / "test_e.py").write_text("from ..serve.test_a import x\n")
    assert imports_of_test_modules(tmp_path / "tests") == {
        "tests/serve/test_b.py": ["tests.serve.test_a"],
        "tests/serve/test_c.py": ["tests.serve.test_a"],
        "tests/serve/test_d.py": ["test_a"],
        "tests/serve/test_e.py": ["tests.serve.test_a"],
    }


#: A test file or test named after a review round, a tracker entry or a review instead of its subject.
ROUND_NAME = re.compile(r"round_?\d|issue|review|hardening_round|_r\d+_", re.IGNORECASE)


def test_test_files_and_tests_are_named_by_subject():
    named = []
    for path in sorted(TESTS.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if ROUND_NAME.search(path.name):
            named.append(rel)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and ROUND_NAME.search(node.name):
                named.append(f"{rel}::{node.name}")
    assert not named, f"name these by what they test: {named}"
    assert ROUND_NAME.search("test_hardening_round2.py") and ROUND_NAME.search("test_issue_example_is_optimal")
    assert not ROUND_NAME.search("test_round_trip") and not ROUND_NAME.search("test_rounding_is_exact")
