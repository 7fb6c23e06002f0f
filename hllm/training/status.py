"""Progress of a long training job, read from its files alone (``hllm train-status``): no torch, no
process to ask, so it works while the job runs, after it stopped, and from another shell.

* A feature cache (:mod:`hllm.training.features`): slates done = its ``NNNNN.npz`` files, total = the
  slate ids of ``meta.json`` (finished) or ``partial.json`` (unfinished); seconds per slate = the median
  gap between consecutive file modification times (the median ignores the pauses between runs).
* A training checkpoint (:mod:`hllm.training.state`): step and planned steps of ``training_state.json``,
  slates seen = step × batch size × accumulation; seconds per step = its ``train_s`` (training time of
  every run together) / step.

ETA = seconds per unit × units left, assuming the rate holds (same machine, same load).
Every JSON file is read strictly and size-capped (:func:`hllm.training.state.read_json_capped`), the
training state through the same typed reader as ``hllm train --resume``
(:func:`hllm.training.state.read_state_json`); a malformed one raises CheckpointError naming the file.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from hllm.errors import CheckpointError
from hllm.training.state import MAX_STEP, STATE_JSON, read_json_capped, read_state_json

CACHE_META, CACHE_PARTIAL = "meta.json", "partial.json"
_read = read_json_capped


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError as e:  # a dangling symbolic link, a link loop, a file removed meanwhile
        raise CheckpointError(f"{p}: cannot read ({e.strerror or e})") from None


def cache_status(root: str | os.PathLike, now: float | None = None) -> dict:
    """Progress of a (finished or unfinished) feature cache directory.

    Returns: ``{path, complete, layer, precision, slates_done, slates_total, s_per_slate,
    slates_per_hour, eta_s, last_write_age_s}`` (rates None with fewer than 2 slate files; seconds;
    ``complete`` only with ``meta.json`` and every slate file present; an age in the future, a clock
    skew, is None).
    Raises: CheckpointError when ``root`` holds neither ``meta.json`` nor ``partial.json``, they are
        unreadable or malformed, or a slate file cannot be read (e.g. a dangling symbolic link).
    """
    root = Path(root)
    meta_path = root / CACHE_META if (root / CACHE_META).is_file() else root / CACHE_PARTIAL
    if not meta_path.is_file():
        raise CheckpointError(f"{root} is not a feature cache (no {CACHE_META} or {CACHE_PARTIAL})")
    meta = _read(meta_path)
    ids, layer, prec = meta.get("slate_ids"), meta.get("layer"), meta.get("precision", "fp32")
    if (ids is not None and not isinstance(ids, list)) or (layer is not None and type(layer) is not int) \
            or (isinstance(layer, int) and layer < 0) or not isinstance(prec, str):
        raise CheckpointError(f"{meta_path}: malformed (slate_ids must be a list, layer an integer ≥ 0, "
                              f"precision a string)")
    total = len(ids) if isinstance(ids, list) else None
    times = sorted(_mtime(p) for p in root.glob("[0-9][0-9][0-9][0-9][0-9].npz"))
    gaps = [b - a for a, b in zip(times, times[1:])]
    rate = statistics.median(gaps) if gaps else None
    done = len(times)
    left = max(0, total - done) if total is not None else None
    now = time.time() if now is None else now
    age = now - times[-1] if times else None
    return {"path": str(root), "complete": meta_path.name == CACHE_META and total is not None and done >= total,
            "layer": layer, "precision": prec, "slates_done": done, "slates_total": total,
            "s_per_slate": None if rate is None else round(rate, 3),
            "slates_per_hour": None if not rate else round(3600 / rate, 1),
            "eta_s": None if rate is None or left is None else round(rate * left),
            "last_write_age_s": None if age is None or age < 0 else round(age)}


def training_status(ckpt: str | os.PathLike) -> dict:
    """Progress of a training run from its checkpoint directory's ``training_state.json``.

    Returns: ``{path, step, steps, slates_per_step, slates_seen, slates_planned, train_slates, epochs,
    train_s, s_per_step, slates_per_hour, eta_s, loss_last10, validation_last, precision, runs}`` (rates
    None when no training time is recorded; ``train_slates`` from the manifest's provenance, None before
    the first save; ``precision`` ``mixed (...)`` when resumed runs computed in different precisions,
    ``runs`` each run's ``{from_step, precision, device}``).
    Raises: CheckpointError when the file is missing, unreadable or malformed, or ``hllm.json``'s
        provenance is.
    """
    d = Path(ckpt)
    if not (d / STATE_JSON).is_file():
        raise CheckpointError(f"{d}: no {STATE_JSON} (not a training checkpoint, or no step saved yet)")
    st = read_state_json(d / STATE_JSON)
    cfg, step, losses, train_s, val = st.config, st.step, st.losses, st.train_s, st.validation
    steps, per = cfg["steps"], cfg.get("batch_size", 1) * cfg.get("accum", 1)
    prov = read_provenance(d / "hllm.json") if (d / "hllm.json").exists() else {}
    n_train = prov.get("train_slates")
    rate = train_s / step if step and train_s else None
    tail = losses[-10:]
    return {"path": str(d), "step": step, "steps": steps, "slates_per_step": per, "slates_seen": step * per,
            "slates_planned": steps * per, "train_slates": n_train,
            "epochs": round(step * per / n_train, 3) if n_train else None,
            "train_s": round(train_s, 1), "s_per_step": None if rate is None else round(rate, 3),
            "slates_per_hour": None if rate is None else round(3600 * per / rate, 1),
            "eta_s": None if rate is None else round(rate * max(0, steps - step)),
            "loss_last10": round(sum(tail) / len(tail), 4) if tail else None,
            "validation_last": val[-1] if val else None,
            "precision": _precision(st.runs, prov, cfg), "runs": st.runs}


def read_provenance(path: Path) -> dict:
    """The ``provenance`` object of a checkpoint's ``hllm.json``, its fields used here type-checked."""
    prov = _read(path).get("provenance", {})
    bad = None
    if not isinstance(prov, dict):
        bad = "provenance must be an object"
    elif not (prov.get("train_slates") is None or (type(prov["train_slates"]) is int
                                                   and 0 <= prov["train_slates"] <= MAX_STEP)):
        bad = f"provenance.train_slates must be an integer ≥ 0, got {prov['train_slates']!r}"
    elif not isinstance(prov.get("compute", {}), dict) or not isinstance(prov.get("compute", {}).get("precision", ""), str):
        bad = "provenance.compute must be an object with a string precision"
    if bad:
        raise CheckpointError(f"{path}: malformed ({bad})")
    return prov


def _precision(runs: list[dict], prov: dict, cfg: dict) -> str:
    """The precision the run trained in: one name, or ``mixed (fp32 from step 0, bf16 from step 40)``."""
    if len({r["precision"] for r in runs}) > 1:
        return "mixed (" + ", ".join(f"{r['precision']} from step {r['from_step']}" for r in runs) + ")"
    if runs:
        return runs[0]["precision"]
    return (prov.get("compute") or {}).get("precision", cfg.get("precision", "fp32"))


def hours(seconds: float | None) -> str:
    """``seconds`` as a short human duration (``42 s``, ``12.5 min``, ``3.2 h``; ``?`` for None)."""
    if seconds is None:
        return "?"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
