"""The one engine interface every backend implements (Polygraphy-runner style), torch-free.

An engine maps the graph inputs (:mod:`hllm.formats.graph`) to the score matrix:

    input_ids          [B, S] int64   right-padded token ids
    readout_positions  [B, N] int64   index into S of each candidate's last token
    item_mask          [B, N] bool    True for real candidates
    context_positions  [B]    int64   only when the head reads the user context (:attr:`Engine.context`):
                                      index into S of the last user-context token
    → scores           [B, N, K] float32   item × rank-position score matrix (rows of masked items are 0)

Construction is cheap (no file is read); :meth:`Engine.activate` loads, :meth:`Engine.deactivate`
frees. Engines are context managers. ``run`` validates its inputs and checks its own output for
shape, dtype and NaN/Inf (non-finite values are reported by :func:`hllm.runtime.decode.decode`).
"""

from __future__ import annotations

import abc
import numpy as np

from hllm.errors import EngineError, ShapeError
from hllm.formats.precision import Precision
from hllm.formats.graph import CONTEXT_INPUT, INPUT_NAMES, OUTPUT_NAME, TensorSpec, feed_dict, graph_io_specs

def check_inputs(input_ids: np.ndarray, readout_positions: np.ndarray, item_mask: np.ndarray) -> None:
    """Validate engine inputs; raises ShapeError naming the offending array.

    Checks: ranks and dtypes above; equal B; equal N; readout positions inside ``[0, S)``.
    """
    for name, arr, dt in (
        ("input_ids", input_ids, np.int64),
        ("readout_positions", readout_positions, np.int64),
        ("item_mask", item_mask, np.bool_),
    ):
        if not isinstance(arr, np.ndarray):
            raise ShapeError(f"{name} must be a numpy array, got {type(arr).__name__}")
        if arr.ndim != 2:
            raise ShapeError(f"{name} must be 2-D, got shape {arr.shape}")
        if arr.dtype != dt:
            raise ShapeError(f"{name} must be {np.dtype(dt).name}, got {arr.dtype}")
    if not (input_ids.shape[0] == readout_positions.shape[0] == item_mask.shape[0]):
        raise ShapeError(
            f"batch sizes differ: input_ids {input_ids.shape[0]}, readout_positions "
            f"{readout_positions.shape[0]}, item_mask {item_mask.shape[0]}"
        )
    if readout_positions.shape != item_mask.shape:
        raise ShapeError(f"readout_positions {readout_positions.shape} and item_mask {item_mask.shape} differ")
    s = input_ids.shape[1]
    if readout_positions.size and (readout_positions.min() < 0 or readout_positions.max() >= s):
        raise ShapeError(f"readout_positions must lie in [0, {s}) (the sequence length)")


def check_context(context_positions, batch: int, seq: int) -> None:
    """Validate ``context_positions [B] int64`` in ``[0, S)``; raises ShapeError naming the problem."""
    if not isinstance(context_positions, np.ndarray):
        raise ShapeError("this graph reads the user context: context_positions [B] int64 is required")
    if context_positions.dtype != np.int64 or context_positions.shape != (batch,):
        raise ShapeError(f"context_positions must be int64 of shape ({batch},), got {context_positions.dtype} "
                         f"{context_positions.shape}")
    if batch and (context_positions.min() < 0 or context_positions.max() >= seq):
        raise ShapeError(f"context_positions must lie in [0, {seq}) (the sequence length)")


class Engine(abc.ABC):
    """Base class of every backend. Subclasses implement ``_activate``, ``_deactivate``, ``_run``.

    Attributes:
        name: short backend name (``torch``, ``onnxruntime``, ``tensorrt``).
        num_positions: K, the number of rank positions of the scoring head.
        precision: :class:`hllm.formats.precision.Precision` of the graph it runs (reports say it).
        context: the graph reads the user context (fourth input ``context_positions``).
    """

    name: str = "engine"

    def __init__(self, num_positions: int, precision: Precision = Precision.FP32, context: bool = False):
        self.num_positions = int(num_positions)
        self.precision = Precision.parse(precision)
        self.context = bool(context)
        self._active = False

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def is_active(self) -> bool:
        return self._active

    def activate(self) -> "Engine":
        """Load the model (idempotent). Raises EngineError if it cannot be loaded."""
        if not self._active:
            self._activate()
            self._active = True
        return self

    def deactivate(self) -> None:
        """Free the model (idempotent)."""
        if self._active:
            self._deactivate()
            self._active = False

    def __enter__(self) -> "Engine":
        return self.activate()

    def __exit__(self, *exc) -> None:
        self.deactivate()

    # -- description --------------------------------------------------------------------------
    def inputs(self) -> list[TensorSpec]:
        """Input specs (names, dtypes, dynamic dims)."""
        return graph_io_specs(self.num_positions, self.context)[0]

    def outputs(self) -> list[TensorSpec]:
        """Output specs: one ``scores [batch, items, K] float32``."""
        return graph_io_specs(self.num_positions, self.context)[1]

    # -- inference ------------------------------------------------------------------------------
    def run(self, input_ids: np.ndarray, readout_positions: np.ndarray, item_mask: np.ndarray,
            context_positions: np.ndarray | None = None) -> np.ndarray:
        """Score matrix ``[B, N, K]`` float32 for the inputs (see module docstring).

        ``context_positions [B] int64`` is required by an engine whose graph reads the user context
        (:attr:`context`) and ignored by the others.
        Raises:
            ShapeError: malformed inputs. EngineError: engine not active or backend failure.
        """
        check_inputs(input_ids, readout_positions, item_mask)
        if self.context:
            check_context(context_positions, *input_ids.shape)
        else:
            context_positions = None
        if not self._active:
            raise EngineError(f"{self.name} engine is not active (call activate() or use `with`)")
        out = self._run(input_ids, readout_positions, item_mask, context_positions)
        b, n = item_mask.shape
        if out.shape != (b, n, self.num_positions):
            raise EngineError(f"{self.name} returned scores {out.shape}, expected {(b, n, self.num_positions)}")
        return np.asarray(out, dtype=np.float32)

    def feeds(self, input_ids: np.ndarray, readout_positions: np.ndarray, item_mask: np.ndarray,
              context_positions: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """The graph's feed dict (:func:`hllm.formats.graph.feed_dict` over :meth:`inputs`), for
        backends that feed inputs by name. Raises: ShapeError (an input the graph declares is missing)."""
        return feed_dict(self.inputs(), {"input_ids": input_ids, "readout_positions": readout_positions,
                                         "item_mask": item_mask, CONTEXT_INPUT: context_positions})

    @abc.abstractmethod
    def _activate(self) -> None: ...

    @abc.abstractmethod
    def _deactivate(self) -> None: ...

    @abc.abstractmethod
    def _run(self, input_ids: np.ndarray, readout_positions: np.ndarray, item_mask: np.ndarray,
             context_positions: np.ndarray | None) -> np.ndarray: ...
