"""What a command reads and writes: ``--slates`` in (a file, ``-`` = stdin, or the packaged sample), JSON
reports and JSONL records out (atomic files or stdout), and the check of every output location made before
any work (docs/hardening.md, "Output vs input").
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import typer

from hllm.cli.app import out
from hllm.errors import HllmError, SlateError
from hllm.files import json_safe

# -- slates in ---------------------------------------------------------------------------------------------

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
    if path is None:
        from hllm.data import sample_slates

        return sample_slates()
    if is_std(path):
        raise typer.BadParameter(f"this command cannot read slates from stdin; give {option} a file")
    if not Path(path).is_file():
        raise SlateError(f"slates file not found: {path}" + (" (a directory)" if Path(path).is_dir() else ""))
    return Path(path)


def load_slates(path: Optional[Path], limit: Optional[int] = None) -> list[dict]:
    """Read ``--slates`` whole: a file (:func:`hllm.runtime.slates.read_slates`), ``-`` (stdin, plain or gzip,
    streamed: reading stops after ``limit`` slates, so an endless producer is fine) or None (the packaged
    sample). Raises SlateError (messages name ``<stdin>`` or the file, and the line; an empty input)."""
    rows = list(iter_input_slates(path, limit))
    if not rows:
        raise SlateError(f"{_input_name(path)}: no slates (the input is empty)")
    return rows


def iter_input_slates(path: Optional[Path], limit: Optional[int] = None) -> Iterator[dict]:
    """``--slates`` read lazily (a file, ``-`` = stdin, None = the packaged sample), for commands that
    stream: memory holds one slate at a time, and a slate can be ranked before the next one is read
    (:func:`hllm.runtime.slates.iter_slates` / :func:`~hllm.runtime.slates.iter_slate_stream`).

    A missing file is refused now (SlateError); reading errors are raised, as by :func:`load_slates`,
    when the bad line is reached (SlateError naming ``FILE:LINE`` or ``<stdin>:LINE``), an empty input
    after the last line."""
    from hllm.runtime.slates import iter_slate_stream, iter_slates

    if is_std(path):
        import io

        src = getattr(sys.stdin, "buffer", None)
        if src is None:
            raise SlateError("stdin is not readable")
        if not hasattr(src, "peek"):
            src = io.BufferedReader(src)  # type: ignore[arg-type]
        rows = iter_slate_stream(src, "<stdin>", limit)
    else:
        rows = iter_slates(slates_file(path), limit)
    return _mapped_read_errors(rows, _input_name(path))


def _input_name(path: Optional[Path]) -> str:
    return "<stdin>" if is_std(path) else str(path or "the packaged sample")


def _mapped_read_errors(rows: Iterator[dict], name: str) -> Iterator[dict]:
    """``rows``, with a decoding error of the input (not UTF-8, truncated or corrupt gzip, nesting too deep)
    raised as SlateError naming ``name``."""
    import gzip
    import zlib

    try:
        yield from rows
    except (UnicodeDecodeError, EOFError, zlib.error, gzip.BadGzipFile, RecursionError) as e:
        what = {UnicodeDecodeError: "not UTF-8 text", EOFError: "a truncated gzip file",
                RecursionError: "JSON nested too deeply"}.get(type(e), "not a readable gzip file")
        raise SlateError(f"{name}: cannot read slates: {what} ({type(e).__name__})") from None


# -- data out ----------------------------------------------------------------------------------------------

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
    sys.stdout.write(json.dumps(json_safe(obj), indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


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


#: A command parameter whose name says the command writes it (``out``, ``out_dir``, ``islands_out``,
#: ``report``, ``summary``, ``plan``, ``log``, ``timing_cache``, ``reference_scores_path``, ...).
OUTPUT_PARAM_NAME = re.compile(r"(^|_)(out|output|report|summary|plan|log|timing_cache|reference_scores)(_|$)")


def _refuse_shared_output(path: os.PathLike | str) -> None:
    """Refuse an output at the same path as another output of the running command (``debug precision -o
    f.json --report f.json``: the second write would replace the first). The command's outputs are its
    ``Path`` parameters named by :data:`OUTPUT_PARAM_NAME`; paths are compared after resolving symbolic
    links and ``..``, whether or not they exist yet. Outside a command: nothing is checked.
    Raises: OutputError naming both options and the path."""
    from typer._click.globals import get_current_context

    from hllm.errors import OutputError

    ctx = get_current_context(silent=True)
    if ctx is None:
        return
    here = os.path.realpath(path)
    names = []
    for p in ctx.command.params:
        v = ctx.params.get(p.name)
        if isinstance(v, Path) and not is_std(v) and OUTPUT_PARAM_NAME.search(p.name or "") \
                and os.path.realpath(v) == here:
            longs = [o for o in getattr(p, "opts", ()) if o.startswith("--")]
            names.append(longs[0] if longs else p.name.upper())  # an argument: its name, as in --help
    if len(names) >= 2:
        raise OutputError(f"{' and '.join(names)} name the same path {path}: two outputs of one command "
                          "cannot share a file (the second would replace the first); give each its own path")


def check_output_file(path: Optional[os.PathLike | str], what: str = "--out",
                      inputs: Iterable[os.PathLike | str] = ()) -> None:
    """The one check of an output file, made before any work: refuses one that is, or lies inside, an
    input of the command or one of ``inputs`` (:func:`hllm.files.refuse_overlap`) — checked FIRST, so
    nothing is ever created inside an input, not even a probe file —, then a directory, a device / pipe /
    socket or a link to one (``/dev/null``: the atomic rename would replace it), or a location without a
    writable directory or free space (:func:`hllm.files.check_writable`). ``-`` (stdout) and None pass.
    A symbolic link is judged by its target. Another output of the command at the same path is refused
    first (:func:`_refuse_shared_output`, naming both options). Raises HllmError (OutputError) naming ``what``."""
    from hllm.files import check_writable

    if path is None or is_std(path):
        return
    _refuse_shared_output(path)
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
    (:func:`hllm.files.check_writable`); another output of the command at the same path is refused first
    (:func:`_refuse_shared_output`). Raises FileExistsError (exists) or HllmError."""
    from hllm.files import check_writable

    if is_std(path):
        raise HllmError(f"{what} cannot be stdout ('-'); give a directory")
    _refuse_shared_output(path)
    try:
        _refuse_overlap(path, "dir", inputs)
        check_writable(path, "dir", overwrite=overwrite or resumable)
    except HllmError as e:
        raise type(e)(f"{what}: {e}") from None
