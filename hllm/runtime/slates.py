"""Reading and writing slates: JSONL, gzip or plain (torch-free).

A slate is one JSON object per line, the format of the Amazon Beauty data
(``../shared/data/amazon-beauty/PROVENANCE.md``)::

    {"slate_id": str, "history": [str, ...], "candidates": [{"item_id": str, "title": str}, ...],
     "labels": [0|1, ...]}   # labels optional

``history`` may be empty; ``candidates`` must hold at least one item; ``labels``, when present,
has one 0/1 entry per candidate.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from hllm.errors import SlateError
from hllm.files import atomic_path


def validate_slate(obj: Any, where: str = "slate") -> dict:
    """Check one slate object; returns it unchanged.

    Raises:
        SlateError: naming ``where`` and the problem (not an object, missing or empty candidates,
            a candidate without string ``item_id``/``title``, labels of the wrong length).
    """
    if not isinstance(obj, dict):
        raise SlateError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    cands = obj.get("candidates")
    if not isinstance(cands, list):
        raise SlateError(f"{where}: 'candidates' must be a list")
    if not cands:
        raise SlateError(f"{where}: empty slate (no candidates)")
    for i, c in enumerate(cands):
        if not isinstance(c, dict) or not isinstance(c.get("title"), str):
            raise SlateError(f"{where}: candidate {i} must be an object with a string 'title'")
        if "item_id" in c and not isinstance(c["item_id"], (str, int)):
            raise SlateError(f"{where}: candidate {i} 'item_id' must be a string")
    hist = obj.get("history", [])
    if not isinstance(hist, list) or not all(isinstance(h, str) for h in hist):
        raise SlateError(f"{where}: 'history' must be a list of strings")
    labels = obj.get("labels")
    if labels is not None:
        if not isinstance(labels, list) or len(labels) != len(cands):
            raise SlateError(f"{where}: 'labels' must be a list with one entry per candidate ({len(cands)})")
    return obj


def take(slate: dict, keep: Sequence[int], id_suffix: str | None = None) -> dict:
    """``slate`` restricted to the candidates ``keep`` (in that order); labels follow their candidates.

    A new dict (the input is not changed); ``slate_id`` gets ``id_suffix`` when given.
    """
    cands = slate["candidates"]
    out = dict(slate, candidates=[cands[i] for i in keep])
    if slate.get("labels") is not None:
        out["labels"] = [slate["labels"][i] for i in keep]
    if id_suffix is not None:
        out["slate_id"] = f"{slate.get('slate_id', '?')}{id_suffix}"
    return out


def subslate(slate: dict, n: int) -> dict:
    """The first ``n`` candidates in the slate's own order, every positive (label 1) kept while it fits
    by dropping the latest negatives; ``slate_id`` gets ``@n``. Used to measure latency at N < 50 on
    real slates while each sub-slate stays a ranking task.

    Raises: SlateError if ``n < 1`` or the slate has fewer than ``n`` candidates.
    """
    cands = slate.get("candidates") or []
    if n < 1 or n > len(cands):
        raise SlateError(f"slate {slate.get('slate_id', '?')}: cannot take {n} of {len(cands)} candidates")
    pos = [i for i, y in enumerate(slate.get("labels") or []) if y]
    keep = list(range(n))
    missing = [i for i in pos if i >= n][:n]
    if missing:
        negatives = [i for i in keep if i not in pos]
        drop = set(negatives[len(negatives) - len(missing):])
        keep = sorted([i for i in keep if i not in drop] + missing)[:n]
    return take(slate, keep, f"@{n}")


def sample_subslate(slate: dict, n: int, seed: int) -> tuple[dict, list[int]]:
    """``n`` candidates for training: every positive (up to n) plus seeded random negatives, shuffled.

    Returns ``(sub-slate, keep)`` with ``keep[j]`` = the original index of the sub-slate's candidate j
    (so a stored teacher order can be restricted to it). A slate of ≤ n candidates is returned whole.
    """
    import numpy as np

    cands = slate["candidates"]
    if len(cands) <= n:
        return slate, list(range(len(cands)))
    rng = np.random.default_rng(seed)
    labels = slate.get("labels") or [0] * len(cands)
    pos = [i for i, y in enumerate(labels) if y][:n]
    neg = [i for i, y in enumerate(labels) if not y]
    keep = pos + [int(i) for i in rng.choice(neg, size=max(0, n - len(pos)), replace=False)]
    keep = [keep[i] for i in rng.permutation(len(keep))]
    return take(slate, keep), keep


def _open_text(path: Path):
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


def read_slates(path: str | os.PathLike, limit: int | None = None) -> list[dict]:
    """Read and validate slates from a ``.jsonl`` or ``.jsonl.gz`` file.

    Args:
        path: the file. Blank lines are skipped.
        limit: read at most this many slates (None = all).
    Returns: list of slate dicts, in file order.
    Raises:
        SlateError: the file is missing, or a line is malformed (message names file and line).
    """
    return list(iter_slates(path, limit))


def iter_slates(path: str | os.PathLike, limit: int | None = None) -> Iterator[dict]:
    """Like :func:`read_slates` but lazily."""
    path = Path(path)
    if not path.is_file():
        raise SlateError(f"slates file not found: {path}")
    n = 0
    with _open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            if limit is not None and n >= limit:
                return
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise SlateError(f"{path}:{lineno}: malformed JSON ({e.msg})") from None
            yield validate_slate(obj, f"{path}:{lineno}")
            n += 1


def write_jsonl(path: str | os.PathLike, records: Iterable[dict]) -> Path:
    """Write records as JSONL (gzip if the name ends in .gz) atomically; returns the path."""
    path = Path(path)
    with atomic_path(path) as tmp:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(tmp, "wt", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n")
    return path
