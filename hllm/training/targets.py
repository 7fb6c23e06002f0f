"""Training targets P ``[n, n]`` (item × rank position) for the Sinkhorn loss (torch-free, numpy).

Three kinds, chosen with ``hllm train --target``:

* ``teacher``: a stored permutation (teacher JSONL, one ``order`` of 0-based candidate indices per
  slate, best first) → permutation matrix ``P[order[p], p] = 1``.
* ``clicks`` (the paper's weaker "Track 1" signal): with c clicked items among n (0 < c < n), a
  clicked item's row is uniform over the top positions ``0..c-1`` and an unclicked item's row is
  uniform over ``c..n-1``. P is doubly stochastic, so ``−Σ P log S`` rewards putting the clicked
  items in the first c positions (in any order among themselves) and says nothing about the order
  of the rest. Slates with no click or all clicked carry no signal and are skipped.
* ``clicks+teacher``: a permutation with clicked items first, then the unclicked ones, each group in
  the teacher's order.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from hllm.errors import SlateError
from hllm.training.choices import OBJECTIVES as TARGET_KINDS


def permutation_target(order: Sequence[int], n: int) -> np.ndarray:
    """``[n, n]`` float32 permutation matrix with ``P[order[p], p] = 1``.

    Raises: SlateError if ``order`` is not a permutation of ``range(n)``.
    """
    order = [int(i) for i in order]
    if sorted(order) != list(range(n)):
        raise SlateError(f"teacher order is not a permutation of 0..{n - 1}: {order[:12]}…")
    p = np.zeros((n, n), dtype=np.float32)
    p[order, np.arange(n)] = 1.0
    return p


def click_target(labels: Sequence[int]) -> np.ndarray | None:
    """``[n, n]`` float32 click target (see module doc), or None when no/all items are clicked."""
    lab = np.asarray(labels, dtype=bool)
    n, c = lab.size, int(lab.sum())
    if c == 0 or c == n:
        return None
    p = np.zeros((n, n), dtype=np.float32)
    p[np.ix_(lab, np.arange(c))] = 1.0 / c
    p[np.ix_(~lab, np.arange(c, n))] = 1.0 / (n - c)
    return p


def clicks_then_teacher(labels: Sequence[int], order: Sequence[int]) -> list[int] | None:
    """Clicked items first, then the rest, each group in teacher order; None without a usable click."""
    lab = [bool(x) for x in labels]
    if not any(lab) or all(lab):
        return None
    return [i for i in order if lab[i]] + [i for i in order if not lab[i]]


def read_teacher(path: str | os.PathLike) -> dict[str, list[int]]:
    """Read teacher permutations ``{slate_id: order}`` from JSONL (``hllm teacher`` output; any
    JSONL with ``slate_id`` and ``order`` keys).

    ``order`` must be a list of JSON integers (``"0123"``, ``0.7``, ``true`` are refused, not coerced);
    lines are parsed by the strict :func:`hllm.runtime.slates.loads_json` (deep nesting, NaN refused).
    Raises: SlateError naming file and line (also for bytes that are not UTF-8 or a corrupt gzip).
    """
    import gzip
    import zlib

    from hllm.runtime.slates import loads_json

    path = Path(path)
    if not path.is_file():
        raise SlateError(f"teacher file not found: {path}")
    out: dict[str, list[int]] = {}
    lineno = 0
    try:
        with (gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")) as f:
            for lineno, raw in enumerate(f, 1):
                where = f"{path}:{lineno}"
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise SlateError(f"{where}: not UTF-8 (byte {e.start + 1} of the line)") from None
                if line.strip():
                    sid, order = _teacher_record(loads_json(line, where), where)
                    out[sid] = order
    except (OSError, EOFError, zlib.error) as e:
        raise SlateError(f"cannot read teacher file {path} after line {lineno}: {e}") from None
    return out


def _teacher_record(rec: object, where: str) -> tuple[str, list[int]]:
    if not isinstance(rec, dict) or "slate_id" not in rec or "order" not in rec:
        raise SlateError(f"{where}: not a teacher record with slate_id and order")
    sid, order = rec["slate_id"], rec["order"]
    if isinstance(sid, bool) or not isinstance(sid, (str, int)):
        raise SlateError(f"{where}: slate_id must be a string or an integer, got {type(sid).__name__}")
    if not isinstance(order, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in order):
        raise SlateError(f"{where}: order must be a list of integers (candidate indices), got {str(order)[:60]}")
    return str(sid), order


def build_target(kind: str, slate: dict, teacher: dict[str, list[int]] | None = None) -> np.ndarray | None:
    """The ``[n, n]`` target of one slate for ``kind`` (see module doc); None = skip this slate.

    Raises: SlateError for an unknown kind, missing labels (clicks) or a slate the teacher lacks.
    """
    if kind not in TARGET_KINDS:
        raise SlateError(f"unknown target {kind!r}; known: {', '.join(TARGET_KINDS)}")
    n = len(slate["candidates"])
    sid = str(slate.get("slate_id", "?"))
    if kind in ("clicks", "clicks+teacher") and slate.get("labels") is None:
        raise SlateError(f"slate {sid}: target {kind!r} needs labels")
    if kind in ("teacher", "clicks+teacher"):
        if teacher is None or sid not in teacher:
            raise SlateError(f"slate {sid}: no teacher permutation for it")
        if len(teacher[sid]) != n:
            raise SlateError(f"slate {sid}: teacher order has {len(teacher[sid])} items, slate has {n}")
    if kind == "clicks":
        return click_target(slate["labels"])
    if kind == "teacher":
        return permutation_target(teacher[sid], n)
    order = clicks_then_teacher(slate["labels"], teacher[sid])
    return None if order is None else permutation_target(order, n)
