"""Reading ``.npz`` files whose members are checked before they are materialised (numpy only, torch-free).

``np.load`` of an ``.npz`` decompresses a member in full when it is indexed: a 4 MB file can declare a
``(1, 2**29)`` int64 member (4 GiB of zeros, compressed) and take gigabytes before any hash or shape
check runs. :class:`CheckedNpz` reads each member's ``.npy`` header first (``numpy.lib.format``:
``read_magic``, ``read_array_header_1_0`` / ``_2_0``), refuses an object dtype, a size over a bound, or a
shape other than the one expected, and only then loads it. Every failure of the container (not a zip,
a truncated member, a bad header, a missing member) is one ``error`` naming the file.
"""

from __future__ import annotations

import math
import os
import zipfile
import zlib
from pathlib import Path
from typing import Sequence

import numpy as np

#: Default bound on one member's size (bytes, from its header), 1 GiB.
MAX_MEMBER_BYTES = 1 << 30


class CheckedNpz:
    """A read-only ``.npz`` whose members are size- and shape-checked from their headers before loading.

    Args:
        path: the file. error: the exception class raised (an :class:`hllm.errors.HllmError` subclass).
        max_member_bytes: largest member accepted (header shape × itemsize).
    Raises: ``error`` naming the file (not a zip archive, unreadable).
    Use as a context manager; :meth:`get` loads one member.
    """

    def __init__(self, path: str | os.PathLike, error: type[Exception], max_member_bytes: int = MAX_MEMBER_BYTES):
        self.path, self.error, self.max_bytes = Path(path), error, max_member_bytes
        try:
            self._zip = zipfile.ZipFile(self.path)
        except (OSError, zipfile.BadZipFile, ValueError, EOFError) as e:
            raise error(f"cannot read {self.path}: not a readable .npz file ({e})") from None
        self.names = {n[:-4] for n in self._zip.namelist() if n.endswith(".npy")}

    def __enter__(self) -> "CheckedNpz":
        return self

    def __exit__(self, *exc) -> None:
        self._zip.close()

    def __contains__(self, name: str) -> bool:
        return name in self.names

    def header(self, name: str) -> tuple[tuple[int, ...], np.dtype]:
        """``(shape, dtype)`` of member ``name`` from its ``.npy`` header (nothing else is read).

        Raises: ``error`` (missing member, corrupt header, object dtype, negative dimension).
        """
        if name not in self.names:
            raise self.error(f"{self.path}: no array {name!r} in the file")
        try:
            with self._zip.open(name + ".npy") as f:
                version = np.lib.format.read_magic(f)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape, _, dtype = read(f)
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, SyntaxError, TypeError) as e:
            raise self.error(f"{self.path}: array {name!r} has a corrupt header ({e})") from None
        if dtype.hasobject:
            raise self.error(f"{self.path}: array {name!r} holds Python objects (refused: they would be unpickled)")
        return tuple(int(d) for d in shape), dtype

    def get(self, name: str, shape: Sequence[int | None] | None = None, ndim: int | None = None) -> np.ndarray:
        """Member ``name``, after checking its header: size ≤ ``max_member_bytes``, ``ndim`` dimensions,
        and ``shape`` (None entries are free).

        Raises: ``error`` naming the file, the member and what is wrong (also a truncated / corrupt member).
        """
        got, dtype = self.header(name)
        nbytes = math.prod(got) * dtype.itemsize
        if nbytes > self.max_bytes:
            raise self.error(f"{self.path}: array {name!r} declares shape {got} ({nbytes} bytes), over the limit "
                             f"of {self.max_bytes} bytes")
        if ndim is not None and len(got) != ndim:
            raise self.error(f"{self.path}: array {name!r} has shape {got}, expected {ndim} dimensions")
        if shape is not None and (len(got) != len(shape) or any(w is not None and w != g for w, g in zip(shape, got))):
            raise self.error(f"{self.path}: array {name!r} has shape {got}, expected {tuple(shape)}")
        try:
            with self._zip.open(name + ".npy") as f:
                return np.lib.format.read_array(f, allow_pickle=False)
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
            raise self.error(f"{self.path}: array {name!r} is unreadable ({e})") from None
