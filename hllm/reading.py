"""Reading what hllm is given: JSON documents read strictly, content hashes of files and directories, and
file names from a manifest confined to its directory.

Sources: JSON per RFC 8259 (duplicate names are refused, §4: which one was meant is unknowable); SHA-256
(FIPS 180-4) through :mod:`hashlib`.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any


class DuplicateKeyError(ValueError):
    """A JSON object with the same key twice (valid JSON per RFC 8259 §4, which says names SHOULD be
    unique; Python keeps the last silently). hllm refuses it: which one was meant is unknowable."""


def no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict:
    """``object_pairs_hook`` for ``json.loads`` that refuses duplicate keys (:class:`DuplicateKeyError`)."""
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise DuplicateKeyError(f"duplicate key {dup!r} in a JSON object")
    return d


#: What reading a JSON file can raise: unreadable (OSError), not UTF-8, malformed, nested too deeply
#: for the parser (RecursionError), a duplicate key, an integer over the digit limit (ValueError).
JSON_READ_ERRORS = (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError)


#: Largest JSON file :func:`read_json` reads (bytes): hllm's sidecars, manifests and reports are far
#: smaller; a larger input (or an endless one such as ``/dev/zero``) is refused before it fills memory.
MAX_JSON_BYTES = 64 * 1024 * 1024


def read_json(path: str | os.PathLike, error: type[Exception] = ValueError,
              message: str = "cannot read {path}: {reason}", max_bytes: int | None = None) -> Any:
    """The JSON document in the UTF-8 file ``path`` (the one reader of hllm's JSON sidecars and manifests).
    Duplicate keys in an object are refused (:func:`no_duplicate_keys`).

    Args:
        max_bytes: the size limit in bytes (None: :data:`MAX_JSON_BYTES` at call time); at most
            ``max_bytes + 1`` bytes are read.
    Raises: ``error(message.format(path=path, reason=...))`` for any of :data:`JSON_READ_ERRORS`, for a
    path that is not a regular file (a directory; a device, FIFO or socket is refused before opening, so
    a FIFO does not block) and for a file over ``max_bytes``.
    """
    max_bytes = MAX_JSON_BYTES if max_bytes is None else max_bytes
    try:
        mode = os.stat(path).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):  # a directory: open() says "Is a directory"
            raise ValueError("not a regular file (a device, FIFO or socket)")
        with open(path, "rb") as f:
            raw = f.read(max_bytes + 1)
        if len(raw) > max_bytes:
            raise ValueError(f"larger than the limit of {max_bytes} bytes (hllm.reading.MAX_JSON_BYTES)")
        return json.loads(raw.decode("utf-8"), object_pairs_hook=no_duplicate_keys)
    except JSON_READ_ERRORS as e:
        raise error(message.format(path=path, reason=e)) from None


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex sha256 of one file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_tree(path: str | os.PathLike) -> str:
    """Hex sha256 over a directory: every regular file's relative path and bytes, in sorted order.

    Hidden files (names starting with '.') are skipped. A file path hashes as ``sha256_file``.
    """
    path = Path(path)
    if path.is_file():
        return sha256_file(path)
    h = hashlib.sha256()
    for p in sorted(q for q in path.rglob("*") if q.is_file()):
        rel = p.relative_to(path)
        if any(part.startswith(".") for part in rel.parts):
            continue
        h.update(str(rel).encode())
        h.update(b"\0")
        h.update(sha256_file(p).encode())
    return h.hexdigest()


def contained_path(root: str | os.PathLike, name: object, what: str, error: type[Exception] = ValueError) -> Path:
    """``root / name`` for a file named in a manifest or sidecar, refusing names that escape ``root``.

    A name must be a non-empty relative path string that stays inside ``root`` after resolving ``..``
    and symbolic links (a crafted ``"../evil/head.safetensors"`` or an absolute path is refused), so a
    manifest can never make hllm read or write outside its own directory.

    Args:
        root: the directory holding the manifest. name: the value read from it. what: the field, for
            the message (e.g. ``"head.file"``). error: the exception class to raise.
    Raises: ``error`` naming the field and the value.
    """
    if not isinstance(name, str) or not name.strip():
        raise error(f"{what} must be a file name (a non-empty string), got {name!r}")
    p = Path(name)
    base = Path(root).resolve()
    if p.is_absolute():
        raise error(f"{what} must be relative to {base}, got the absolute path {name!r}")
    full = (base / p).resolve()
    if full != base and base not in full.parents:
        raise error(f"{what} {name!r} points outside {base}")
    return full
