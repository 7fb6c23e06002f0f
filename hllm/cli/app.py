"""The Typer application, its consoles, and the exit-code policy.

Commands live in small modules (``hllm/cli/*_cmds.py``) that register on :data:`app`; they build their
options from :mod:`hllm.cli.options` (one concept, one name, one help text, one bound) and read and write
through :mod:`hllm.cli.io`. :func:`run` runs the app and owns the exit-code policy (docs/cli-conventions.md,
"Exit codes"; docs/hardening.md):

====  ==========================================================================================
0     success
1     a check failed: parity thresholds, the calibration gate, LAP solvers disagreeing
2     bad input, usage or environment: an :class:`hllm.errors.HllmError`, a refused overwrite, a
      usage error (unknown option, value out of range), a file system error (missing file, no
      space, read-only, permission), a missing optional dependency (its ``pip install`` line)
70    internal error (``EX_SOFTWARE``, sysexits.h): always a bug; rerun with ``--debug``
130   interrupted by SIGINT (Ctrl-C)
143   terminated by SIGTERM (raised as :class:`Terminated` so atomic writes clean up)
====  ==========================================================================================

Every error is ONE line on stderr starting with ``error:``; tracebacks only with ``hllm --debug`` (or
``HLLM_DEBUG=1``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import sys
import threading
import warnings
from typing import Any, Iterator, NoReturn, Optional

import typer
from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)

from hllm.errors import HllmError

app = typer.Typer(
    name="hllm",
    help="hLLM reranker toolkit: checkpoint → merged backbone → ONNX / TensorRT → lean runtime, with parity.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
    # Help text is plain text: 'hllm[ray]' is shown as written, not read as Rich markup (rich_markup_mode=None).
    rich_markup_mode=None,
    # -h is --help on every command (click passes the setting down to subcommands' contexts).
    context_settings={"help_option_names": ["-h", "--help"]},
)
# emoji=False: user data (a slate_id ':fire:', a path) is printed literally, never as an emoji; markup in
# user data is escaped where it is printed (_error, finish_report, step)
console = Console(stderr=True, soft_wrap=True, emoji=False)  # progress, notes, errors
out = Console(soft_wrap=True, emoji=False)  # results for people; moved to stderr when stdout carries data (--json, -o -)

# -- exit codes (one place) ---------------------------------------------------------------------------
EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2  # bad input, usage or environment
EXIT_SOFTWARE = 70  # sysexits.h EX_SOFTWARE: an internal error, always a bug
EXIT_SIGINT = 130  # 128 + SIGINT
EXIT_SIGTERM = 143  # 128 + SIGTERM

_state: dict[str, Any] = {"debug": False, "interrupt_said": False}


class Terminated(BaseException):
    """SIGTERM, raised in the main thread (like KeyboardInterrupt for SIGINT) so ``finally`` blocks run:
    atomic writes (:mod:`hllm.files`) remove their temporary files and staging directories."""


def signal_exit(message: str, code: int = EXIT_SIGINT) -> NoReturn:
    """End a command that SIGINT / SIGTERM stopped, once it knows what happened: one ``error: MESSAGE`` line,
    exit ``code`` (130 / 143; :func:`run` then adds no line of its own). Raises: typer.Exit(code)."""
    _error(message)
    _state["interrupt_said"] = True
    raise typer.Exit(code)


def _print_version(value: bool) -> None:
    if value:
        import hllm

        out.print(f"hllm {hllm.__version__}", highlight=False)
        raise typer.Exit(0)


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors (also: HLLM_DEBUG=1)."),
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
) -> None:
    _state["debug"] = _state["debug"] or debug
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
    """A rich progress bar on stderr: count, elapsed time and ETA. Off when stderr is not a terminal (a log
    file gets the result lines, not bar redraws; an error stays the one line of stderr)."""
    return Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
        disable=not console.is_terminal,
    )


@contextlib.contextmanager
def step(description: str) -> Iterator[None]:
    """A spinner with elapsed time for one long step; prints ✓ with the time when done."""
    import time

    from rich.markup import escape

    t0 = time.perf_counter()
    with console.status(f"[bold]{escape(description)}…"):
        yield
    console.print(f"[green]✓[/] {escape(description)} ({time.perf_counter() - t0:.1f} s)")


# -- the entry point: one exit-code policy ----------------------------------------------------------------

def _one_line(text: str) -> str:
    return re.sub(r"\s*\n\s*", " ", str(text)).strip()


def _error(message: str) -> None:
    from rich.markup import escape

    console.print(f"[red]error:[/] {escape(_one_line(message))}", highlight=False)  # escape: 'hllm[serve]' is not markup


def _os_message(e: OSError) -> str:
    where = f": {e.filename}" if getattr(e, "filename", None) else ""
    return f"{e.strerror or e}{where}"


def debug_from_env(value: Optional[str] = None) -> bool:
    """Whether ``HLLM_DEBUG`` (or ``value``) turns debug on: ``1``, ``true``, ``yes``, ``on`` (any case);
    anything else — unset, empty, ``0``, ``false``, ``no``, ``off`` — is off."""
    v = os.environ.get("HLLM_DEBUG", "") if value is None else value
    return v.strip().lower() in ("1", "true", "yes", "on")


def _on_sigterm(signum, frame) -> None:
    raise Terminated()


def main(argv: Optional[list[str]] = None) -> None:
    """Console-script entry point (``hllm``): run the app, exit with the policy's code (module docstring)."""
    sys.exit(run(argv))


