"""Atomic file writes and content hashes.

Every artefact hllm writes goes to a temporary name in the destination folder and is renamed into
place only when complete, so an interrupted or failed command never leaves a partial file where a
good one was (POSIX ``os.replace`` is atomic within one file system).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; returns the path."""
    path = Path(path)
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented JSON (sorted keys off, NaN forbidden) to ``path`` atomically."""
    return atomic_write_text(path, json.dumps(obj, indent=2, allow_nan=False) + "\n")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary file path beside ``path``; on success rename it to ``path``.

    On any exception the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; the result is an ordinary file
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory beside ``path``; on success move it to ``path``.

    Raises:
        FileExistsError: ``path`` exists and ``overwrite`` is false (checked before any work).
    On failure the temporary directory is deleted and an existing ``path`` is untouched; with
    ``overwrite`` the old directory is replaced only after the new one is complete.
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} already exists (pass --overwrite to replace it)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes 0700; the result is an ordinary directory
    try:
        yield tmp
        promote_dir(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def promote_dir(staging: str | os.PathLike, dest: str | os.PathLike) -> None:
    """Move a finished directory ``staging`` to ``dest``, replacing an existing ``dest`` only once the
    new one is complete (old one renamed aside, new one renamed in, old one deleted)."""
    staging, dest = Path(staging), Path(dest)
    if dest.exists():
        old = dest.with_name(f".{dest.name}.old")
        if old.exists():
            shutil.rmtree(old)
        os.replace(dest, old)
        os.replace(staging, dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, dest)


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
