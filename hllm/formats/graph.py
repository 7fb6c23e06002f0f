"""The hLLM graph's input/output contract: names, dtypes and symbolic shapes (torch-free).

    input_ids          [batch, seq]   int64   right-padded token ids
    readout_positions  [batch, items] int64   index into seq of each candidate's last token
    item_mask          [batch, items] bool    True for real candidates
    → scores           [batch, items, K] float32   item × rank-position score matrix

Every engine, exporter, sidecar and the Triton repository take the names from here.
"""

from __future__ import annotations

from dataclasses import dataclass

INPUT_NAMES = ("input_ids", "readout_positions", "item_mask")
OUTPUT_NAME = "scores"


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


def graph_io_specs(num_positions: int) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The hLLM graph's input and output specs for a head with K = ``num_positions``."""
    inputs = [
        TensorSpec("input_ids", "int64", ("batch", "seq")),
        TensorSpec("readout_positions", "int64", ("batch", "items")),
        TensorSpec("item_mask", "bool", ("batch", "items")),
    ]
    outputs = [TensorSpec(OUTPUT_NAME, "float32", ("batch", "items", int(num_positions)))]
    return inputs, outputs
