"""The option factories every command builds its options from: one name, one help text and one bound per
concept (docs/cli-conventions.md, "Names"), and the deprecated spellings that keep working.

Bounds: ``--threads`` and ``--workers`` at most 4 × the machine's cores; ``--batch-size``, K and prompt
lengths at most the dimensions the exported graph declares (:mod:`hllm.formats.graph`).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional, Sequence

import typer

from hllm.cli.app import console
from hllm.formats.graph import MAX_BATCH, MAX_ITEMS

CPUS = os.cpu_count() or 1
#: --threads: more intra-op threads than 4× the cores only slows an engine down (and 10⁵ threads take the machine).
MAX_THREADS = 4 * CPUS
#: --workers (Ray actors, one engine each): like --threads, at most 4× the cores.
MAX_WORKERS = 4 * CPUS


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
    """``--overwrite``: replace ``what`` if it exists (without it an existing output is refused, exit 2)."""
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