def run(argv: Optional[list[str]] = None) -> int:
    """Run ``hllm ARGV`` and return its exit code (module docstring); with ``--debug`` errors propagate."""
    _state["debug"] = debug_from_env()
    _state["interrupt_said"] = False
    out.file = None  # back to stdout (a previous in-process run may have moved it)
    quiet_libraries()
    previous = previous_int = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
        if getattr(signal.getsignal(signal.SIGINT), "hllm_startup", False):  # hllm.__main__'s: KeyboardInterrupt now
            previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return _run(argv)
    finally:
        out.file = None
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if previous_int is not None:
            signal.signal(signal.SIGINT, previous_int)


def _non_finite_message(e: Exception) -> Optional[str]:
    """For a number option given ``nan`` / ``inf`` / ``-inf``: "Invalid value for '--min-tau': must be a
    finite number (from -1.0 to 1.0), got 'nan'" — the range check of the option parser (pydantic
    ``ge`` / ``le``) would otherwise blame the bound ("less than or equal to 1"). None for any other error."""
    import math

    param, cause = getattr(e, "param", None), e.__cause__
    errors = getattr(cause, "errors", None)
    if param is None or not callable(errors):
        return None
    try:
        raw = errors()[0].get("input")
        value = float(raw)
    except (TypeError, ValueError, IndexError, AttributeError):
        return None
    if math.isfinite(value):
        return None
    lo, hi = getattr(param, "min", None), getattr(param, "max", None)
    bounds = f" (from {lo} to {hi})" if lo is not None and hi is not None else (
        f" (at least {lo})" if lo is not None else f" (at most {hi})" if hi is not None else "")
    name = next((o for o in getattr(param, "opts", ()) if o.startswith("--")), param.name)
    return f"Invalid value for '{name}': must be a finite number{bounds}, got {raw!r}"


def _sample_hint(e: Exception, argv: Optional[list[str]]) -> str:
    """For a slate over the head's K read from the packaged sample (no ``--slates`` given): say so."""
    from hllm.errors import SlateError

    args = sys.argv[1:] if argv is None else argv
    given = any(a in ("-s", "--slates") or a.startswith("--slates=") for a in args)
    if isinstance(e, SlateError) and "the head ranks at most K" in str(e) and not given:
        return (" — these are the packaged sample slates (50 candidates each); pass slates of at most K candidates "
                "with --slates")
    return ""


