"""No stale text: code, docs, the README and the tests describe what the code does, by subject.

The search is ``grep -rniE "issue|round [0-9]|\\.\\./shared" hllm docs README.md tests Makefile`` (with a
word boundary before ``round``, so "around 7×" is not a hit) plus absolute paths of the development
machines (``/work/``, ``/tmp/``, ``/home/``, ``/root/``, ``/Users/`` at the start of a path). Such text
points a reader at a tracker entry, a review round or a directory they do not have. The few legitimate
uses are listed in :data:`ALLOWED`, each with its reason; anything else fails with ``file:line``.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: A tracker reference ("the issue's …"), a review round, the directory next to the clone.
STALE = re.compile(r"issue|\bround [0-9]|\.\./shared", re.IGNORECASE)
#: An absolute path of a development machine (not ``$PWD/work/…`` nor ``../../work/…``, which are relative).
ABSOLUTE = re.compile(r"(?<![\w.$~/-])/(?:work|tmp|home|root|Users)/")

#: (file, text on the line) → why that use is legitimate. Keep it short.
ALLOWED: dict[tuple[str, str], str] = {
    ("hllm/exporter/patches.py", "github.com/pytorch/pytorch/issues/"):
        "links the upstream PyTorch bug that the export-time patch works around",
    ("Makefile", "EVAL    ?= ../shared/"):
        "default location of the full eval split on the development machines; overridable, and `make demo` "
        "reads only the packaged sample (checked below)",
    ("Makefile", "TRAIN   ?= ../shared/"):
        "default location of the full train split (`make train-beauty`); overridable, not read by `make demo`",
    ("tests/test_layout.py", "never a tracker issue by its number"):
        "the docstring of the check that forbids tracker numbers",
    ("tests/test_layout.py", "issues? ?#?"):
        "the pattern of the check that forbids tracker numbers",
    ("tests/test_suite_layout.py", "ROUND_NAME = re.compile("):
        "the pattern of the check that forbids test names after rounds or tracker entries",
    ("tests/test_suite_layout.py", "assert ROUND_NAME.search("):
        "the names that check must catch",
    ("tests/serve/test_production.py", "authority.issue_cert("):
        "trustme's API: a CA issues the test server's certificate",
    ("tests/serve/test_production.py", "trustme.CA().issue_cert("):
        "trustme's API: a certificate from a CA the client does not trust",
}
#: This file states the patterns and the allow-list itself.
SELF = Path(__file__).resolve().relative_to(REPO).as_posix()


def _files() -> list[Path]:
    files = [*(REPO / "hllm").rglob("*.py"), *(REPO / "docs").rglob("*.md"), REPO / "README.md",
             *(REPO / "tests").rglob("*.py"), REPO / "Makefile"]
    return sorted(p for p in files if p.relative_to(REPO).as_posix() != SELF)


def stale_lines(files: list[Path], root: Path, allowed: dict[tuple[str, str], str]) -> tuple[list[str], set]:
    """(``file:line: text`` of every hit not allowed, the allow-list keys that matched something)."""
    hits, used = [], set()
    for path in files:
        rel = path.relative_to(root).as_posix()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not (STALE.search(line) or ABSOLUTE.search(line)):
                continue
            keys = [k for k in allowed if k[0] == rel and k[1] in line]
            if keys:
                used.update(keys)
            else:
                hits.append(f"{rel}:{n}: {line.strip()}")
    return hits, used


def test_no_stale_text_outside_the_allowed_uses():
    hits, used = stale_lines(_files(), REPO, ALLOWED)
    assert not hits, "stale text (describe the subject; cite a source, not a tracker):\n" + "\n".join(hits)
    assert used == set(ALLOWED), f"allow-list entries that match nothing any more (remove them): {set(ALLOWED) - used}"


def test_the_demo_reads_no_data_outside_the_repository():
    """The ``../shared`` defaults stay out of ``make demo``: its recipe names neither EVAL nor TRAIN."""
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    demo = re.search(r"^demo:.*?(?=^\S|\Z)", text, re.MULTILINE | re.DOTALL)
    assert demo and "$(SLATES)" in demo.group(0)
    assert "$(EVAL)" not in demo.group(0) and "$(TRAIN)" not in demo.group(0)
    assert re.search(r"^SLATES\s*\?=\s*examples/", text, re.MULTILINE)


def test_the_search_finds_what_it_is_for(tmp_path):
    """Each kind of stale text is found; relative paths, "around 7" and allowed lines are not."""
    page = tmp_path / "p.md"
    page.write_text("the issue's bound\nhardening Round 2 below\nsee ../shared/data\nopen /work/main/x\n"
                    "cd /tmp/run && ls\n"
                    "around 7x faster\n$PWD/work/models\n../../work/smollm2\nfixed upstream (issues/1)\n")
    hits, used = stale_lines([page], tmp_path, {("p.md", "issues/1"): "upstream link"})
    assert [h.split(":")[1] for h in hits] == ["1", "2", "3", "4", "5"]
    assert used == {("p.md", "issues/1")}


def _module_refs(root: Path) -> list[tuple[str, str]]:
    """(file, dotted module) of every ``:mod:`` reference in ``root``'s docstrings, relative ones resolved
    against the file's package."""
    refs = []
    for path in sorted(root.rglob("*.py")):
        package = ".".join(path.relative_to(root.parent).parent.parts)
        for name in re.findall(r":mod:`~?([\w.]+)`", path.read_text(encoding="utf-8")):
            refs.append((path.relative_to(root.parent).as_posix(), package + name if name.startswith(".") else name))
    return refs


def test_docstrings_name_modules_that_exist():
    """A package docstring that lists its modules (``:mod:`.stats```) is updated when one moves."""
    import importlib.util

    refs = _module_refs(REPO / "hllm")
    assert len(refs) > 20
    def exists(mod: str) -> bool:
        try:
            return importlib.util.find_spec(mod) is not None
        except ModuleNotFoundError:  # a parent package that does not exist
            return False

    missing = [f"{path}: {mod}" for path, mod in refs if not exists(mod)]
    assert not missing, missing
