"""Every repository path the README and docs/ name exists, and every ``tests/…py::test_x`` they cite is a test
in that file (a renamed or moved file leaves no stale pointer for a reader to follow)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: Source, test and script paths (results/ holds command outputs a page may tell the reader to write).
_PATH = re.compile(r"(?<![\w./-])((?:tests|hllm|scripts|deploy|examples|checkpoints|\.ci)/[\w./@+-]*[\w])(::\w+)?")


def _pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_named_paths_and_tests_exist():
    stale = []
    for page in _pages():
        for n, line in enumerate(page.read_text().splitlines(), 1):
            for m in _PATH.finditer(line):
                path, test = m.group(1), m.group(2)
                target = REPO / path
                if not target.exists():
                    stale.append(f"{page.name}:{n}: {path}")
                elif test and target.is_file() and not re.search(rf"def {test[2:]}\(", target.read_text()):
                    stale.append(f"{page.name}:{n}: {path}{test}")
    assert not stale, "paths named in the docs that do not exist:\n" + "\n".join(stale)


def test_the_check_sees_a_stale_path(tmp_path):
    """The pattern finds the kind of pointer this test exists for."""
    found = [m.group(1) + (m.group(2) or "") for m in _PATH.finditer("(`tests/test_fp16.py::test_x`: and hllm/cli/app.py)")]
    assert found == ["tests/test_fp16.py::test_x", "hllm/cli/app.py"]
    assert not (REPO / "tests/test_fp16.py").exists()