def _run(argv: Optional[list[str]]) -> int:
    # typer 0.29 vendors its own click: usage errors derive from typer.exceptions.TyperException,
    # and `raise typer.Exit(code)` is typer.exceptions.Exit (not the click package's classes).
    from typer.exceptions import Abort, Exit, TyperException

    from hllm.extras import missing_message

    try:
        rv = app(args=argv, prog_name="hllm", standalone_mode=False)
    except SystemExit as e:  # click exits 1 itself when the reader of stdout went away (EPIPE): not our error
        cause = e.__context__
        if isinstance(cause, OSError) and cause.errno == errno.EPIPE:
            return EXIT_OK
        raise
    except Exit as e:
        return e.exit_code
    except Abort:
        _error("aborted")
        return EXIT_SIGINT
    except TyperException as e:  # usage: missing argument, unknown option or command, value out of range
        if type(e).__name__ == "NoArgsIsHelpError":  # `hllm` or `hllm bench` alone: the help was printed
            return EXIT_USAGE
        ctx = getattr(e, "ctx", None)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        _error(f"{_non_finite_message(e) or e.format_message()}{hint}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        _error("interrupted (SIGINT); nothing partial was left in place of an output")
        return EXIT_SIGINT
    except Terminated:
        _error("terminated (SIGTERM); nothing partial was left in place of an output")
        return EXIT_SIGTERM
    except (HllmError, FileExistsError) as e:
        if _state["debug"]:
            raise
        _error(str(e) + _sample_hint(e, argv))
        return EXIT_USAGE
    except ModuleNotFoundError as e:  # an optional dependency: name the extra that brings it
        message = missing_message(e)
        if message is None or _state["debug"]:
            return _internal(e)
        _error(message)
        return EXIT_USAGE
    except OSError as e:  # the environment: no such file, no space, read-only, permission, address in use
        if _state["debug"]:
            raise
        _error(_os_message(e) if e.errno != errno.ENOSPC else f"no space left on the device: {_os_message(e)}")
        return EXIT_USAGE
    except MemoryError:
        if _state["debug"]:
            raise
        _error("out of memory (lower --batch-size or --limit)")
        return EXIT_USAGE
    except Exception as e:  # a bug, or a library's error about an input file a reader did not map
        message = library_file_error(e)
        if message is None or _state["debug"]:
            return _internal(e)
        _error(message)
        return EXIT_USAGE
    # With standalone_mode=False click returns the code of `raise typer.Exit(code)` instead of exiting; it turns
    # KeyboardInterrupt (SIGINT) into Exit(130) itself.
    if rv == EXIT_SIGINT and not _state["interrupt_said"]:
        _error("interrupted (SIGINT); nothing partial was left in place of an output")
    return rv if isinstance(rv, int) else EXIT_OK


#: Errors that libraries raise about the bytes of a file they read (a corrupt or hostile input, not a bug of
#: hllm): safetensors, zip / npz, pickle refusals, gzip, JSON (incl. nesting too deep), text encodings.
_LIBRARY_FILE_ERRORS = {
    "SafetensorError": "not a readable safetensors file",
    "BadZipFile": "not a readable zip / .npz file",
    "UnpicklingError": "a pickle, which hllm does not load",
    "BadGzipFile": "not a readable gzip file",
    "JSONDecodeError": "malformed JSON",
    "RecursionError": "nested too deeply",
    "UnicodeDecodeError": "not UTF-8 text",
}


def library_file_error(e: BaseException) -> Optional[str]:
    """The one-line message (exit 2) for a library's error about the contents of an input file that no
    reader of hllm mapped to an :class:`HllmError` itself (:data:`_LIBRARY_FILE_ERRORS`, by class name and
    its bases), naming the file when the exception or its cause carries one; None for anything else (a bug)."""
    kinds = [c.__name__ for c in type(e).__mro__]
    what = next((_LIBRARY_FILE_ERRORS[k] for k in kinds if k in _LIBRARY_FILE_ERRORS), None)
    if what is None:
        return None
    name = getattr(e, "filename", None) or getattr(e, "name", None)
    where = f"{name}: " if isinstance(name, str) else ""
    return f"{where}an input file is {what} ({type(e).__name__}: {str(e)[:200]})"


def _internal(e: BaseException) -> int:
    if _state["debug"]:
        raise e
    _error(f"internal error (a bug in hllm, please report it): {type(e).__name__}: {e} — rerun with --debug for the traceback")
    return EXIT_SOFTWARE
