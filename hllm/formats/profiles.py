"""TensorRT optimization profiles over the three dynamic dims of the hLLM graph (torch-free, TRT-free).

The graph's inputs are ``input_ids [batch, seq]``, ``readout_positions [batch, items]``,
``item_mask [batch, items]`` and, for a head that reads the user context, ``context_positions [batch]``. A :class:`Profile` gives each of batch, seq and items a
``min ≤ opt ≤ max`` range; TensorRT tunes kernels for ``opt`` and accepts every shape inside
``[min, max]`` (TensorRT Python API, ``IOptimizationProfile.set_shape(name, min, opt, max)``).

Profiles are validated before any build (:meth:`Profile.validate`) and requests are matched to a
profile before any run (:func:`hllm.engines.tensorrt.profiles.select_profile`), so a shape TensorRT would
reject fails early with a message naming the dim and the ranges built. This module is the profile's form
(its text and its sidecar dict); the choices made with profiles live in :mod:`hllm.engines.tensorrt.profiles`.

Text form (CLI ``--profile``): ``BATCH/SEQ/ITEMS`` with each part ``min:opt:max`` or one number,
e.g. ``1:1:8/64:1536:2048/1:50:50``.
"""

from __future__ import annotations

from dataclasses import dataclass

from hllm.errors import EngineError

DIMS = ("batch", "seq", "items")
#: The largest value of each dynamic dim the exported graph declares (``hllm.exporter.onnx``:
#: ``Dim("batch", max=1024)``, ``Dim("seq", max=65536)``, ``Dim("items", max=4096)``); a profile beyond
#: them describes shapes the graph was never exported for.
GRAPH_MAX = {"batch": 1024, "seq": 65536, "items": 4096}


@dataclass(frozen=True)
class DimRange:
    """``min ≤ opt ≤ max`` of one dynamic dim (all ints ≥ 1)."""

    min: int
    opt: int
    max: int

    @classmethod
    def parse(cls, text: str, dim: str = "dim") -> "DimRange":
        """``"1:4:8"`` → DimRange(1, 4, 8); ``"50"`` → DimRange(50, 50, 50). Raises EngineError."""
        parts = [p.strip() for p in str(text).split(":")]
        try:
            vals = [int(p) for p in parts]
        except ValueError:
            raise EngineError(f"{dim} range {text!r} is not min:opt:max integers") from None
        if len(vals) == 1:
            vals = vals * 3
        if len(vals) != 3:
            raise EngineError(f"{dim} range {text!r} needs 1 or 3 numbers (min:opt:max), got {len(vals)}")
        r = cls(*vals)
        r.validate(dim)
        return r

    def validate(self, dim: str = "dim") -> None:
        """Raises EngineError unless ``1 ≤ min ≤ opt ≤ max``."""
        if not (1 <= self.min <= self.opt <= self.max):
            raise EngineError(f"{dim} range must satisfy 1 ≤ min ≤ opt ≤ max, got min={self.min} opt={self.opt} max={self.max}")

    def __contains__(self, v: int) -> bool:
        return self.min <= v <= self.max

    def __str__(self) -> str:
        return f"{self.min}:{self.opt}:{self.max}"


@dataclass(frozen=True)
class Profile:
    """One optimization profile: ranges of batch (B), sequence length (S) and items (N)."""

    batch: DimRange
    seq: DimRange
    items: DimRange

    @classmethod
    def parse(cls, text: str) -> "Profile":
        """``"1:1:8/64:1536:2048/1:50:50"`` → Profile. Raises EngineError on a malformed spec."""
        parts = str(text).split("/")
        if len(parts) != 3:
            raise EngineError(f"profile {text!r} must be BATCH/SEQ/ITEMS, each min:opt:max or one number")
        return cls(*(DimRange.parse(p, d) for p, d in zip(parts, DIMS)))

    def validate(self, num_positions: int | None = None) -> "Profile":
        """Check the profile can serve the hLLM graph; returns self.

        Rules: each dim ``1 ≤ min ≤ opt ≤ max ≤`` the graph's declared bound (:data:`GRAPH_MAX`); ``seq.min ≥ 2`` (the export's smallest sequence);
        ``items ≤ seq`` at min, opt and max (every item has a readout token); with ``num_positions``
        K: ``items.max ≤ K`` (the head ranks at most K items).
        Raises: EngineError naming the broken rule.
        """
        for d in DIMS:
            getattr(self, d).validate(d)
            if getattr(self, d).max > GRAPH_MAX[d]:
                raise EngineError(f"{d}.max={getattr(self, d).max} exceeds the exported graph's declared bound "
                                  f"{d} ≤ {GRAPH_MAX[d]}")
        if self.seq.min < 2:
            raise EngineError(f"seq.min must be ≥ 2 (the exported graph's smallest sequence), got {self.seq.min}")
        for which in ("min", "opt", "max"):
            n, s = getattr(self.items, which), getattr(self.seq, which)
            if n > s:
                raise EngineError(f"items.{which}={n} exceeds seq.{which}={s}: each item needs a readout token")
        if num_positions is not None and self.items.max > num_positions:
            raise EngineError(f"items.max={self.items.max} exceeds the head's K={num_positions} rank positions")
        return self

    def shapes(self, context: bool = False) -> dict[str, tuple[tuple, tuple, tuple]]:
        """``{input name: (min shape, opt shape, max shape)}`` for ``IOptimizationProfile.set_shape``
        (``context``: the graph also has ``context_positions [batch]``)."""
        b, s, n = self.batch, self.seq, self.items
        bn = ((b.min, n.min), (b.opt, n.opt), (b.max, n.max))
        out = {
            "input_ids": ((b.min, s.min), (b.opt, s.opt), (b.max, s.max)),
            "readout_positions": bn,
            "item_mask": bn,
        }
        if context:
            out["context_positions"] = ((b.min,), (b.opt,), (b.max,))
        return out

    def contains(self, batch: int, seq: int, items: int) -> bool:
        """Whether a request of shape (B, S, N) lies inside this profile."""
        return batch in self.batch and seq in self.seq and items in self.items

    def to_dict(self) -> dict:
        return {d: {"min": r.min, "opt": r.opt, "max": r.max} for d, r in zip(DIMS, (self.batch, self.seq, self.items))}

    @classmethod
    def from_dict(cls, d: dict) -> "Profile":
        try:
            return cls(*(DimRange(int(d[k]["min"]), int(d[k]["opt"]), int(d[k]["max"])) for k in DIMS))
        except (KeyError, TypeError, ValueError) as e:
            raise EngineError(f"malformed profile {d!r}: {e}") from None

    def __str__(self) -> str:
        return f"{self.batch}/{self.seq}/{self.items}"
