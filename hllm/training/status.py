"""Progress of a long training job, read from its files alone (``hllm train-status``): no torch, no
process to ask, so it works while the job runs, after it stopped, and from another shell.

* A feature cache (:mod:`hllm.training.features`): slates done = its ``NNNNN.npz`` files, total = the
  slate ids of ``meta.json`` (finished) or ``partial.json`` (unfinished); seconds per slate = the median
  gap between consecutive file modification times (the median ignores the pauses between runs).
* A training checkpoint (:mod:`hllm.training.state`): step and planned steps of ``training_state.json``,
  slates seen = step × batch size × accumulation; seconds per step = its ``train_s`` (training time of
  every run together) / step.

ETA = seconds per unit × units left, assuming the rate holds (same machine, same load).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

from hllm.errors import CheckpointError

CACHE_META, CACHE_PARTIAL = "meta.json", "partial.json"
STATE_JSON = "training_state.json"


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: unreadable ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    return data


def cache_status(root: str | os.PathLike, now: float | None = None) -> dict:
    """Progress of a (finished or unfinished) feature cache directory.

    Returns: ``{path, complete, layer, precision, slates_done, slates_total, s_per_slate,
    slates_per_hour, eta_s, last_write_age_s}`` (rates None with fewer than 2 slate files; seconds).
    Raises: CheckpointError when ``root`` holds neither ``meta.json`` nor ``partial.json`` or they are
        unreadable.
    """
    root = Path(root)
    meta_path = root / CACHE_META if (root / CACHE_META).is_file() else root / CACHE_PARTIAL
    if not meta_path.is_file():
        raise CheckpointError(f"{root} is not a feature cache (no {CACHE_META} or {CACHE_PARTIAL})")
    meta = _read(meta_path)
    ids = meta.get("slate_ids")
    total = len(ids) if isinstance(ids, list) else None
    times = sorted(p.stat().st_mtime for p in root.glob("[0-9][0-9][0-9][0-9][0-9].npz"))
    gaps = [b - a for a, b in zip(times, times[1:])]
    rate = statistics.median(gaps) if gaps else None
    done = len(times)
    left = max(0, total - done) if total is not None else None
    now = time.time() if now is None else now
    return {"path": str(root), "complete": meta_path.name == CACHE_META, "layer": meta.get("layer"),
            "precision": meta.get("precision", "fp32"), "slates_done": done, "slates_total": total,
            "s_per_slate": None if rate is None else round(rate, 3),
            "slates_per_hour": None if not rate else round(3600 / rate, 1),
            "eta_s": None if rate is None or left is None else round(rate * left),
            "last_write_age_s": round(now - times[-1]) if times else None}


def training_status(ckpt: str | os.PathLike) -> dict:
    """Progress of a training run from its checkpoint directory's ``training_state.json``.

    Returns: ``{path, step, steps, slates_per_step, slates_seen, slates_planned, train_slates, epochs,
    train_s, s_per_step, slates_per_hour, eta_s, loss_last10, validation_last, precision}`` (rates None
    when no training time is recorded; ``train_slates`` from the manifest's provenance, None before the
    first save).
    Raises: CheckpointError when the file is missing or unreadable.
    """
    d = Path(ckpt)
    if not (d / STATE_JSON).is_file():
        raise CheckpointError(f"{d}: no {STATE_JSON} (not a training checkpoint, or no step saved yet)")
    st = _read(d / STATE_JSON)
    cfg = st.get("config") if isinstance(st.get("config"), dict) else {}
    try:
        step, steps = int(st["step"]), int(cfg["steps"])
        per = int(cfg.get("batch_size", 1)) * int(cfg.get("accum", 1))
        losses = [float(x) for x in st.get("losses") or []]
        train_s = float(st.get("train_s") or 0.0)
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{d / STATE_JSON}: malformed ({type(e).__name__}: {e})") from None
    prov = {}
    if (d / "hllm.json").is_file():
        prov = _read(d / "hllm.json").get("provenance") or {}
    n_train = prov.get("train_slates")
    rate = train_s / step if step and train_s else None
    val = st.get("validation") or []
    tail = losses[-10:]
    return {"path": str(d), "step": step, "steps": steps, "slates_per_step": per, "slates_seen": step * per,
            "slates_planned": steps * per, "train_slates": n_train,
            "epochs": round(step * per / n_train, 3) if n_train else None,
            "train_s": round(train_s, 1), "s_per_step": None if rate is None else round(rate, 3),
            "slates_per_hour": None if rate is None else round(3600 * per / rate, 1),
            "eta_s": None if rate is None else round(rate * max(0, steps - step)),
            "loss_last10": round(sum(tail) / len(tail), 4) if tail else None,
            "validation_last": val[-1] if val else None,
            "precision": (prov.get("compute") or {}).get("precision", cfg.get("precision", "fp32"))}


def hours(seconds: float | None) -> str:
    """``seconds`` as a short human duration (``42 s``, ``12.5 min``, ``3.2 h``; ``?`` for None)."""
    if seconds is None:
        return "?"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
