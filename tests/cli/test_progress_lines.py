"""The calibrate progress: a rich bar on a terminal, periodic lines in a log (stderr not a terminal)."""

from __future__ import annotations

import io

from rich.console import Console
from rich.progress import Progress

from hllm.cli.calibrate_cmds import progress_lines


def _bar(terminal: bool):
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=terminal, width=120)
    return progress_lines(Progress(console=con, disable=not terminal), every_s=0.0), buf


def test_log_gets_one_line_per_update_with_count_and_eta():
    bar, buf = _bar(False)
    with bar:
        advance = bar.bar_for("gate openvino-bf16", 20)
        for _ in range(2):
            advance(10)
    lines = buf.getvalue().splitlines()
    assert [x.split(" (")[0] for x in lines] == ["  gate openvino-bf16: 10/20", "  gate openvino-bf16: 20/20"]
    assert "ETA 0 s" in lines[-1]


def test_log_lines_are_spaced_by_the_period_and_the_last_one_always_comes():
    buf = io.StringIO()
    bar = progress_lines(Progress(console=Console(file=buf, force_terminal=False), disable=True), every_s=3600.0)
    with bar:
        advance = bar.bar_for("FP32 reference", 5)
        for _ in range(5):
            advance(1)
    lines = buf.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("  FP32 reference: 5/5 (")


def test_terminal_gets_the_bar_not_lines():
    bar, buf = _bar(True)
    with bar:
        advance = bar.bar_for("gate", 4)
        advance(4)
    assert "gate" in buf.getvalue() and "4/4 (" not in buf.getvalue()
