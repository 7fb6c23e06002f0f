"""Training state on disk without pickle: tensors in safetensors, the rest in JSON.

``training_state.safetensors``: ``param/<name>`` (trainable tensors) and ``opt/<i>/<key>`` (the
optimizer's per-parameter state, e.g. AdamW ``step``, ``exp_avg``, ``exp_avg_sq``).
``training_state.json``: step, losses, the run's config, the optimizer's ``param_groups``, the
validation curve and ``train_s`` (seconds spent in optimizer steps, summed over every resumed run:
what ``hllm train-status`` divides by the steps done for its ETA). Loading reads no Python objects from the files (``torch.load`` of a crafted pickle
would run code: safetensors and JSON cannot), so ``hllm train --resume`` on a checkpoint from elsewhere
is safe.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from hllm.errors import CheckpointError
from hllm.files import atomic_path, atomic_write_json

STATE_TENSORS = "training_state.safetensors"
STATE_JSON = "training_state.json"


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


def save_state(directory: Path, state: TrainingState, params: dict[str, torch.nn.Parameter],
               optimizer: torch.optim.Optimizer) -> None:
    """Write both files into ``directory`` (each atomically)."""
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
        "train_s": round(state.train_s, 3), "param_groups": sd["param_groups"],
    })


def load_state(directory: Path, params: dict[str, torch.nn.Parameter] | None = None,
               optimizer: torch.optim.Optimizer | None = None) -> TrainingState:
    """Read the state of ``directory``; with ``params`` / ``optimizer``, copy the tensors into them.

    Raises: CheckpointError when a file is missing, unreadable, or does not fit the model (a parameter
        missing or of another shape).
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    d = Path(directory)
    js, ts = d / STATE_JSON, d / STATE_TENSORS
    if not js.is_file() or not ts.is_file():
        raise CheckpointError(f"cannot resume: {js.name} / {ts.name} not found in {d}")
    try:
        meta = json.loads(js.read_text(encoding="utf-8"))
        state = TrainingState(int(meta["step"]), [float(x) for x in meta["losses"]], dict(meta["config"]),
                              list(meta.get("validation") or []), float(meta.get("train_s") or 0.0))
        tensors = load_file(str(ts)) if params is not None else {}
    except (OSError, ValueError, KeyError, TypeError, SafetensorError) as e:
        raise CheckpointError(f"cannot resume from {d}: unreadable training state ({type(e).__name__}: {e})") from None
    if params is not None:
        _copy_params(tensors, params, d)
    if optimizer is not None:
        _load_optimizer(tensors, meta.get("param_groups"), optimizer, d)
    return state


def _copy_params(tensors: dict, params: dict, d: Path) -> None:
    with torch.no_grad():
        for n, p in params.items():
            t = tensors.get(f"param/{n}")
            if t is None or t.shape != p.shape:
                raise CheckpointError(f"cannot resume from {d}: trainable tensor {n} missing or of another shape")
            p.copy_(t)


def _load_optimizer(tensors: dict, groups, optimizer: torch.optim.Optimizer, d: Path) -> None:
    state: dict[int, dict] = {}
    for key, t in tensors.items():
        if key.startswith("opt/"):
            _, idx, name = key.split("/", 2)
            state.setdefault(int(idx), {})[name] = t
    try:
        optimizer.load_state_dict({"state": state, "param_groups": groups})
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"cannot resume from {d}: optimizer state does not fit ({e})") from None
