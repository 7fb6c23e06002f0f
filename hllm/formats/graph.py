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
