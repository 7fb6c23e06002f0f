"""Layout rules of the package that code review keeps forgetting: small functions, the design card's parts as
packages (no package named ``build``, which tooling treats as generated output), and docs and code that cite
sources rather than the project's tracker."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hllm"
REPO = PACKAGE.parent

#: Most lines a function body may span: from its first statement after the docstring to its last line
#: (the signature, decorators and docstring do not count, so a Typer command's option declarations do not).
MAX_BODY_LINES = 80

#: "path.py:function" names allowed to be longer, each with the reason. Empty: keep it so.
ALLOWED: dict[str, str] = {}


def body_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines spanned by ``fn``'s body after its docstring (0 for a body that is only a docstring)."""
    body = fn.body
    first = body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        body = body[1:]
    if not body:
        return 0
    return body[-1].end_lineno - body[0].lineno + 1


def long_functions(root: Path, limit: int) -> dict[str, int]:
    """``{"relative/path.py:name@line": body lines}`` of every function (nested ones too) over ``limit``."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and body_lines(node) > limit:
                found[f"{path.relative_to(root.parent).as_posix()}:{node.name}@{node.lineno}"] = body_lines(node)
    return found


def test_body_lines_counts_from_the_first_statement_after_the_docstring():
    src = 'def f(\n    a,\n    b,\n):\n    """Doc\n    string."""\n    x = 1\n\n    return x\n\n\ndef g():\n    """Only a doc."""\n'
    f, g = ast.parse(src).body
    assert body_lines(f) == 3
    assert body_lines(g) == 0
    assert body_lines(ast.parse("def h(): return 1").body[0]) == 1


def test_no_function_body_over_80_lines(tmp_path):
    too_long = long_functions(PACKAGE, MAX_BODY_LINES)
    unexplained = {k: n for k, n in too_long.items() if k.rsplit("@", 1)[0] not in ALLOWED}
    assert not unexplained, f"functions over {MAX_BODY_LINES} body lines (split them): {unexplained}"
    # the check itself finds a long function
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("def big():\n" + "    x = 1\n" * (MAX_BODY_LINES + 1))
    assert long_functions(tmp_path / "pkg", MAX_BODY_LINES) == {"pkg/m.py:big@1": MAX_BODY_LINES + 1}


def test_the_design_cards_parts_are_packages_and_none_is_named_build():
    for part in ("exporter", "calibration", "checkpoint", "engines", "engines/tensorrt", "formats", "runtime", "serve", "verify"):
        assert (PACKAGE / part / "__init__.py").is_file(), part
    assert not [p for p in PACKAGE.rglob("build") if p.is_dir()]


def test_code_and_docs_cite_sources_not_tracker_numbers():
    """Docstrings and docs cite sources (papers, library docs), never a tracker issue by its number."""
    pattern = re.compile(r"\bissues? ?#?\d", re.IGNORECASE)
    paths = [*PACKAGE.rglob("*.py"), *(REPO / "docs").rglob("*.md"), REPO / "README.md", *(REPO / "tests").rglob("*.py")]
    found = [f"{p.relative_to(REPO)}:{i}" for p in paths
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert not found, found


def _hllm_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m.startswith("hllm.")}


def test_pipeline_parts_do_not_import_the_benchmarks():
    """Benchmarks use the pipeline, never the other way round (machine facts live in hllm.measure, timing
    statistics in hllm.measure)."""
    for part in ("exporter", "calibration", "checkpoint", "engines", "formats", "runtime", "serve", "verify"):
        for path in (PACKAGE / part).rglob("*.py"):
            bad = {m for m in _hllm_imports(path) if m == "hllm.bench" or m.startswith("hllm.bench.")}
            assert not bad, f"{path.relative_to(REPO)} imports {sorted(bad)}"
