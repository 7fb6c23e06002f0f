"""Training state on disk without pickle: tensors in safetensors, the rest in JSON.

``training_state.safetensors``: ``param/<name>`` (trainable tensors) and ``opt/<i>/<key>`` (the
optimizer's per-parameter state, e.g. AdamW ``step``, ``exp_avg``, ``exp_avg_sq``).
``training_state.json``: step, losses, the run's config, the optimizer's ``param_groups``, the
validation curve, ``train_s`` (seconds spent in optimizer steps, summed over every resumed run:
what ``hllm train-status`` divides by the steps done for its ETA) and ``runs`` (how each run computed:
``{from_step, precision, device}``, one per start or resume). :func:`read_state_json` is the one typed
reader of that file (``hllm train --resume`` and ``hllm train-status`` share it); it imports no torch.
Loading reads no Python objects from the files (``torch.load`` of a crafted pickle
would run code: safetensors and JSON cannot), so ``hllm train --resume`` on a checkpoint from elsewhere
is safe.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from hllm.errors import CheckpointError
from hllm.files import atomic_path, atomic_write_json
from hllm.reading import read_json

STATE_TENSORS = "training_state.safetensors"
STATE_JSON = "training_state.json"
#: Largest JSON sidecar (``training_state.json``, ``hllm.json``, a cache's ``meta.json``) read, bytes:
#: a million steps of losses take ≈ 20 MB; a bigger file is refused before it is read (bounded memory).
MAX_JSON_BYTES = 64 << 20
#: Largest step / planned steps accepted in a saved state (a billion optimizer steps).
MAX_STEP = 10**9
#: Largest ``train_s`` accepted, seconds (≈ 317 years): beyond it the file is corrupt, not slow.
MAX_TRAIN_S = 1e10


@dataclass
class TrainingState:
    """What a resumed run continues from: step, per-step losses, the saved config dict, validation
    records, ``train_s`` (training seconds so far, all runs together; 0 in a state written before it was
    recorded); the tensors are copied into the model and optimizer by :func:`load_state`."""

    step: int
    losses: list[float]
    config: dict
    validation: list[dict] = field(default_factory=list)
    train_s: float = 0.0
    runs: list[dict] = field(default_factory=list)
    param_groups: list | None = None


def read_json_capped(path: str | os.PathLike) -> dict:
    """The JSON object in ``path`` read strictly (:func:`hllm.reading.read_json`: duplicate keys refused),
    after checking it is a regular file of at most :data:`MAX_JSON_BYTES` bytes.

    Raises: CheckpointError ``<path>: ...`` when it is missing, not a regular file, too big, unreadable,
        not JSON or not a JSON object.
    """
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as e:
        raise CheckpointError(f"{p}: cannot read ({e.strerror or e})") from None
    if not p.is_file():
        raise CheckpointError(f"{p}: not a regular file")
    if size > MAX_JSON_BYTES:
        raise CheckpointError(f"{p}: {size:,} bytes, over the {MAX_JSON_BYTES >> 20} MiB limit of a JSON sidecar")
    data = read_json(p, CheckpointError, "{path}: unreadable ({reason})")
    if not isinstance(data, dict):
        raise CheckpointError(f"{p}: malformed (not a JSON object)")
    return data


def _int(v, name: str, lo: int = 0, hi: int = MAX_STEP) -> int:
    if type(v) is not int or not lo <= v <= hi:  # bool, float, str: refused, never coerced
        raise ValueError(f"{name} must be an integer in [{lo}, {hi:,}], got {v!r}")
    return v


def _finite(v) -> bool:
    """``v`` is a JSON number a float holds finitely: a finite float, or an int within the float range (an int
    past it, ``1e400`` written out, made ``math.isfinite`` raise OverflowError); bools and strings are not."""
    if type(v) is int:
        return -sys.float_info.max <= v <= sys.float_info.max  # exact int / float comparison, no conversion
    return type(v) is float and math.isfinite(v)


def _float(v, name: str, hi: float = math.inf, lo: float = 0.0) -> float:
    if not (_finite(v) and lo <= v <= hi):
        raise ValueError(f"{name} must be a finite number in [{lo:g}, {hi:g}], got {v!r}")
    return float(v)


def _choice(v, name: str, choices: tuple) -> str:
    if v not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {v!r}")
    return v


def read_state_json(path: str | os.PathLike) -> TrainingState:
    """The validated content of a ``training_state.json`` (no tensors; ``param_groups`` as saved).

    Checks: ``step`` an integer in [0, :data:`MAX_STEP`] equal to the number of ``losses`` (finite
    numbers); ``config`` an object whose ``steps`` is in [1, MAX_STEP], ``batch_size`` / ``accum``
    ≥ 1, ``precision`` / ``device`` among :data:`hllm.training.precision.PRECISIONS` / ``DEVICES``;
    ``validation`` a list of objects with an integer ``step``; ``train_s`` finite in [0,
    :data:`MAX_TRAIN_S`] seconds; ``runs`` a list of ``{from_step, precision, device}``; ``param_groups``
    a list of objects. Integers must be JSON integers (``5.0``, ``"5"``, ``true`` are refused).
    Raises: CheckpointError ``<path>: malformed (...)`` naming the first bad field (or from
        :func:`read_json_capped`).
    """
    from hllm.training.precision import DEVICES, PRECISIONS

    p = Path(path)
    meta = read_json_capped(p)
    try:
        step = _int(meta.get("step"), "step")
        losses = meta.get("losses")
        if not isinstance(losses, list) or len(losses) != step:
            raise ValueError(f"losses must be a list of one loss per step ({step}), got "
                             f"{len(losses) if isinstance(losses, list) else type(losses).__name__}")
        losses = [_float(x, "a loss", lo=-math.inf) for x in losses]
        cfg = meta.get("config")
        if not isinstance(cfg, dict):
            raise ValueError(f"config must be an object, got {type(cfg).__name__}")
        _int(cfg.get("steps"), "config.steps", 1)
        for k in ("batch_size", "accum"):
            _int(cfg.get(k, 1), f"config.{k}", 1)
        _choice(cfg.get("precision", "fp32"), "config.precision", PRECISIONS)
        _choice(cfg.get("device", "auto"), "config.device", DEVICES)
        val = meta.get("validation", [])
        if not isinstance(val, list) or not all(isinstance(r, dict) for r in val):
            raise ValueError("validation must be a list of objects")
        for r in val:
            _int(r.get("step"), "validation[].step")
        train_s = _float(meta.get("train_s", 0.0), "train_s", MAX_TRAIN_S)
        runs = meta.get("runs", [])
        if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
            raise ValueError("runs must be a list of objects")
        for r in runs:
            _int(r.get("from_step"), "runs[].from_step")
            _choice(r.get("precision"), "runs[].precision", ("fp32", "bf16"))
            _choice(r.get("device"), "runs[].device", ("cpu", "cuda"))
        groups = meta.get("param_groups")
        if groups is not None and (not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups)):
            raise ValueError("param_groups must be a list of objects")
    except ValueError as e:
        raise CheckpointError(f"{p}: malformed ({e})") from None
    return TrainingState(step, losses, dict(cfg), val, train_s, runs, groups)


def save_state(directory: Path, state: TrainingState, params: dict[str, torch.nn.Parameter],
               optimizer: torch.optim.Optimizer) -> None:
    """Write both files into ``directory`` (each atomically)."""
    import torch
    from safetensors.torch import save_file

    sd = optimizer.state_dict()
    tensors = {f"param/{n}": p.detach().contiguous() for n, p in params.items()}
    for idx, st in sd["state"].items():
        for k, v in st.items():
            tensors[f"opt/{idx}/{k}"] = (v if torch.is_tensor(v) else torch.tensor(v)).detach().contiguous()
    with atomic_path(Path(directory) / STATE_TENSORS) as tmp:
        save_file(tensors, str(tmp))
    atomic_write_json(Path(directory) / STATE_JSON, {
        "step": state.step, "losses": state.losses, "config": state.config, "validation": state.validation,
        "train_s": round(state.train_s, 3), "runs": state.runs, "param_groups": sd["param_groups"],
    })


def load_state(directory: Path, params: dict[str, torch.nn.Parameter] | None = None,
               optimizer: torch.optim.Optimizer | None = None) -> TrainingState:
    """Read the state of ``directory``; with ``params`` / ``optimizer``, copy the tensors into them.

    Raises: CheckpointError when a file is missing, unreadable, malformed (:func:`read_state_json`), or
        does not fit the model (a parameter missing or of another shape).
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    d = Path(directory)
    js, ts = d / STATE_JSON, d / STATE_TENSORS
    if not js.is_file() or not ts.is_file():
        raise CheckpointError(f"cannot resume: {js.name} / {ts.name} not found in {d}")
    state = read_state_json(js)
    try:
        tensors = load_file(str(ts)) if params is not None else {}
    except (OSError, ValueError, KeyError, TypeError, SafetensorError) as e:
        raise CheckpointError(f"cannot resume from {d}: unreadable training state ({type(e).__name__}: {e})") from None
    if params is not None:
        _copy_params(tensors, params, d)
    if optimizer is not None:
        _load_optimizer(tensors, state.param_groups, optimizer, d)
    return state


