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

import json
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


#: dtypes a sidecar may declare for the graph's output (FP16 graphs may return float16 scores).
OUTPUT_DTYPES = ("float32", "float16")


def check_tensor_specs(value: object, where: str, field: str, error: type[Exception] = ShapeError) -> list[TensorSpec]:
    """Validate a sidecar's ``inputs`` or ``outputs`` list (``export.json``, a plan's sidecar) — the one
    reader of those fields.

    Args:
        value: the field as stored: a list of ``{"name", "dtype", "shape"[, "max_shape"]}`` objects.
        where: the sidecar, for the message. field: ``inputs`` or ``outputs``. error: the class raised.
    Returns: the entries as :class:`TensorSpec` (``shape``: ints for fixed dims, strings for dynamic ones).
    Rules: ``inputs`` names are hLLM graph inputs (:data:`INPUT_DTYPES`), each with its dtype and rank
        (the module docstring's table), no name twice; ``outputs`` is one ``scores`` tensor of rank 3,
        dtype in :data:`OUTPUT_DTYPES`; a dim is a positive integer or a non-empty string;
        ``max_shape`` (optional) has one positive integer per dim.
    Raises: ``error`` naming ``where``, the field, the entry and what is wrong.
    """
    if not isinstance(value, list) or not value:
        raise error(f"{where}: {field} must be a non-empty list of {{name, dtype, shape}} objects, got {describe_value(value)}")
    specs, seen = [], set()
    for i, t in enumerate(value):
        at = f"{where}: {field}[{i}]"
        if not isinstance(t, dict):
            raise error(f"{at} must be an object with name, dtype and shape, got {describe_value(t)}")
        name, dtype, shape = t.get("name"), t.get("dtype"), t.get("shape")
        if not isinstance(name, str) or not name:
            raise error(f"{at}.name must be a non-empty string, got {describe_value(name)}")
        if field == "inputs" and name not in INPUT_DTYPES:
            raise error(f"{at}.name {name!r} is not an hLLM graph input (known: {', '.join(INPUT_DTYPES)})")
        if field != "inputs" and name != OUTPUT_NAME:
            raise error(f"{at}.name {name!r}: the graph's one output is {OUTPUT_NAME!r}")
        if name in seen:
            raise error(f"{at}.name {name!r} is listed twice")
        seen.add(name)
        want = (INPUT_DTYPES[name],) if field == "inputs" else OUTPUT_DTYPES
        if not isinstance(dtype, str) or dtype not in want:
            raise error(f"{at}.dtype must be {' or '.join(map(repr, want))}, got {describe_value(dtype)}")
        rank = INPUT_RANKS[name] if field == "inputs" else 3
        if not isinstance(shape, list) or len(shape) != rank or not all(_is_dim(d) for d in shape):
            raise error(f"{at}.shape must be a list of {rank} dims (positive integers or names), got {describe_value(shape)}")
        mx = t.get("max_shape")
        if mx is not None and not (isinstance(mx, list) and len(mx) == rank
                                   and all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in mx)):
            raise error(f"{at}.max_shape must be a list of {rank} positive integers, got {describe_value(mx)}")
        specs.append(TensorSpec(name, dtype, tuple(shape), None if mx is None else tuple(mx)))
    if field != "inputs" and len(specs) != 1:
        raise error(f"{where}: {field} must list the one output {OUTPUT_NAME!r}, got {len(specs)} entries")
    return specs


def _is_dim(d: object) -> bool:
    return (isinstance(d, int) and not isinstance(d, bool) and d >= 1) or (isinstance(d, str) and bool(d))


def describe_value(v: object) -> str:
    """What a field held, for a message: its JSON type and (shortened) value."""
    if v is None:
        return "null"
    try:
        text = json.dumps(v, default=str)
    except (ValueError, RecursionError):  # nested too deeply to print
        text = "…"
    return f"{_json_type(v)} {text[:80]}"


def _json_type(v: object) -> str:
    return {type(None): "null", bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "an object"}.get(type(v), type(v).__name__)


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
