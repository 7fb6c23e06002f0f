"""Calibration sets on disk: encoded real slates, saved for reproducible quantized builds (numpy only).

A set is two files, so a quantized build can be repeated bit for bit:

* ``<name>.npz`` — per batch ``b`` and graph input ``x`` (:func:`hllm.formats.graph.feed_dict`):
  ``input_ids/b [B, S] int64``, ``readout_positions/b [B, N] int64``, ``item_mask/b [B, N] bool``, and
  ``context_positions/b [B] int64`` for a graph whose head reads the user context;
* ``<name>.json`` — ``format: hllm-calibration/1``, ``inputs`` (the graph input names it holds; a set
  without the field holds the three base inputs), source file and its sha256, seed, count, batch size,
  the chosen slate ids (in order), every batch's shapes, the prompt spec, the tokenizer's sha256, the pad
  id and ``data_sha256`` (a hash of the arrays' bytes, independent of the zip container's timestamps).

:meth:`CalibrationSet.save` is the one writer and :func:`load_calibration_set` the one reader;
:mod:`hllm.calibration.data` draws and encodes the slates.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from hllm.errors import HllmError, SlateError
from hllm.files import atomic_path, atomic_write_json
from hllm.reading import read_json
from hllm.formats.graph import INPUT_DTYPES, INPUT_NAMES, declared_inputs
from hllm.formats.npz import CheckedNpz

FORMAT = "hllm-calibration/1"


@dataclass
class CalibrationSet:
    """Encoded calibration batches plus the record of how they were chosen.

    Attributes:
        batches: list of feed dicts of the exported graph (:func:`hllm.formats.graph.feed_dict`):
            ``{"input_ids": [B,S] int64, "readout_positions": [B,N] int64, "item_mask": [B,N] bool}``
            plus ``"context_positions": [B] int64`` when the head reads the user context.
        meta: JSON-serialisable record (see module docstring); ``meta["slate_ids"]`` lists the slates.
    """

    batches: list[dict[str, np.ndarray]]
    meta: dict = field(default_factory=dict)

    @property
    def inputs(self) -> tuple[str, ...]:
        """The graph input names every batch holds (``meta["inputs"]``; the three base inputs if absent)."""
        return declared_inputs(self.meta.get("inputs") or INPUT_NAMES)

    @property
    def slate_ids(self) -> list[str]:
        """Ids of the calibration slates, in the order they were encoded."""
        return list(self.meta.get("slate_ids", []))

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return iter(self.batches)

    def data_sha256(self) -> str:
        """sha256 over every array's name, dtype, shape and bytes, in batch order."""
        return arrays_sha256(self.batches)

    def save(self, path: str | os.PathLike) -> tuple[Path, Path]:
        """Write ``<path>.npz`` and ``<path>.json`` atomically (``path`` may end in .npz/.json or neither).

        Returns the two paths.
        """
        npz, js = calibration_paths(path)
        arrays = {f"{name}/{b}": batch[name] for b, batch in enumerate(self.batches) for name in _names(batch)}
        with atomic_path(npz) as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, **arrays)
        meta = {**self.meta, "data_sha256": self.data_sha256(), "npz": npz.name}
        atomic_write_json(js, meta)
        self.meta = meta
        return npz, js


def calibration_paths(path: str | os.PathLike) -> tuple[Path, Path]:
    """``(<stem>.npz, <stem>.json)`` for a calibration set path given with or without a suffix."""
    p = Path(path)
    if p.suffix in (".npz", ".json"):
        p = p.with_suffix("")
    return p.with_name(p.name + ".npz"), p.with_name(p.name + ".json")


def _names(batch: dict) -> list[str]:
    """The graph inputs a batch holds, in the graph's order (a set of three inputs hashes as before)."""
    return [name for name in INPUT_DTYPES if name in batch]


def arrays_sha256(batches: Sequence[dict[str, np.ndarray]]) -> str:
    """Content hash of encoded batches (name, dtype, shape, C-order bytes), container-independent."""
    h = hashlib.sha256()
    for b, batch in enumerate(batches):
        for name in _names(batch):
            a = np.ascontiguousarray(batch[name])
            h.update(f"{b}/{name}/{a.dtype.str}/{a.shape}".encode())
            h.update(a.tobytes())
    return h.hexdigest()


def _expected_shape(name: str, sh: dict) -> tuple[int, ...]:
    """The shape of graph input ``name`` in a batch of ``sh`` (``{batch, seq, items}``)."""
    if name == "input_ids":
        return (sh["batch"], sh["seq"])
    if name == "context_positions":
        return (sh["batch"],)
    return (sh["batch"], sh["items"])


def load_calibration_set(path: str | os.PathLike) -> CalibrationSet:
    """Load a set written by :meth:`CalibrationSet.save` and verify its content hash.

    Every array's ``.npy`` header is checked against the batch shapes of the ``.json`` (and a 1 GiB bound)
    BEFORE it is decompressed (:class:`hllm.formats.npz.CheckedNpz`), so a small file declaring a huge
    array is refused without the memory; the content hash is checked after.

    Raises:
        SlateError: a file is missing or unreadable, an array's shape differs from the ``.json``, or the
            arrays do not match ``data_sha256``.
    """
    npz, js = calibration_paths(path)
    for p in (npz, js):
        if not p.is_file():
            given = Path(path)
            what = (f"; {given} is not one (a JSONL of slates is --calib-slates)" if given.is_file()
                    and given.suffix not in (".npz", ".json") else "")
            raise SlateError(f"calibration set not found: {p} is missing (a saved set is a pair {npz.name} + "
                             f"{js.name}, given as STEM, STEM.npz or STEM.json){what}")
    meta = read_json(js, SlateError)
    if not isinstance(meta, dict):
        raise SlateError(f"{js}: expected a JSON object, got {type(meta).__name__}")
    if meta.get("format") != FORMAT:
        raise SlateError(f"{js}: not a calibration set (format {meta.get('format')!r}, expected {FORMAT!r})")
    shapes = meta.get("shapes")
    if not isinstance(shapes, list) or not all(
            isinstance(sh, dict) and all(type(sh.get(k)) is int and sh[k] >= 0 for k in ("batch", "seq", "items"))
            for sh in shapes):
        raise SlateError(f"{js}: shapes must be a list of {{batch, seq, items}} integers")
    try:
        names = declared_inputs(meta.get("inputs") or INPUT_NAMES)
    except HllmError as e:
        raise SlateError(f"{js}: {e}") from None
    with CheckedNpz(npz, SlateError) as z:  # each member's header is checked against shapes before it is read
        batches = [{name: z.get(f"{name}/{b}", _expected_shape(name, sh)) for name in names}
                   for b, sh in enumerate(shapes)]
    got = arrays_sha256(batches)
    if meta.get("data_sha256") and got != meta["data_sha256"]:
        raise SlateError(f"{npz}: arrays do not match data_sha256 in {js.name} (file changed or corrupt)")
    return CalibrationSet(batches, meta)