def _copy_params(tensors: dict, params: dict, d: Path) -> None:
    import torch

    with torch.no_grad():
        for n, p in params.items():
            t = tensors.get(f"param/{n}")
            if t is None or t.shape != p.shape:
                raise CheckpointError(f"cannot resume from {d}: trainable tensor {n} missing or of another shape")
            p.copy_(t)


def _load_optimizer(tensors: dict, groups, optimizer: torch.optim.Optimizer, d: Path) -> None:
    """Hand the saved optimizer state to ``optimizer`` after checking it fits (:func:`check_optimizer_state`).

    Raises: CheckpointError ``<d>/training_state.json: malformed (...)`` naming the bad field, or ``cannot resume``
        when torch still refuses it.
    """
    try:
        state = check_optimizer_state(tensors, groups, optimizer)
    except ValueError as e:
        raise CheckpointError(f"{d / STATE_JSON}: malformed ({e})") from None
    try:
        optimizer.load_state_dict({"state": state, "param_groups": groups})
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"cannot resume from {d}: optimizer state does not fit ({e})") from None


#: ``param_groups`` fields that are non-negative numbers (AdamW refuses negative ones when it is built, not
#: when a state is loaded) and those that are lists of numbers in [0, 1).
_NON_NEGATIVE = ("lr", "eps", "weight_decay")
_UNIT = ("betas",)
#: ``param_groups`` fields checked above (``params``) or set before every step (the learning rate); every other field
#: (``betas``, ``eps``, ``weight_decay``, ``amsgrad``, ``maximize``, ``capturable``...) must equal the value of the
#: optimizer built for the resumed run, whose options equal the saved run's.
_PER_STEP = ("params", "lr")


