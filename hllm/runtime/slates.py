"""Reading, validating and writing slates: JSONL, gzip or plain (torch-free).

A slate is one JSON object per line, the format of the Amazon Beauty data (provenance:
``examples/README.md``)::

    {"slate_id": str, "history": [str, ...], "candidates": [{"item_id": str, "title": str}, ...],
     "labels": [0|1, ...]}   # labels optional

:func:`validate_slate` is the ONE slate validator: ``hllm rank`` and every command reading slates
(:func:`iter_slates`), the HTTP server (:func:`hllm.serve.protocol.parse_rank_body`) and Triton's
pre-processing model use it, and :func:`loads_json` is the one JSON parser in front of it. Every
message names where (``FILE:LINE`` or ``slates[i]``), the ``slate_id`` when there is one, the field
(``candidates[3].item_id``) and the type it got. Policies:

==========================  ==========================================================================
slate                       a JSON object; other top-level keys are kept and ignored
``slate_id``                optional; a non-empty string, or an integer (converted to its string);
                            null, a float, a boolean, a list or an object is refused. Absent: the
                            slate's index in the whole input, as a string (:func:`slate_id`)
``history``                 optional (absent = []); a list of strings (null refused)
``candidates``              a non-empty list of objects; other candidate keys are kept and ignored
``candidates[i].title``     a string (may be empty); null or any other type refused
``candidates[i].item_id``   a non-empty string, or an integer (converted to its string); null, float,
                            boolean, list, object refused. Either every candidate of a slate has one
                            or none has (then the ranking lists candidate indices); ids must be
                            unique within the slate (a duplicate would be ranked twice)
``labels``                  optional (absent or null = none); one per candidate, each 0 or 1
                            (``true``/``false`` and ``0.0``/``1.0`` accepted, stored as 0/1);
                            non-finite or other values refused
strings                     lone UTF-16 surrogates (``"\\ud800"``, valid JSON but not Unicode text)
                            are refused in every field
JSON                        NaN / Infinity literals (not JSON), nesting deeper than Python's limit,
                            integers over 4300 digits: refused as malformed, never an internal error
==========================  ==========================================================================

Files: ``.gz`` is read as gzip; a corrupt or truncated gzip stream, bytes that are not UTF-8 (the
message names the line and byte), an unreadable file and a file with no slate (empty or blank lines
only) are SlateErrors. A UTF-8 byte-order mark at the start is skipped.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import zlib
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, Sequence

from hllm.errors import SlateError
from hllm.files import atomic_path
from hllm.reading import no_duplicate_keys


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def loads_json(text: str | bytes, where: str = "input") -> Any:
    """Parse JSON strictly: SlateError (naming ``where``) for malformed JSON, ``NaN`` / ``Infinity``
    literals, nesting too deep for the parser, integers too long to convert, or an object with a duplicate
    key (:func:`hllm.reading.no_duplicate_keys`) — never an internal error."""
    try:
        return json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=no_duplicate_keys)
    except json.JSONDecodeError as e:
        raise SlateError(f"{where}: malformed JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except RecursionError:
        raise SlateError(f"{where}: JSON nested too deeply") from None
    except ValueError as e:  # NaN/Infinity (above), int over the digit limit
        raise SlateError(f"{where}: malformed JSON ({e})") from None


def _type(v: Any) -> str:
    return "null" if v is None else type(v).__name__


def text_field(v: Any, where: str, field: str, allow_int: bool = False, allow_empty: bool = True) -> str:
    """A string field (integers converted when ``allow_int``); SlateError naming field and type."""
    if allow_int and isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    if not isinstance(v, str):
        kind = "a string or an integer" if allow_int else "a string"
        raise SlateError(f"{where}: {field} must be {kind}, got {_type(v)}" + (f" ({v!r})" if not isinstance(v, (dict, list)) and v is not None else ""))
    if not allow_empty and not v:
        raise SlateError(f"{where}: {field} must not be empty")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as e:
        raise SlateError(f"{where}: {field} holds a lone surrogate {v[e.start]!r} at character {e.start} "
                         "(valid JSON escape, but not Unicode text)") from None
    return v


def _label(v: Any, where: str, field: str) -> int:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isfinite(v):
        raise SlateError(f"{where}: {field} must be 0 or 1, got the non-finite {v!r}")
    if isinstance(v, (bool, int, float)) and v in (0, 1):
        return int(v)
    raise SlateError(f"{where}: {field} must be 0 or 1, got {_type(v)} {v!r}")


def validate_slate(obj: Any, where: str = "slate") -> dict:
    """Check one slate and return it normalised (a new dict: integer ids as strings, labels as 0/1);
    the policies are the table of the module doc.

    Args:
        obj: the parsed JSON value. where: where it came from, for messages (``FILE:LINE``, ``slates[2]``).
    Raises:
        SlateError: naming ``where``, the slate_id (when valid), the field and the type it got.
    """
    if not isinstance(obj, dict):
        raise SlateError(f"{where}: a slate must be a JSON object, got {_type(obj)}")
    out = dict(obj)
    if "slate_id" in obj:
        out["slate_id"] = text_field(obj["slate_id"], where, "slate_id", allow_int=True, allow_empty=False)
        where = f"{where} (slate_id {out['slate_id']!r})"
    hist = obj.get("history", [])
    if not isinstance(hist, list):
        raise SlateError(f"{where}: 'history' must be a list of strings, got {_type(hist)}")
    for i, h in enumerate(hist):
        text_field(h, where, f"history[{i}]")
    cands = obj.get("candidates")
    if not isinstance(cands, list):
        raise SlateError(f"{where}: 'candidates' must be a list, got {_type(cands)}")
    if not cands:
        raise SlateError(f"{where}: empty slate (no candidates)")
    out["candidates"] = _candidates(cands, where)
    labels = obj.get("labels")
    if labels is not None:
        if not isinstance(labels, list) or len(labels) != len(cands):
            got = f"{len(labels)} entries" if isinstance(labels, list) else _type(labels)
            raise SlateError(f"{where}: 'labels' must be a list with one entry per candidate ({len(cands)}), got {got}")
        out["labels"] = [_label(y, where, f"labels[{i}]") for i, y in enumerate(labels)]
    return out


def _candidates(cands: list, where: str) -> list[dict]:
    out, seen = [], {}
    with_id = [isinstance(c, dict) and "item_id" in c for c in cands]
    for i, c in enumerate(cands):
        if not isinstance(c, dict):
            raise SlateError(f"{where}: candidates[{i}] must be an object with a string 'title', got {_type(c)}")
        if "title" not in c:
            raise SlateError(f"{where}: candidates[{i}] has no 'title'")
        c = dict(c, title=text_field(c["title"], where, f"candidates[{i}].title"))
        if any(with_id) and not with_id[i]:
            first = with_id.index(True)
            raise SlateError(f"{where}: candidates[{i}] has no item_id but candidates[{first}] has one "
                             "(give every candidate an item_id, or none)")
        if with_id[i]:
            item = c["item_id"] = text_field(c["item_id"], where, f"candidates[{i}].item_id", allow_int=True, allow_empty=False)
            if item in seen:
                raise SlateError(f"{where}: duplicate item_id {item!r} (candidates[{seen[item]}] and candidates[{i}])")
            seen[item] = i
        out.append(c)
    return out


def slate_id(slate: dict, index: int) -> str:
    """The one id rule: a validated slate's ``slate_id`` (a string), or, when it has none, its 0-based
    ``index`` in the whole input as a string — what ``hllm rank`` writes and what ``hllm eval`` looks a
    slate's ranking up by (docs/hardening.md, ``slate_id`` policy)."""
    sid = slate.get("slate_id")
    return str(index) if sid is None else str(sid)


