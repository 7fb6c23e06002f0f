"""The lean ranking runtime: prompt builder + engine + LAPJV decode (torch-free).

``Ranker(engine, builder).rank(slates)`` → one :class:`Ranking` per slate (paper §3: one prefill
pass, readout, head, assignment). Works with every engine in :mod:`hllm.engines`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from hllm.engines.base import Engine
from hllm.runtime.decode import assignment_scores, decode_batch
from hllm.runtime.prompt import Batch, PromptBuilder, load_tokenizer


@dataclass
class Ranking:
    """The ranking of one slate.

    Attributes:
        slate_id: from the slate (or its index as a string).
        order: candidate indices, best first (``order[p]`` = candidate at rank position p).
        item_ids: the candidates' ``item_id`` in ranked order.
        scores: ``M[order[p], p]`` for each position p (float).
        truncated: candidate indices whose text was cut to the token budget.
    """

    slate_id: str
    order: list[int]
    item_ids: list
    scores: list[float]
    truncated: list[int] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "slate_id": self.slate_id,
            "ranking": self.item_ids,
            "order": self.order,
            "scores": [round(s, 6) for s in self.scores],
            "truncated": self.truncated,
        }


@dataclass
class StageTimes:
    """Wall time of one :meth:`Ranker.rank_batch` call per stage, in milliseconds."""

    prompt_ms: float
    engine_ms: float
    decode_ms: float

    @property
    def total_ms(self) -> float:
        return self.prompt_ms + self.engine_ms + self.decode_ms


class Ranker:
    """Ranks slates with an engine.

    Args:
        engine: any :class:`hllm.engines.base.Engine` (activated on first use).
        builder: the :class:`PromptBuilder` matching the engine's model.
        batch_size: slates per engine call in :meth:`rank`.
    """

    def __init__(self, engine: Engine, builder: PromptBuilder, batch_size: int = 1):
        self.engine = engine
        self.builder = builder
        self.batch_size = max(1, int(batch_size))
        self.last_scores: np.ndarray | None = None

    @classmethod
    def from_path(cls, path: str | os.PathLike, batch_size: int = 1, **engine_options) -> "Ranker":
        """Ranker for a checkpoint dir, export dir / ``.onnx`` file, or ``.plan`` (see :mod:`.artifact`)."""
        from hllm.runtime.artefact import open_engine, resolve

        art = resolve(path)
        builder = PromptBuilder(load_tokenizer(art.tokenizer_path), art.prompt, max_items=art.num_positions)
        return cls(open_engine(art, **engine_options), builder, batch_size)

    def __enter__(self) -> "Ranker":
        self.engine.activate()
        return self

    def __exit__(self, *exc) -> None:
        self.engine.deactivate()

    def scores(self, batch: Batch) -> np.ndarray:
        """Run the engine on an encoded batch: ``[B, N, K]`` float32."""
        self.engine.activate()
        return self.engine.run(batch.input_ids, batch.readout_positions, batch.item_mask)

    def rank_batch(self, slates: Sequence[dict]) -> tuple[list[Ranking], StageTimes]:
        """Rank slates in ONE engine call; returns rankings and per-stage times.

        Raises: SlateError (bad slate), EngineError, DecodeError (non-finite scores).
        """
        t0 = time.perf_counter()
        batch = self.builder.encode(slates)
        t1 = time.perf_counter()
        scores = self.scores(batch)
        t2 = time.perf_counter()
        orders = decode_batch(scores, batch.n_items)
        out = []
        for b, (slate, order) in enumerate(zip(slates, orders)):
            cands = slate["candidates"]
            out.append(
                Ranking(
                    slate_id=str(slate.get("slate_id", b)),
                    order=order.tolist(),
                    item_ids=[cands[i].get("item_id", i) for i in order],
                    scores=assignment_scores(scores[b], order).tolist(),
                    truncated=batch.truncated[b],
                )
            )
        t3 = time.perf_counter()
        self.last_scores = scores
        return out, StageTimes((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3)

    def rank(self, slates: Sequence[dict]) -> list[Ranking]:
        """Rank any number of slates, ``batch_size`` per engine call."""
        out: list[Ranking] = []
        for i in range(0, len(slates), self.batch_size):
            out.extend(self.rank_batch(slates[i : i + self.batch_size])[0])
        return out
