"""docs/hardening.md is the bad-input corpus: its numbered classes are counted here, the total it states is
checked (at least 200), and every class row names an expected exit code or HTTP status and tests that exist."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "hardening.md"

#: The first cell of a class row: a number, a prefixed number (O1, C12, L3) or a range of them (O5–O34).
_ID = re.compile(r"^([A-Z]?)(\d+)(?:–([A-Z]?)(\d+))?$")
#: What an expected outcome must name: an exit code of the CLI's policy, an HTTP status, or a closed connection.
_OUTCOME = re.compile(r"(?<![\d.])(0|1|2|70|130|143|[1-5]\d\d)(?![\d.])|\b[1-5]xx\b|closed")
_EXIT_HEADERS = ("Exit / status", "Expected exit")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split(" | ")]


def class_rows(text: str) -> list[tuple[str, int, str, str]]:
    """(id, how many classes it counts, expected outcome, test cell) of every class row in ``text``."""
    rows, exit_col, test_col = [], None, None
    for line in text.splitlines():
        if not line.startswith("| "):
            exit_col = None if not line.startswith("|") else exit_col
            continue
        cells = _cells(line)
        if cells[0] == "#":
            exit_col = next((i for i, c in enumerate(cells) if c in _EXIT_HEADERS), None)
            test_col = cells.index("Test") if "Test" in cells else None
            continue
        m = _ID.match(cells[0])
        if exit_col is None or not m:
            continue
        n = 1 if m.group(4) is None else int(m.group(4)) - int(m.group(2)) + 1
        rows.append((cells[0], n, cells[exit_col], cells[test_col] if test_col is not None else ""))
    return rows


def _defined_tests() -> set[str]:
    names: set[str] = set()
    for f in (REPO / "tests").rglob("*.py"):
        names |= set(re.findall(r"^\s*def (test_\w+)\(", f.read_text(), re.M))
    return names


def test_the_corpus_lists_at_least_200_classes_and_states_its_count():
    text = DOC.read_text()
    rows = class_rows(text)
    total = sum(n for _, n, _, _ in rows)
    stated = re.search(r"\*\*The corpus: (\d+) numbered classes", text)
    assert stated, "docs/hardening.md no longer states its count"
    assert int(stated.group(1)) == total, f"the doc says {stated.group(1)} classes, its tables hold {total}"
    assert total >= 200
    ids = [i for i, _, _, _ in rows]
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})


def test_every_class_names_an_exit_code_or_status_and_existing_tests():
    rows = class_rows(DOC.read_text())
    no_outcome = [i for i, _, outcome, _ in rows if not _OUTCOME.search(outcome)]
    assert not no_outcome, f"rows without an exit code or status: {no_outcome}"
    defined = _defined_tests()
    missing = sorted({(i, t) for i, _, _, cell in rows for t in re.findall(r"`(test_\w+)", cell) if t not in defined})
    assert not missing, f"rows naming tests that do not exist: {missing}"
    no_test = [i for i, _, _, cell in rows if not re.search(r"test_|…\[|same|\.ci/", cell)]
    assert not no_test, f"rows naming no test: {no_test}"


def test_the_counter_reads_ranges_headers_and_outcomes():
    sample = "\n".join([
        "| # | Class | Policy | Exit / status | Test |", "|---|---|---|---|---|",
        "| | **group** | | | |", "| 7 | a | b | 2 | `test_a` |", "| O5–O9 | c | d | 400 | `…[x]` |",
        "", "| code | when |", "|---|---|", "| 2 | bad input |"])
    assert class_rows(sample) == [("7", 1, "2", "`test_a`"), ("O5–O9", 5, "400", "`…[x]`")]
    assert _OUTCOME.search("2; 0 (integer)") and _OUTCOME.search("413 / 200") and not _OUTCOME.search("refused")
    assert not _OUTCOME.search("peak RSS < 1.5 GB")