def slate_ids(slates: Sequence[dict], first_index: int = 0) -> list[str]:
    """:func:`slate_id` of each of ``slates``, ``slates[0]`` being number ``first_index`` of the input."""
    return [slate_id(s, first_index + i) for i, s in enumerate(slates)]


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
    """A text (UTF-8) reader of a plain or ``.gz`` file (used by :mod:`hllm.training.targets`; slates
    are read by :func:`iter_slates`, which names the line of a bad byte)."""
    import io

    if Path(path).suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


def read_slates(path: str | os.PathLike, limit: int | None = None) -> list[dict]:
    """Read and validate slates from a ``.jsonl`` or ``.jsonl.gz`` file.

    Args:
        path: the file. Blank lines are skipped.
        limit: read at most this many slates (None = all).
    Returns: list of (normalised, :func:`validate_slate`) slate dicts, in file order.
    Raises:
        SlateError: the file is missing, unreadable, a corrupt or truncated gzip, not UTF-8, holds no
            slate, or a line is malformed (message names file and line).
    """
    return list(iter_slates(path, limit))


#: The longest slate line read (bytes, after gzip): a longer line is refused before it is held in memory
#: (a 1 MB ``.jsonl.gz`` can hold a 1 GB line). 128 MiB holds a 100 MB title; titles are cut to the token
#: budget before tokenizing (:func:`hllm.runtime.prompt.cut_text`), so such a slate still ranks.
MAX_LINE_BYTES = 128 * 1024 * 1024


