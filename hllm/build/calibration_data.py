"""Calibration sets: real slates encoded by the runtime's prompt builder, saved for reproducible builds.

Static INT8 / FP8 quantization needs activation ranges, measured by running the FP32 graph on
representative inputs (ONNX Runtime quantization guide,
https://onnxruntime.ai/docs/performance/model-optimizations/quantization.html). For hLLM the
representative input is a real slate, encoded exactly as at serving time: the same
:class:`hllm.runtime.prompt.PromptBuilder`, prompt spec and tokenizer as the exported graph.

A calibration set is ``count`` slates drawn without replacement with ``numpy.random.default_rng(seed)``
from a slates file (e.g. the *train* split), optionally skipping a list of slate ids. It is saved as
two files so a quantized build can be repeated bit for bit:

* ``<name>.npz`` — per batch ``b``: ``input_ids/b [B, S] int64``, ``readout_positions/b [B, N] int64``,
  ``item_mask/b [B, N] bool``;
* ``<name>.json`` — source file and its sha256, seed, count, batch size, the chosen slate ids (in
  order), every batch's shapes, the prompt spec, the tokenizer's sha256 and ``data_sha256`` (a hash of
  the arrays' bytes, independent of the zip container's timestamps).

The fidelity gate (:mod:`hllm.verify.gate`) refuses evaluation slates whose ids appear here.
This module imports numpy only (no torch, no onnxruntime).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from hllm.errors import SlateError
from hllm.files import atomic_path, atomic_write_json, sha256_file

INPUTS = ("input_ids", "readout_positions", "item_mask")
FORMAT = "hllm-calibration/1"


@dataclass
class CalibrationSet:
    """Encoded calibration batches plus the record of how they were chosen.

    Attributes:
        batches: list of dicts ``{"input_ids": [B,S] int64, "readout_positions": [B,N] int64,
            "item_mask": [B,N] bool}`` — the exported graph's three inputs.
        meta: JSON-serialisable record (see module docstring); ``meta["slate_ids"]`` lists the slates.
    """

    batches: list[dict[str, np.ndarray]]
    meta: dict = field(default_factory=dict)

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
        arrays = {f"{name}/{b}": batch[name] for b, batch in enumerate(self.batches) for name in INPUTS}
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


def arrays_sha256(batches: Sequence[dict[str, np.ndarray]]) -> str:
    """Content hash of encoded batches (name, dtype, shape, C-order bytes), container-independent."""
    h = hashlib.sha256()
    for b, batch in enumerate(batches):
        for name in INPUTS:
            a = np.ascontiguousarray(batch[name])
            h.update(f"{b}/{name}/{a.dtype.str}/{a.shape}".encode())
            h.update(a.tobytes())
    return h.hexdigest()


def choose_slates(slates: Sequence[dict], count: int, seed: int, exclude_ids: Sequence[str] = ()) -> list[dict]:
    """Draw ``count`` slates without replacement, reproducibly.

    Args:
        slates: the pool (e.g. the train split), in file order.
        count: how many to draw (≥ 1).
        seed: seed of ``numpy.random.default_rng``; the same pool, count and seed give the same slates.
        exclude_ids: slate ids never to draw (e.g. the evaluation slates of the gate).
    Raises:
        SlateError: count < 1, or fewer than ``count`` eligible slates in the pool.
    """
    if count < 1:
        raise SlateError(f"calibration count must be ≥ 1, got {count}")
    banned = set(map(str, exclude_ids))
    pool = [s for i, s in enumerate(slates) if str(s.get("slate_id", i)) not in banned]
    if len(pool) < count:
        raise SlateError(f"only {len(pool)} eligible slates for a calibration set of {count}")
    idx = np.random.default_rng(seed).choice(len(pool), size=count, replace=False)
    return [pool[int(i)] for i in idx]


def build_calibration_set(
    slates: Sequence[dict],
    builder,
    count: int = 32,
    seed: int = 0,
    batch_size: int = 1,
    exclude_ids: Sequence[str] = (),
    source: str | os.PathLike | None = None,
    tokenizer_path: str | os.PathLike | None = None,
) -> CalibrationSet:
    """Encode a reproducible random draw of real slates with the runtime's prompt builder.

    Args:
        slates: pool of slates (dicts in the JSONL format of :mod:`hllm.runtime.slates`).
        builder: the :class:`hllm.runtime.prompt.PromptBuilder` of the graph to quantize (use the
            export's prompt spec and tokenizer so calibration sees serving-time inputs).
        count, seed, exclude_ids: see :func:`choose_slates`.
        batch_size: slates per calibration batch (right-padded like serving batches).
        source: path of the slates file (recorded with its sha256).
        tokenizer_path: the tokenizer.json used (recorded with its sha256).
    Returns: a :class:`CalibrationSet` (not yet saved).
    Raises: SlateError (see :func:`choose_slates` and ``PromptBuilder.encode``).
    """
    if batch_size < 1:
        raise SlateError(f"calibration batch_size must be ≥ 1, got {batch_size}")
    chosen = choose_slates(slates, count, seed, exclude_ids)
    batches, shapes = [], []
    for i in range(0, len(chosen), batch_size):
        b = builder.encode(chosen[i : i + batch_size])
        batches.append({name: np.ascontiguousarray(arr) for name, arr in b.inputs().items()})
        shapes.append({"batch": int(b.input_ids.shape[0]), "seq": int(b.input_ids.shape[1]),
                       "items": int(b.item_mask.shape[1]), "lengths": b.lengths.tolist()})
    meta = {
        "format": FORMAT,
        "source": None if source is None else str(source),
        "source_sha256": sha256_file(source) if source is not None and Path(source).is_file() else None,
        "seed": int(seed),
        "count": int(count),
        "batch_size": int(batch_size),
        "excluded_ids": len(set(map(str, exclude_ids))),
        "slate_ids": [str(s.get("slate_id", "")) for s in chosen],
        "shapes": shapes,
        "prompt": builder.spec.to_dict(),
        "tokenizer_sha256": sha256_file(tokenizer_path) if tokenizer_path else None,
        "pad_id": int(builder.pad_id),
        "data_sha256": arrays_sha256(batches),
    }
    return CalibrationSet(batches, meta)


def load_calibration_set(path: str | os.PathLike) -> CalibrationSet:
    """Load a set written by :meth:`CalibrationSet.save` and verify its content hash.

    Raises:
        SlateError: a file is missing or unreadable, or the arrays do not match ``data_sha256``.
    """
    npz, js = calibration_paths(path)
    for p in (npz, js):
        if not p.is_file():
            raise SlateError(f"calibration file not found: {p}")
    try:
        meta = json.loads(js.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise SlateError(f"cannot read {js}: {e}") from None
    if meta.get("format") != FORMAT:
        raise SlateError(f"{js}: not a calibration set (format {meta.get('format')!r}, expected {FORMAT!r})")
    try:
        with np.load(npz, allow_pickle=False) as z:
            n = len(meta["shapes"])
            batches = [{name: z[f"{name}/{b}"] for name in INPUTS} for b in range(n)]
    except (OSError, KeyError, ValueError) as e:
        raise SlateError(f"cannot read {npz}: {e}") from None
    got = arrays_sha256(batches)
    if meta.get("data_sha256") and got != meta["data_sha256"]:
        raise SlateError(f"{npz}: arrays do not match data_sha256 in {js.name} (file changed or corrupt)")
    return CalibrationSet(batches, meta)


def check_disjoint(calibration_ids: Sequence[str], eval_slates: Sequence[dict]) -> None:
    """Refuse to gate on slates that were used for calibration.

    Raises:
        SlateError: naming how many evaluation slate ids are also calibration slate ids (and a few).
    """
    cal = set(map(str, calibration_ids))
    both = sorted({str(s.get("slate_id", "")) for s in eval_slates} & cal)
    if both:
        raise SlateError(
            f"{len(both)} evaluation slate(s) were used for calibration (e.g. {both[:3]}); "
            "gate on held-out slates (calibrate on the train split, gate on eval)"
        )
