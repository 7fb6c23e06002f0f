"""Staging names of interrupted writers and their clean-up (used by the atomic writers of :mod:`hllm.files`).

A staging directory or temporary file of an output ``NAME`` is called ``.NAME.PID-START.XXXXXXXX.tmp``: the writer's
pid and its process start time (clock ticks since boot, ``/proc/PID/stat`` field 22, Linux), so the next writer of
the same target can tell a dead writer's leftovers (SIGKILL, power loss) from a live one's and sweep only those.
SIGTERM during a write raises ``SystemExit(143)`` while :func:`cleanup_on_sigterm` is active, so ``finally``
clean-ups run.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import threading
from pathlib import Path
from typing import Iterator


def _process_start(pid: int) -> int:
    """Start time of process ``pid`` in clock ticks since boot (/proc, Linux), 0 where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return 0


def staging_prefix(path: Path) -> str:
    """``.NAME.PID-START.``: the prefix of this process's staging directories beside ``path`` (see the sweep)."""
    return f".{path.name}.{os.getpid()}-{_process_start(os.getpid())}."


def _writer_alive(pid: int, start: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, someone else's
    return start == 0 or _process_start(pid) in (0, start)


def sweep_stale_staging(path: str | os.PathLike) -> list[Path]:
    """Remove staging directories / temporary files of ``path`` left by writers that no longer run
    (``.NAME.PID-START.XXXXXXXX.tmp`` whose process is gone or is another process with that pid).

    Names without a pid (older hllm) and live writers' are kept. Returns what was removed.
    """
    path = Path(path)
    if not path.parent.is_dir():
        return []
    pattern = re.compile(rf"^\.{re.escape(path.name)}\.(\d+)-(\d+)\.[^.]+\.tmp$")
    removed = []
    for entry in os.scandir(path.parent):
        m = pattern.match(entry.name)
        if m is None or _writer_alive(int(m.group(1)), int(m.group(2))):
            continue
        p = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                p.unlink()
        removed.append(p)
    return removed


@contextlib.contextmanager
def cleanup_on_sigterm() -> Iterator[None]:
    """While active, SIGTERM raises ``SystemExit(143)`` in the main thread, so ``finally`` clean-ups
    (temporary files, staging directories) run before the process exits with the conventional code.

    Only installed in the main thread and when SIGTERM has its default action (a server or a caller
    with its own handler keeps it); a second SIGTERM during the clean-up is ignored.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    fired = False

    def _raise(signum, frame):
        nonlocal fired
        if not fired:
            fired = True
            raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) is _raise:  # unless the body installed its own meanwhile
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
