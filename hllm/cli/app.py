"""The Typer application object and shared CLI helpers (console, progress, errors).

Commands live in small modules (``hllm/cli/*_cmds.py``) that register on :data:`app`; ``main``
runs it so that every :class:`hllm.errors.HllmError` (and a refused overwrite) becomes one line on
stderr and exit code 2, a missing optional dependency prints its ``pip install 'hllm[EXTRA]'`` line
(:mod:`hllm.extras`) and exits 2, a failed check (parity, gate) exits 1, and tracebacks appear only with
``--debug``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from pathlib import Path
from typing import Iterator

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

app = typer.Typer(
    name="hllm",
    help="hLLM reranker toolkit: checkpoint → merged backbone → ONNX / TensorRT → lean runtime, with parity.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console(stderr=True, soft_wrap=True)
out = Console(soft_wrap=True)

#: The committed sample of real eval slates used by default (see examples/README.md).
DEFAULT_SLATES = Path("examples/beauty-eval-sample.jsonl.gz")

_state = {"debug": False}


def _print_version(value: bool) -> None:
    if value:
        import hllm

        out.print(f"hllm {hllm.__version__}", highlight=False)
        raise typer.Exit(0)


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors."),
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
) -> None:
    _state["debug"] = debug
    quiet_libraries()


def quiet_libraries() -> None:
    """Silence transformers' load reports and progress bars (our own bars say what happens)."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*torchvision.*")
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()


def progress() -> Progress:
    """A rich progress bar on stderr (count, elapsed time)."""
    return Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


@contextlib.contextmanager
def step(description: str) -> Iterator[None]:
    """A spinner with elapsed time for one long step; prints ✓ with the time when done."""
    import time

    t0 = time.perf_counter()
    with console.status(f"[bold]{description}…"):
        yield
    console.print(f"[green]✓[/] {description} ({time.perf_counter() - t0:.1f} s)")


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``hllm``)."""
    # typer 0.29 vendors its own click: its usage errors derive from typer.exceptions.TyperException,
    # and `raise typer.Exit(code)` is typer.exceptions.Exit (not the click package's classes).
    from typer.exceptions import Abort, Exit, TyperException

    from hllm.errors import HllmError
    from rich.markup import escape

    from hllm.extras import missing_message

    quiet_libraries()
    try:
        rv = app(args=argv, standalone_mode=False)
    except Exit as e:
        sys.exit(e.exit_code)
    except TyperException as e:  # usage errors: missing argument, unknown option or command
        show = getattr(e, "show", None)
        show() if show else console.print(f"[red]error:[/] {e.format_message()}")
        sys.exit(2)
    except (Abort, KeyboardInterrupt):
        console.print("aborted")
        sys.exit(130)
    except (HllmError, FileExistsError) as e:
        if _state["debug"]:
            raise
        console.print(f"[red]error:[/] {escape(str(e))}", highlight=False)  # escape: 'hllm[serve]' is not markup
        sys.exit(2)
    except ModuleNotFoundError as e:  # an optional dependency: name the extra that brings it
        message = missing_message(e)
        if message is None or _state["debug"]:
            raise
        console.print(f"[red]error:[/] {escape(message)}", highlight=False)
        sys.exit(2)
    except Exception as e:  # a bug: say so, keep the traceback behind --debug
        if _state["debug"]:
            raise
        console.print(f"[red]internal error:[/] {type(e).__name__}: {e} (rerun with --debug for the traceback)")
        sys.exit(1)
    # With standalone_mode=False click returns the code of `raise typer.Exit(code)` instead of exiting.
    sys.exit(rv if isinstance(rv, int) else 0)
