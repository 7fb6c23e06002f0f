"""Helpers shared by the CLI tests: run ``hllm`` in-process, walk the Typer app's commands and options, and
the deprecated option spellings the app keeps as hidden aliases (docs/cli-conventions.md)."""

from __future__ import annotations

import pytest
from typer.main import get_command

from hllm.cli import app, main

#: Deprecated spellings kept as hidden aliases: (command path, option) → the option that replaced it.
ALIASES = {
    ("parity", "--report"): "--out",
    ("merge", "--check-slates"): "--limit",
    ("merge", "--tol"): "--atol",
    ("calibrate", "--eval-slates"): "--slates",
    ("calibrate", "--eval-limit"): "--limit",
    ("calibrate", "--bench-rounds"): "--bench-runs",
    ("calibrate", "--out"): "OUT_DIR",
    ("calibrate", "--candidate"): "--recipe",
    ("serve", "--max-batch"): "--batch-size",
    ("loadtest", "--max-batch"): "--batch-size",
    ("loadtest", "--candidates"): "--n-items",
    ("triton-repo", "--max-batch-size"): "--batch-size",
    ("triton-repo", "--kind"): "--instance-kind",
    ("build", "--max-batch"): "--batch-size",
    ("train", "--target"): "--objective",
    ("train", "--max-slates"): "--limit",
    ("teacher", "--summary"): "--report",
    ("bench lapjv", "--model-slates"): "--limit",
    ("bench versus-ar", "--count"): "--limit",
}


def run(argv, capsys):
    """Run ``hllm argv`` in this process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    cap = capsys.readouterr()
    return e.value.code, cap.out, cap.err


def commands():
    """(path, click command) of every command, bench subcommands included."""
    root = get_command(app)
    for name, cmd in root.commands.items():
        if hasattr(cmd, "commands"):
            for sub, c in cmd.commands.items():
                yield f"{name} {sub}", c
        else:
            yield name, cmd


def options(cmd):
    """The click options (not arguments) of ``cmd``."""
    return [p for p in cmd.params if getattr(p, "opts", None) and p.param_type_name == "option"]
