"""The entry point of ``python -m hllm`` and of the ``hllm`` console script (:func:`main`).

Signals are answered by the exit-code policy (:mod:`hllm.cli.app`) from the first moment: until
:func:`hllm.cli.app.run` installs its own handlers, the CLI's modules are still being imported and
nothing has been done, so SIGINT / SIGTERM end the process at once with one ``error:`` line and exit
130 / 143 (Python's defaults would print a ``KeyboardInterrupt`` traceback or die of the signal).

Under ``python -m hllm`` CPython (3.11–3.13, ``Python/pythonrun.c`` ``run_eval_code_obj``) marks a
KeyboardInterrupt that leaves a string ``exec`` / ``eval`` as unhandled even when the CLI catches it later,
and ``Py_RunMain`` then kills the process with SIGINT instead of exiting 130. Imports build dataclass methods
with string ``exec`` (``dataclasses._create_fn``), so a Ctrl-C during an import hit it; :func:`main` clears
the mark (:func:`_forget_caught_interrupt`) once the CLI has answered the signal.
"""

import os
import signal


def _while_starting(signum, frame) -> None:
    what = "interrupted (SIGINT)" if signum == signal.SIGINT else "terminated (SIGTERM)"
    os.write(2, f"error: {what} while starting; nothing was done\n".encode())
    os._exit(128 + signum)


_while_starting.hllm_startup = True  # recognised (and replaced) by hllm.cli.app.run


def main() -> None:
    """Install the start-up handlers (where SIGINT / SIGTERM have Python's defaults), then run the CLI."""
    for sig, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL)):
        if signal.getsignal(sig) is default:
            signal.signal(sig, _while_starting)
    from hllm.cli import main as cli_main

    try:
        cli_main()
    finally:
        _forget_caught_interrupt()


def _forget_caught_interrupt() -> None:
    """Clear CPython's "unhandled KeyboardInterrupt" mark (module docstring): every string ``exec`` resets it
    when it starts. A KeyboardInterrupt that really escapes sets it again on its way out of the module, so
    only one the CLI caught and answered (exit 130) is forgotten."""
    exec("pass", {})  # noqa: S102  (a constant string: the reset is the point)


if __name__ == "__main__":
    main()
