"""The ``hllm`` command line (Typer). Each ``*_cmds`` module registers its commands on ``app``.

Without the ``cli`` extra (typer, rich) ``main`` prints ``pip install 'hllm[cli]'`` and exits 2.
"""

from hllm.extras import quiet_telemetry

quiet_telemetry()  # the command's entry: before any command module can import ONNX Runtime, OpenVINO or NNCF

try:
    from hllm.cli import checkpoint_cmds, ranking_cmds, inspect_cmds, serve_cmds, calibrate_cmds, bench_cmds, engine_cmds, train_cmds, debug_cmds, frontier_cmds  # noqa: F401  (register commands)
    from hllm.cli.app import app, main
except ModuleNotFoundError as _missing:
    from hllm.extras import missing_message

    if missing_message(_missing) is None:
        raise
    _message = missing_message(_missing)

    def main(argv: list[str] | None = None) -> None:
        """Console-script entry point without the CLI's libraries: say which extra to install, exit 2."""
        import sys

        print(f"error: {_message}", file=sys.stderr)
        sys.exit(2)

__all__ = ["app", "main"]
