"""The entry point of ``python -m hllm`` and of the ``hllm`` console script (:func:`main`).

Signals are answered by the exit-code policy (:mod:`hllm.cli.app`) from the first moment: until
:func:`hllm.cli.app.run` installs its own handlers, the CLI's modules are still being imported and
nothing has been done, so SIGINT / SIGTERM end the process at once with one ``error:`` line and exit
130 / 143 (Python's defaults would print a ``KeyboardInterrupt`` traceback or die of the signal).
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

    cli_main()


if __name__ == "__main__":
    main()
