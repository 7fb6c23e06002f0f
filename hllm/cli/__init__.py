"""The ``hllm`` command line (Typer). Each ``*_cmds`` module registers its commands on ``app``."""

from hllm.cli import checkpoint_cmds, ranking_cmds, serve_cmds, calibrate_cmds, bench_cmds, engine_cmds, train_cmds  # noqa: F401  (register commands)
from hllm.cli.app import app, main

__all__ = ["app", "main"]
