"""The lean ranking runtime: prompt builder + engine + LAPJV decode (torch-free).

``Ranker(engine, builder).rank(slates)`` → a :class:`RankResult` (paper §3: one prefill pass, readout,
head, assignment). Works with every engine in :mod:`hllm.engines`. The one loop over slates of the
project: callers that want progress pass ``on_progress`` instead of re-writing the loop.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np

from hllm.engines.base import Engine
from hllm.errors import EngineError
from hllm.runtime.artefact import Artefact, open_engine, resolve
from hllm.runtime.decode import assignment_scores, decode_batch
from hllm.runtime.prompt import Batch, EncodedSlate, PromptBuilder, load_tokenizer
from hllm.runtime.slates import slate_ids


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
        """The JSONL record of ``hllm rank``: slate_id, ranking (item ids), order, scores, truncated."""
        return {
            "slate_id": self.slate_id,
            "ranking": self.item_ids,
            "order": self.order,
            "scores": [round(s, 6) for s in self.scores],
            "truncated": self.truncated,
        }


@dataclass
class StageTimes:
    """Wall time per stage, in milliseconds (prompt building, engine call, decode + output)."""

    prompt_ms: float = 0.0
    engine_ms: float = 0.0
    decode_ms: float = 0.0

    @property
    def total_ms(self) -> float:
        return self.prompt_ms + self.engine_ms + self.decode_ms

    def __add__(self, other: "StageTimes") -> "StageTimes":
        return StageTimes(self.prompt_ms + other.prompt_ms, self.engine_ms + other.engine_ms,
                          self.decode_ms + other.decode_ms)


@dataclass
class RankResult:
    """What :meth:`Ranker.rank` / :meth:`Ranker.rank_batch` return. Iterating / indexing / ``len`` go
    over the rankings.

    Attributes:
        rankings: one :class:`Ranking` per slate, in input order.
        scores: per slate its score matrix ``[n, K]`` float32 (real rows only).
        times: stage times summed over the engine calls. calls: engine calls made.
    """

    rankings: list[Ranking] = field(default_factory=list)
    scores: list[np.ndarray] = field(default_factory=list)
    times: StageTimes = field(default_factory=StageTimes)
    calls: int = 0

    def __iter__(self) -> Iterator[Ranking]:
        return iter(self.rankings)

    def __len__(self) -> int:
        return len(self.rankings)

    def __getitem__(self, i):
        return self.rankings[i]

    def extend(self, other: "RankResult") -> None:
        """Append another result (the next batch)."""
        self.rankings.extend(other.rankings)
        self.scores.extend(other.scores)
        self.times = self.times + other.times
        self.calls += other.calls


def slate_scores(engine: Engine, batch: Batch) -> list[np.ndarray]:
    """Run ``engine`` on an encoded batch and cut each slate's real rows: ``[n_b, K]`` float32 per slate.

    Raises: ShapeError / EngineError from the engine.
    """
    scores = engine.run(batch.input_ids, batch.readout_positions, batch.item_mask, batch.context_positions)
    return [scores[b, : int(n)] for b, n in enumerate(batch.n_items)]


class Ranker:
    """Ranks slates with an engine.

    Args:
        engine: any :class:`hllm.engines.base.Engine` (activated on first use).
        builder: the :class:`PromptBuilder` matching the engine's model.
        batch_size: slates per engine call in :meth:`rank` (≥ 1).
    """

    def __init__(self, engine: Engine, builder: PromptBuilder, batch_size: int = 1):
        self.engine = engine
        self.builder = builder
        self.batch_size = max(1, int(batch_size))

    @classmethod
    def from_path(cls, path, batch_size: int = 1, verify_hash: bool = False, **engine_options) -> "Ranker":
        """Ranker for a checkpoint dir, export dir / ``.onnx`` file, or ``.plan`` (see :mod:`.artefact`), or
        for an :class:`~hllm.runtime.artefact.Artefact` a command resolved already (not resolved again:
        each artefact is read, and its tokenizer hashed, once per command).

        ``verify_hash``: also check the graph's sha256 against its sidecar (:func:`.artefact.resolve`; ignored
        for an Artefact). ``engine_options``: see :func:`hllm.runtime.artefact.open_engine`.
        """
        art = path if isinstance(path, Artefact) else resolve(path, verify_hash=verify_hash)
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
        return self.engine.run(batch.input_ids, batch.readout_positions, batch.item_mask, batch.context_positions)

    def rank_batch(self, slates: Sequence[dict], encoded: Sequence[EncodedSlate] | None = None,
                   first_index: int = 0) -> RankResult:
        """Rank slates in ONE engine call.

        Args:
            slates: the slates (ids and candidates for the output).
            encoded: their :meth:`PromptBuilder.encode_one` results when already computed (a server
                encodes at admission to validate, and does not tokenize twice).
            first_index: index of ``slates[0]`` in the caller's whole input: a slate without
                ``slate_id`` is named by its index (``first_index + b``) in rankings and errors.
        Raises: SlateError (bad slate), EngineError, DecodeError (non-finite scores; names the slate id).
        """
        t0 = time.perf_counter()
        rows = list(encoded) if encoded is not None else [self.builder.encode_one(s) for s in slates]
        batch = self.builder.collate(rows)
        t1 = time.perf_counter()
        scores = self.scores(batch)
        t2 = time.perf_counter()
        ids = slate_ids(slates, first_index)
        orders = decode_batch(scores, batch.n_items, ids)
        res = RankResult(calls=1)
        for b, (slate, order) in enumerate(zip(slates, orders)):
            cands = slate["candidates"]
            positions = order.tolist()  # Python ints: an id-less candidate is named by its index (JSON-serialisable)
            res.rankings.append(Ranking(
                slate_id=ids[b],
                order=positions,
                item_ids=[cands[i].get("item_id", i) for i in positions],
                scores=assignment_scores(scores[b], order).tolist(),
                truncated=batch.truncated[b],
            ))
            res.scores.append(scores[b, : int(batch.n_items[b])])
        t3 = time.perf_counter()
        res.times = StageTimes((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3)
        return res

    def rank(self, slates: Sequence[dict], on_progress: Callable[[int], None] | None = None,
             encoded: Sequence[EncodedSlate] | None = None, batch_size: int | None = None) -> RankResult:
        """Rank any number of slates, ``batch_size`` (default: the ranker's) per engine call.

        ``on_progress(n)`` is called after each engine call with the number of slates it ranked;
        ``encoded``: see :meth:`rank_batch`. Raises: as :meth:`rank_batch`; EngineError if the engine
        returns another number of rankings than slates.
        """
        step = max(1, int(batch_size or self.batch_size))
        out = RankResult()
        for i in range(0, len(slates), step):
            chunk = slates[i : i + step]
            res = self.rank_batch(chunk, None if encoded is None else encoded[i : i + step], first_index=i)
            if len(res) != len(chunk):
                raise EngineError(f"ranker returned {len(res)} rankings for {len(chunk)} slates")
            out.extend(res)
            if on_progress:
                on_progress(len(chunk))
        return out
