"""The hLLM graph's input/output contract: names, dtypes and symbolic shapes (torch-free).

    input_ids          [batch, seq]   int64   right-padded token ids
    readout_positions  [batch, items] int64   index into seq of each candidate's last token
    item_mask          [batch, items] bool    True for real candidates
    context_positions  [batch]        int64   (only for a head with a user-context readout) index into
                                              seq of the last token of the user context
    → scores           [batch, items, K] float32   item × rank-position score matrix

Every engine, exporter, sidecar and the Triton repository take the names from here. The fourth input
exists only in graphs whose head reads the user context (``HeadSpec.context``; an extension of the
paper, see docs/training.md); :func:`input_names` says which inputs a graph has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np

from hllm.errors import ShapeError

#: Bounds of the graph's dynamic dimensions, declared by the exporter (``torch.export.Dim``) and enforced
#: by the CLI's count options: batch ≤ 1024 slates, seq in [2, 65536] tokens, items (N, and K) ≤ 4096.
MAX_BATCH = 1024
MIN_SEQ, MAX_SEQ = 2, 65536
MAX_ITEMS = 4096

INPUT_NAMES = ("input_ids", "readout_positions", "item_mask")
CONTEXT_INPUT = "context_positions"
OUTPUT_NAME = "scores"


def input_names(context: bool = False) -> tuple[str, ...]:
    """The graph's input names, in order: the three base inputs, plus ``context_positions`` when the
    head reads the user context."""
    return (*INPUT_NAMES, CONTEXT_INPUT) if context else INPUT_NAMES


@dataclass(frozen=True)
class TensorSpec:
    """Name, numpy dtype and symbolic shape of one engine input/output.

    ``shape`` holds ints for fixed dims and strings (``"batch"``, ``"seq"``, ``"items"``) for
    dynamic ones. ``max_shape`` optionally bounds the dynamic dims (TensorRT optimization profiles).
    """

    name: str
    dtype: str
    shape: tuple
    max_shape: tuple | None = None

    def to_dict(self) -> dict:
        d = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}
        if self.max_shape is not None:
            d["max_shape"] = list(self.max_shape)
        return d


def sidecar_reads_context(meta: dict) -> bool:
    """Whether a sidecar (``export.json`` or a plan's) lists the ``context_positions`` input."""
    inputs = meta.get("inputs") if isinstance(meta, dict) else None
    return isinstance(inputs, list) and any(isinstance(t, dict) and t.get("name") == CONTEXT_INPUT for t in inputs)


#: numpy dtype and rank of every input a graph may declare (the module docstring's table).
INPUT_DTYPES = {"input_ids": "int64", "readout_positions": "int64", "item_mask": "bool", CONTEXT_INPUT: "int64"}
INPUT_RANKS = {"input_ids": 2, "readout_positions": 2, "item_mask": 2, CONTEXT_INPUT: 1}


def declared_inputs(inputs: bool | Iterable[Any] | Mapping) -> tuple[str, ...]:
    """The input names a graph declares, in order.

    Args:
        inputs: a sidecar dict (``export.json`` / a plan's, read from its ``inputs`` list), a sequence of
            names, of :class:`TensorSpec` or of sidecar ``{"name", "dtype", "shape"}`` dicts, or a bool
            (the head reads the user context: :func:`input_names`).
    Raises: ShapeError for a name that is not an hLLM graph input or a sidecar without an ``inputs`` list.
    """
    if isinstance(inputs, bool):
        return input_names(inputs)
    if isinstance(inputs, Mapping):
        if not isinstance(inputs.get("inputs"), list):
            raise ShapeError("the sidecar lists no graph inputs")
        inputs = inputs["inputs"]
    names = []
    for t in inputs:
        name = t if isinstance(t, str) else t.name if isinstance(t, TensorSpec) else t.get("name") if isinstance(t, dict) else None
        if name not in INPUT_DTYPES:
            raise ShapeError(f"{name!r} is not an hLLM graph input (known: {', '.join(INPUT_DTYPES)})")
        names.append(name)
    return tuple(names)


def feed_dict(inputs: bool | Iterable[Any] | Mapping, batch: Any) -> dict[str, np.ndarray]:
    """The engine feed dict of ``batch`` for a graph that declares ``inputs`` — the one place it is built.

    Args:
        inputs: the graph's declared inputs (see :func:`declared_inputs`: sidecar, names or specs).
        batch: an encoded batch: a mapping ``name → array`` or an object with those attributes
            (:class:`hllm.runtime.prompt.Batch`); it may hold more arrays than the graph reads.
    Returns: ``{name: C-contiguous array}`` in the graph's input order, each of the dtype in
        :data:`INPUT_DTYPES` (``input_ids [B, S] int64``, ``readout_positions [B, N] int64``,
        ``item_mask [B, N] bool``, ``context_positions [B] int64``); integer arrays are widened to int64.
    Raises: ShapeError naming the input: the batch lacks an input the graph declares, an array of
        another rank, a dtype that does not convert without loss, or batch sizes that differ.
    """
    feeds = {}
    for name in declared_inputs(inputs):
        arr = batch.get(name) if isinstance(batch, Mapping) else getattr(batch, name, None)
        if arr is None:
            raise ShapeError(f"the graph reads {name!r} but the batch has none"
                             + (" (encode it with hllm.runtime.prompt.PromptBuilder)" if name == CONTEXT_INPUT else ""))
        arr, want = np.asarray(arr), np.dtype(INPUT_DTYPES[name])
        if arr.dtype != want and not (want.kind == "i" and arr.dtype.kind in "iu" and np.can_cast(arr.dtype, want)):
            raise ShapeError(f"{name} must be {want}, got {arr.dtype}")
        if arr.ndim != INPUT_RANKS[name]:
            raise ShapeError(f"{name} must have {INPUT_RANKS[name]} dims, got shape {arr.shape}")
        feeds[name] = np.ascontiguousarray(arr, dtype=want)
    sizes = {n: a.shape[0] for n, a in feeds.items()}
    if len(set(sizes.values())) > 1:
        raise ShapeError(f"batch sizes differ: {sizes}")
    return feeds


def graph_io_specs(num_positions: int, context: bool = False) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The hLLM graph's input and output specs for a head with K = ``num_positions`` (``context``: the
    head reads the user context, so the graph has a fourth input)."""
    inputs = [
        TensorSpec("input_ids", "int64", ("batch", "seq")),
        TensorSpec("readout_positions", "int64", ("batch", "items")),
        TensorSpec("item_mask", "bool", ("batch", "items")),
    ]
    if context:
        inputs.append(TensorSpec(CONTEXT_INPUT, "int64", ("batch",)))
    outputs = [TensorSpec(OUTPUT_NAME, "float32", ("batch", "items", int(num_positions)))]
    return inputs, outputs
