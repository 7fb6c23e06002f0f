"""The Typer application, the exit-code policy, and the option conventions every command shares.

Commands live in small modules (``hllm/cli/*_cmds.py``) that register on :data:`app` and build their
options from the factories here, so one concept has one name, one help text and one bound everywhere
(the naming table in README.md, "CLI conventions"). :func:`main` runs the app and owns the exit-code
policy (README.md, "Exit codes"; docs/hardening.md):

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
import json
import os
import re
import signal
import sys
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

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

# -- bounds of count options ----------------------------------------------------------------------------
CPUS = os.cpu_count() or 1
#: --threads: more intra-op threads than 4× the cores only slows an engine down (and 10⁵ threads take the machine).
MAX_THREADS = 4 * CPUS
#: --workers (Ray actors, one engine each): like --threads, at most 4× the cores.
MAX_WORKERS = 4 * CPUS
#: --batch-size ≤ MAX_BATCH, K / --n-items ≤ MAX_ITEMS, prompt lengths ≤ MAX_SEQ: the bounds the exported graph
#: declares for its dimensions (one owner: hllm.formats.graph).
from hllm.formats.graph import MAX_BATCH, MAX_ITEMS, MAX_SEQ  # noqa: E402,F401

_state: dict[str, Any] = {"debug": False}


class Terminated(BaseException):
    """SIGTERM, raised in the main thread (like KeyboardInterrupt for SIGINT) so ``finally`` blocks run:
    atomic writes (:mod:`hllm.files`) remove their temporary files and staging directories."""


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


# -- option factories: one name, one help text, one bound per concept (README "CLI conventions") -----------

def _choice_check(name: str, choices: Sequence[str]) -> Callable:
    def check(value):
        if value is None or value in choices:
            return value
        raise typer.BadParameter(f"{name.lstrip('-')} must be one of {', '.join(choices)}, got {value!r}")
    return check


def choice_opt(default: Optional[str], choices: Sequence[str], *names: str, help: str) -> Any:
    """A string option whose ``--help`` lists its choices and whose completion offers them."""
    choices = tuple(choices)
    return typer.Option(default, *names, metavar="[" + "|".join(choices) + "]", help=help,
                        callback=_choice_check(names[0], choices), autocompletion=lambda: list(choices))


def slates_opt(help: str = "Slates, JSONL or JSONL.gz ('-' = stdin).") -> Any:
    """``--slates/-s``: the slates a command reads, defaulting to the packaged sample (``train``, ``features``
    and ``teacher`` declare theirs as required)."""
    return typer.Option(None, "--slates", "-s", help=f"{help} Default: the packaged 100-slate Amazon Beauty sample.")


def limit_opt(default: Optional[int] = None, help: str = "Use only the first LIMIT slates.") -> Any:
    """``--limit``: how many slates (the first ones of ``--slates``); ≥ 1."""
    return typer.Option(default, "--limit", min=1, help=help)


def batch_opt(default: int = 1, help: str = "Slates per engine call.") -> Any:
    """``--batch-size/-b``: slates per engine call (at most), 1..1024."""
    return typer.Option(default, "--batch-size", "-b", min=1, max=MAX_BATCH, help=help)


def threads_opt(help: str = "Intra-op threads of the engine.") -> Any:
    """``--threads``: 1..4×cores."""
    return typer.Option(None, "--threads", min=1, max=MAX_THREADS, help=f"{help} At most {MAX_THREADS} (4 × cores).")


def out_opt(required: bool = False, help: str = "File to write (atomic; '-' = stdout).") -> Any:
    """``--out/-o``: the records or report a command writes (rankings, reports, metrics, inputs)."""
    return typer.Option(... if required else None, "--out", "-o", help=help)


def json_opt() -> Any:
    """``--json``: a machine-readable summary on stdout; the human output moves to stderr."""
    return typer.Option(False, "--json", help="Print a machine-readable JSON summary on stdout (human output → stderr).")


def overwrite_opt(what: str = "the output") -> Any:
    return typer.Option(False, "--overwrite", help=f"Replace {what} if it exists.")


def positions_opt(default: int = 50) -> Any:
    """``--positions/-k``: K, rank positions of the head."""
    return typer.Option(default, "--positions", "-k", min=1, max=MAX_ITEMS, help="K: rank positions (largest slate).")


def deprecated(old: str, new: str) -> None:
    """Warn (one line on stderr) that the spelling ``old`` is deprecated in favour of ``new``."""
    from rich.markup import escape

    console.print(f"[yellow]warning:[/] {escape(old)} is deprecated; use {escape(new)}", highlight=False)


def hidden_alias(name: str, use: str) -> Any:
    """A deprecated spelling ``name`` of the option ``use``: it keeps working, is not shown in ``--help``
    (the README's naming table lists it) and, when given, warns on stderr (:func:`deprecated`)."""
    def warn(ctx: typer.Context, value: Any) -> Any:
        if value is not None and not ctx.resilient_parsing:
            deprecated(name, use)
        return value

    return typer.Option(None, name, hidden=True, callback=warn)


def pick(new: Any, old: Any, new_default: Any = None) -> Any:
    """The value of an option or of its deprecated alias (the alias wins only if the new one was left at default)."""
    return old if old is not None and new == new_default else new


# -- slates in, data out ---------------------------------------------------------------------------------

def is_std(path: Optional[os.PathLike | str]) -> bool:
    """``-`` (stdin for inputs, stdout for outputs)."""
    return path is not None and str(path) == "-"


def slates_source(path: Optional[Path], default: str = "packaged sample") -> str:
    """How a report names the slates it read from ``path``: ``<stdin>`` for ``-``, the path, or
    ``default`` when None (the packaged sample)."""
    if is_std(path):
        return "<stdin>"
    return default if path is None else str(path)


def slates_file(path: Optional[Path], option: str = "--slates") -> Path:
    """A slates path for code that reads the file itself: the packaged sample when ``path`` is None;
    ``-`` is refused (that code cannot read stdin). Raises SlateError if the file does not exist."""
    from hllm.errors import SlateError

    if path is None:
        from hllm.data import sample_slates

        return sample_slates()
    if is_std(path):
        raise typer.BadParameter(f"this command cannot read slates from stdin; give {option} a file")
    if not Path(path).is_file():
        raise SlateError(f"slates file not found: {path}" + (" (a directory)" if Path(path).is_dir() else ""))
    return Path(path)


def load_slates(path: Optional[Path], limit: Optional[int] = None) -> list[dict]:
    """Read ``--slates``: a file (:func:`hllm.runtime.slates.read_slates`), ``-`` (stdin, plain or gzip) or
    None (the packaged sample). Raises SlateError (messages name ``<stdin>`` and the line)."""
    from hllm.errors import SlateError

    if not is_std(path):
        return _read_slates(slates_file(path), limit, str(path or "the packaged sample"))
    src = getattr(sys.stdin, "buffer", None)
    if src is None:
        raise SlateError("stdin is not readable")
    import io

    from hllm.runtime.slates import iter_slate_stream

    if not hasattr(src, "peek"):
        src = io.BufferedReader(src)  # type: ignore[arg-type]
    # streamed (nothing spooled to disk): reading stops after --limit slates, so an endless producer is fine
    return _read_slates(None, limit, "<stdin>", lambda: list(iter_slate_stream(src, "<stdin>", limit)))


def iter_input_slates(path: Optional[Path], limit: Optional[int] = None) -> Iterator[dict]:
    """``--slates`` read lazily (a file, ``-`` = stdin, None = the packaged sample), for commands that
    stream: memory holds one slate at a time, and a slate can be ranked before the next one is read
    (:func:`hllm.runtime.slates.iter_slates` / :func:`~hllm.runtime.slates.iter_slate_stream`).

    A missing file is refused now (SlateError); reading errors are raised, as by :func:`load_slates`,
    when the bad line is reached (SlateError naming ``FILE:LINE`` or ``<stdin>:LINE``), an empty input
    after the last line."""
    from hllm.errors import SlateError
    from hllm.runtime.slates import iter_slate_stream, iter_slates

    if is_std(path):
        src = getattr(sys.stdin, "buffer", None)
        if src is None:
            raise SlateError("stdin is not readable")
        import io

        if not hasattr(src, "peek"):
            src = io.BufferedReader(src)  # type: ignore[arg-type]
        rows, name = iter_slate_stream(src, "<stdin>", limit), "<stdin>"
    else:
        rows, name = iter_slates(slates_file(path), limit), str(path or "the packaged sample")
    return _mapped_read_errors(rows, name)


def _mapped_read_errors(rows: Iterator[dict], name: str) -> Iterator[dict]:
    import gzip
    import zlib

    from hllm.errors import SlateError

    try:
        yield from rows
    except (UnicodeDecodeError, EOFError, zlib.error, gzip.BadGzipFile, RecursionError) as e:
        what = {UnicodeDecodeError: "not UTF-8 text", EOFError: "a truncated gzip file",
                RecursionError: "JSON nested too deeply"}.get(type(e), "not a readable gzip file")
        raise SlateError(f"{name}: cannot read slates: {what} ({type(e).__name__})") from None


def _read_slates(path: Optional[Path], limit: Optional[int], name: str,
                 read: Optional[Callable[[], list[dict]]] = None) -> list[dict]:
    """:func:`hllm.runtime.slates.read_slates` of ``path`` (or ``read()``), with undecodable files and an empty
    result as SlateError."""
    import gzip
    import zlib

    from hllm.errors import SlateError
    from hllm.runtime.slates import read_slates

    try:
        rows = read() if read is not None else read_slates(path, limit=limit)
    except (UnicodeDecodeError, EOFError, zlib.error, gzip.BadGzipFile, RecursionError) as e:
        what = {UnicodeDecodeError: "not UTF-8 text", EOFError: "a truncated gzip file",
                RecursionError: "JSON nested too deeply"}.get(type(e), "not a readable gzip file")
        raise SlateError(f"{name}: cannot read slates: {what} ({type(e).__name__})") from None
    if not rows:
        raise SlateError(f"{name}: no slates (the input is empty)")
    return rows


def data_to_stdout(json_flag: bool, *outputs: Optional[os.PathLike | str]) -> None:
    """Called before a command's work when ``--json`` or an output ``-`` puts data on stdout: the human
    output (``out``) moves to stderr. Refuses two things on stdout at once."""
    n = int(bool(json_flag)) + sum(is_std(p) for p in outputs)
    if n > 1:
        raise typer.BadParameter("only one thing can go to stdout: drop --json or write the other output to a file")
    if n:
        out.file = sys.stderr


def emit_json(obj: Any) -> None:
    """Print one JSON document on stdout (``--json``, ``-o -``); NaN is written as null."""
    sys.stdout.write(json.dumps(_finite(obj), indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


def write_json_out(path: Optional[os.PathLike | str], obj: Any) -> None:
    """Write a JSON report to ``path`` atomically, or to stdout for ``-``; nothing for None."""
    if path is None:
        return
    if is_std(path):
        emit_json(obj)
    else:
        from hllm.files import atomic_write_json

        atomic_write_json(path, obj)


def finish_report(path: Optional[os.PathLike | str], doc: Any, json_out: bool,
                  show: Optional[Callable[[Any], None]] = None, label: str = "report") -> None:
    """The end of a command that makes a JSON report: write ``doc`` to ``path`` (atomic; ``-`` = stdout;
    None = nowhere), show it to people (``show(doc)``, e.g. a table), say where the file went
    (``"{label} → path"``) and, with ``--json``, print it on stdout."""
    write_json_out(path, doc)
    if show is not None:
        show(doc)
    if path is not None and not is_std(path):
        from rich.markup import escape

        out.print(escape(f"{label} → {path}" if label else f"→ {path}"), highlight=False)
    if json_out:
        emit_json(doc)


def write_records(path: os.PathLike | str, records: Iterable[dict]) -> None:
    """Write JSONL records to ``path`` atomically (gzip for .gz), or to stdout for ``-`` (each line flushed
    as it is made: a reader of a pipe gets a record as soon as it exists)."""
    if is_std(path):
        for r in records:
            sys.stdout.write(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n")
            sys.stdout.flush()
        return
    from hllm.runtime.slates import write_jsonl

    write_jsonl(path, records)


# -- output locations, checked before the work (hllm.files.check_writable) ----------------------------------

def command_inputs() -> list[Path]:
    """The paths the running command was given (every ``Path`` argument and option of the click context,
    and every string one naming an existing file or directory, lists included), for :func:`hllm.files.refuse_overlap`. Outside a command: []."""
    from typer._click.globals import get_current_context

    ctx = get_current_context(silent=True)
    found: list[Path] = []
    while ctx is not None:
        for v in ctx.params.values():
            for x in (v if isinstance(v, (list, tuple)) else [v]):
                if isinstance(x, Path) and not is_std(x):
                    found.append(x)
                elif isinstance(x, str) and x not in ("", "-") and os.path.exists(x):  # e.g. eval's RANKERS
                    found.append(Path(x))
        ctx = ctx.parent
    return found


def _refuse_overlap(path: os.PathLike | str, kind: str, inputs: Iterable[os.PathLike | str] = ()) -> None:
    """Refuse an output equal to, inside, or (a directory) containing another path the command was given,
    or one of ``inputs`` (paths a command finds inside a value, e.g. ``--contender NAME|PATH|…``)
    (:func:`hllm.files.refuse_overlap`). The output's own argument is the one given path equal to it; a
    second one equal to it is an input named as the output (``rank -s t.jsonl -o t.jsonl``)."""
    from hllm.files import refuse_overlap

    here = os.path.realpath(path)
    given = command_inputs()
    same = [p for p in given if os.path.realpath(p) == here]
    others = [p for p in given if os.path.realpath(p) != here] + same[1:] + list(inputs)
    refuse_overlap(path, others, kind)


def check_output_file(path: Optional[os.PathLike | str], what: str = "--out",
                      inputs: Iterable[os.PathLike | str] = ()) -> None:
    """The one check of an output file, made before any work: refuses one that is, or lies inside, an
    input of the command or one of ``inputs`` (:func:`hllm.files.refuse_overlap`) — checked FIRST, so
    nothing is ever created inside an input, not even a probe file —, then a directory, a device / pipe /
    socket or a link to one (``/dev/null``: the atomic rename would replace it), or a location without a
    writable directory or free space (:func:`hllm.files.check_writable`). ``-`` (stdout) and None pass.
    A symbolic link is judged by its target. Raises HllmError (OutputError) naming ``what``."""
    from hllm.files import check_writable

    if path is None or is_std(path):
        return
    try:
        _refuse_overlap(path, "file", inputs)
        check_writable(path, "file")
    except HllmError as e:
        raise type(e)(f"{what}: {e}") from None


def check_output_dir(path: os.PathLike | str, overwrite: bool = False, what: str = "output directory",
                     resumable: bool = False, inputs: Iterable[os.PathLike | str] = ()) -> None:
    """The one check of an output directory, made before any work: refuses one that is, lies inside or
    contains an input of the command or one of ``inputs`` (:func:`hllm.files.refuse_overlap`; checked
    first, before any probe file is created), an existing one without ``--overwrite`` (unless
    ``resumable``), a file in its place, or a location without a writable directory
    (:func:`hllm.files.check_writable`). Raises FileExistsError (exists) or HllmError."""
    from hllm.files import check_writable

    if is_std(path):
        raise HllmError(f"{what} cannot be stdout ('-'); give a directory")
    try:
        _refuse_overlap(path, "dir", inputs)
        check_writable(path, "dir", overwrite=overwrite or resumable)
    except HllmError as e:
        raise type(e)(f"{what}: {e}") from None


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
    out.file = None  # back to stdout (a previous in-process run may have moved it)
    quiet_libraries()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _run(argv)
    finally:
        out.file = None
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


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
        _error(f"{e.format_message()}{hint}")
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
        _error(str(e))
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
    if rv == EXIT_SIGINT:
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