#: The most blank lines in a row a slates stream may hold: they are skipped, but an endless run of them
#: (``yes '' | hllm rank -s - --limit 1``) would be read forever without yielding a slate, so a longer
#: run is refused (SlateError). 10 000 is far above any hand-edited file's spacing and reads in a few ms.
MAX_BLANK_RUN = 10_000


def iter_slates(path: str | os.PathLike, limit: int | None = None) -> Iterator[dict]:
    """Like :func:`read_slates` but lazily."""
    path = Path(path)
    if not path.is_file():
        raise SlateError(f"slates file not found: {path}" + (" is a directory, not a file" if path.is_dir() else ""))
    try:
        f = gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")
    except OSError as e:
        raise SlateError(f"cannot read {path}: {e.strerror or e}") from None
    with f:
        yield from iter_slate_stream(f, str(path), limit, gzipped=False)


def iter_slate_stream(f: IO[bytes], name: str, limit: int | None = None, gzipped: bool | None = None) -> Iterator[dict]:
    """Validated slates read lazily from the binary stream ``f`` (a file, or stdin: nothing is spooled,
    and reading stops after ``limit`` slates, so an endless producer is read only that far).

    Args:
        f: a binary stream of JSONL (or gzip of it, for ``gzipped``; None = detect the gzip magic
            ``1f 8b`` when ``f`` can ``peek``). name: how messages name it (``FILE``, ``<stdin>``).
        limit: stop after this many slates (None = all).
    Raises: SlateError (:func:`read_slates`; also a line over :data:`MAX_LINE_BYTES`, naming the limit,
        and more than :data:`MAX_BLANK_RUN` blank lines in a row).
    """
    if gzipped is None and hasattr(f, "peek"):
        gzipped = f.peek(2)[:2] == b"\x1f\x8b"
    if gzipped:
        f = gzip.GzipFile(fileobj=f, mode="rb")
    n = lineno = blank = 0
    try:
        while limit is None or n < limit:
            raw = f.readline(MAX_LINE_BYTES + 1)
            if not raw:
                break
            lineno += 1
            where = f"{name}:{lineno}"
            if len(raw) > MAX_LINE_BYTES:
                raise SlateError(f"{where}: line longer than the limit of {MAX_LINE_BYTES} bytes "
                                 f"({MAX_LINE_BYTES // 2**20} MiB; hllm.runtime.slates.MAX_LINE_BYTES)")
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise SlateError(f"{where}: not UTF-8 (byte 0x{raw[e.start]:02x} at byte {e.start + 1} of the line)") from None
            del raw
            if not line.strip():
                blank += 1
                if blank > MAX_BLANK_RUN:
                    raise SlateError(f"{where}: more than {MAX_BLANK_RUN} blank lines in a row: not JSONL slates "
                                     "(blank lines are skipped, a run this long is refused; "
                                     "hllm.runtime.slates.MAX_BLANK_RUN)")
                continue
            blank = 0
            yield validate_slate(loads_json(line, where), where)
            n += 1
    except (gzip.BadGzipFile, zlib.error) as e:
        raise SlateError(f"{name}: not a valid gzip file ({e}) after line {lineno}") from None
    except EOFError:
        raise SlateError(f"{name}: the gzip file is truncated (it ends inside line {lineno + 1})") from None
    except OSError as e:
        raise SlateError(f"cannot read {name}: {e.strerror or e}") from None
    if n == 0 and limit != 0:
        raise SlateError(f"{name}: no slates in the file ({'it is empty' if lineno == 0 else 'only blank lines'})")


def write_jsonl(path: str | os.PathLike, records: Iterable[dict]) -> Path:
    """Write records as JSONL (gzip if the name ends in .gz) atomically; returns the path."""
    path = Path(path)
    with atomic_path(path) as tmp:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(tmp, "wt", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n")
    return path
