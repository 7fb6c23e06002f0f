"""One job per module: no module of the package is over :data:`MAX_MODULE_LINES` lines, so a module can be
read in one sitting; a module that grows past it is split along its jobs, not trimmed."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hllm"

#: Most lines a module of ``hllm/`` may have (physical lines, docstrings and blank lines included).
MAX_MODULE_LINES = 450

#: Modules allowed to be longer, as paths relative to ``hllm/``, each with the reason. Only generated files
#: belong here (code written by a tool, not by hand); there are none today, so keep it empty.
GENERATED: dict[str, str] = {}


def module_lines(root: Path) -> dict[str, int]:
    """``{path relative to root: line count}`` of every ``.py`` file under ``root``."""
    return {p.relative_to(root).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
            for p in sorted(root.rglob("*.py")) if "__pycache__" not in p.parts}


def test_no_module_over_the_limit():
    sizes = module_lines(PACKAGE)
    assert len(sizes) > 50  # the walk found the package's modules
    over = {p: n for p, n in sizes.items() if n > MAX_MODULE_LINES and p not in GENERATED}
    assert not over, f"modules over {MAX_MODULE_LINES} lines (split them by job): {over}"


def test_generated_exceptions_exist_and_are_needed():
    sizes = module_lines(PACKAGE)
    for path, reason in GENERATED.items():
        assert reason.strip(), f"{path}: say why it is exempt"
        assert sizes.get(path, 0) > MAX_MODULE_LINES, f"{path} is no longer over the limit (or gone): drop it"


def test_the_count_sees_a_long_module(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "short.py").write_text("x = 1\n" * MAX_MODULE_LINES, encoding="utf-8")
    (tmp_path / "pkg" / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1), encoding="utf-8")
    (tmp_path / "pkg" / "__pycache__").mkdir()
    (tmp_path / "pkg" / "__pycache__" / "cached.py").write_text("x = 1\n" * 999, encoding="utf-8")
    sizes = module_lines(tmp_path)
    assert sizes == {"pkg/long.py": MAX_MODULE_LINES + 1, "pkg/short.py": MAX_MODULE_LINES}
    assert [p for p, n in sizes.items() if n > MAX_MODULE_LINES] == ["pkg/long.py"]