def _plain(v):
    """``v`` with tuples as lists (torch keeps ``betas`` as a tuple, JSON gives a list)."""
    return list(v) if isinstance(v, tuple) else v


def check_optimizer_state(tensors: dict, groups, optimizer: torch.optim.Optimizer) -> dict[int, dict]:
    """The per-parameter state of ``tensors`` (``opt/<i>/<key>``) by parameter index, after checking it and
    ``groups`` (the saved ``param_groups``) against ``optimizer`` (built for this run, not yet stepped).

    ``torch.optim.Optimizer.load_state_dict`` checks only the number of groups and parameters; a corrupt
    ``betas: "x"``, a duplicated ``params`` entry or a moment of another shape failed later, in the first
    step. Checked here: as many groups as the optimizer; each group's ``params`` exactly the optimizer's
    indices; no field the optimizer does not have (a missing one keeps torch's default); each field of the
    type of the optimizer's value (booleans, finite numbers — ``lr``, ``eps``, ``weight_decay`` ≥ 0 —,
    lists of as many numbers — ``betas`` in [0, 1) —, null or a boolean where the optimizer has null) and,
    but ``lr`` (set before every step), equal to it: ``load_state_dict`` replaces the group's settings with the
    saved ones, so a saved ``amsgrad: true`` failed in the first step (its moment is missing), ``capturable``
    on the CPU too, and ``maximize``, ``eps``, ``weight_decay`` or ``betas`` silently changed the run;
    tensor keys ``opt/<index>/<name>`` with an index of a parameter, ``step`` one finite number ≥ 0 and the
    other tensors (moments) floating point of the parameter's shape.
    Raises: ValueError naming the field.
    """
    import torch

    current = optimizer.state_dict()["param_groups"]
    if not isinstance(groups, list) or len(groups) != len(current):
        raise ValueError(f"param_groups must list {len(current)} group(s) for this model, got "
                         f"{len(groups) if isinstance(groups, list) else type(groups).__name__}")
    for g, (saved, now) in enumerate(zip(groups, current)):
        where = f"param_groups[{g}]"
        if not isinstance(saved, dict):
            raise ValueError(f"{where} must be an object")
        if saved.get("params") != now["params"]:
            raise ValueError(f"{where}.params must be the parameter indices {_short(now['params'])}, got "
                             f"{_short(saved.get('params'))}")
        unknown = sorted(set(saved) - set(now))
        if unknown:
            raise ValueError(f"{where} has fields this optimizer does not have: {unknown[:5]}")
        for k, v in saved.items():
            if k != "params":
                _check_field(v, now[k], f"{where}.{k}", k)
            if k not in _PER_STEP and _plain(v) != _plain(now[k]):  # load_state_dict would replace the run's
                raise ValueError(f"{where}.{k} is {_plain(v)!r}, but this run's optimizer has {_plain(now[k])!r} "
                                 "(a resumed run keeps its options)")
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state: dict[int, dict] = {}
    for key, t in tensors.items():
        if not key.startswith("opt/"):
            continue
        _, idx, name = (key.split("/", 2) + ["", ""])[:3]
        if not (idx.isascii() and idx.isdigit()) or int(idx) >= len(params) or not name:
            raise ValueError(f"optimizer tensor {key!r} names no parameter (indices 0..{len(params) - 1})")
        p = params[int(idx)]
        if name == "step":
            if t.numel() != 1 or not bool(torch.isfinite(t).all()) or float(t.reshape(())) < 0:
                raise ValueError(f"optimizer tensor {key} must be one finite number ≥ 0")
        elif t.shape != p.shape or not t.is_floating_point():
            raise ValueError(f"optimizer tensor {key} must be floating point of the parameter's shape "
                             f"{list(p.shape)}, got {t.dtype} {list(t.shape)}")
        state.setdefault(int(idx), {})[name] = t
    return state


def _check_field(v, now, name: str, key: str) -> None:
    """One ``param_groups`` field against the optimizer's value ``now`` (its type is the rule)."""
    if isinstance(now, bool) or now is None:
        if not (isinstance(v, bool) or (now is None and v is None)):
            raise ValueError(f"{name} must be {'true or false' if now is not None else 'null, true or false'}, got {_short(v)}")
    elif isinstance(now, (int, float)):
        if not _finite(v) or (key in _NON_NEGATIVE and v < 0):
            raise ValueError(f"{name} must be a finite number{' ≥ 0' if key in _NON_NEGATIVE else ''}, got {_short(v)}")
    elif isinstance(now, (list, tuple)):
        if not isinstance(v, list) or len(v) != len(now) or not all(
                _finite(x) and (key not in _UNIT or 0 <= x < 1) for x in v):
            raise ValueError(f"{name} must be a list of {len(now)} finite numbers"
                             f"{' in [0, 1)' if key in _UNIT else ''}, got {_short(v)}")
    elif type(v) is not type(now):
        raise ValueError(f"{name} must be a {type(now).__name__}, got {_short(v)}")


def _short(v) -> str:
    """``repr(v)`` cut to 80 characters (a corrupt field can be huge)."""
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."
