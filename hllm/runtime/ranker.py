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
from hllm.errors import DecodeError, EngineError
from hllm.runtime import blocks as blk
from hllm.runtime.artefact import Artefact, open_engine, resolve
from hllm.runtime.decode import assignment_scores, decode, decode_batch
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
        blocks: 0 for a slate ranked in one pass; B for one ranked in B blocks + a final pass
            (:mod:`hllm.runtime.blocks`; then ``scores`` past the head are round-A scores).
        relevance: for a slate ranked in blocks, the relevance score in [0, 1] of each position
            (:class:`hllm.runtime.blocks.BlockRanking`); None otherwise.
    """

    slate_id: str
    order: list[int]
    item_ids: list
    scores: list[float]
    truncated: list[int] = field(default_factory=list)
    blocks: int = 0
    relevance: list[float] | None = None

    def to_dict(self) -> dict:
        """The JSONL record of ``hllm rank``: slate_id, ranking (item ids), order, scores, truncated (and
        ``blocks`` for a slate ranked in blocks)."""
        out = {
            "slate_id": self.slate_id,
            "ranking": self.item_ids,
            "order": self.order,
            "scores": [round(s, 6) for s in self.scores],
            "truncated": self.truncated,
        }
        if self.blocks:
            out["blocks"] = self.blocks
        return out


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
        batch_size: slates per engine call in :meth:`rank` (≥ 1; a slate ranked in blocks counts as
            B + 1, :func:`hllm.runtime.blocks.work`).
        blocks: how slates longer than K or ``max_seq_len`` are ranked (:class:`hllm.runtime.blocks.BlockOptions`).
    """

    def __init__(self, engine: Engine, builder: PromptBuilder, batch_size: int = 1,
                 blocks: blk.BlockOptions | None = None):
        self.engine = engine
        self.builder = builder
        self.batch_size = max(1, int(batch_size))
        self.blocks = blocks or blk.BlockOptions()

    @classmethod
    def from_path(cls, path, batch_size: int = 1, verify_hash: bool = False, blocks: blk.BlockOptions | None = None,
                  **engine_options) -> "Ranker":
        """Ranker for a checkpoint dir, export dir / ``.onnx`` file, or ``.plan`` (see :mod:`.artefact`), or
        for an :class:`~hllm.runtime.artefact.Artefact` a command resolved already (not resolved again:
        each artefact is read, and its tokenizer hashed, once per command).

        ``verify_hash``: also check the graph's sha256 against its sidecar (:func:`.artefact.resolve`; ignored
        for an Artefact). ``blocks``: see :class:`Ranker`. ``engine_options``: see :func:`hllm.runtime.artefact.open_engine`.
        """
        art = path if isinstance(path, Artefact) else resolve(path, verify_hash=verify_hash)
        builder = PromptBuilder(load_tokenizer(art.tokenizer_path), art.prompt, max_items=art.num_positions)
        return cls(open_engine(art, **engine_options), builder, batch_size, blocks)

    def __enter__(self) -> "Ranker":
        self.engine.activate()
        return self

    def __exit__(self, *exc) -> None:
        self.engine.deactivate()

    def scores(self, batch: Batch) -> np.ndarray:
        """Run the engine on an encoded batch: ``[B, N, K]`` float32."""
        self.engine.activate()
        return self.engine.run(batch.input_ids, batch.readout_positions, batch.item_mask, batch.context_positions)

    def encode(self, slate: dict, builder: PromptBuilder | None = None):
        """Encode one slate: an :class:`EncodedSlate` when it fits one prompt, else a
        :class:`hllm.runtime.blocks.BlockedSlate` (:func:`hllm.runtime.blocks.encode`; ``builder``: another
        builder over the same tokenizer, e.g. a smaller candidate budget). Raises: SlateError (also
        :class:`~hllm.runtime.blocks.TooManyDocuments`)."""
        return blk.encode(builder or self.builder, slate, self.blocks)

    def rank_batch(self, slates: Sequence[dict], encoded: Sequence | None = None,
                   first_index: int = 0) -> RankResult:
        """Rank slates in ONE engine call (slates longer than K or ``max_seq_len``: one call for every
        block and plain slate, of at most ``blocks.rows_per_call`` rows each, then one for the round-B
        prompts; :mod:`hllm.runtime.blocks`).

        Args:
            slates: the slates (ids and candidates for the output).
            encoded: their :meth:`encode` results when already computed (a server
                encodes at admission to validate, and does not tokenize twice).
            first_index: index of ``slates[0]`` in the caller's whole input: a slate without
                ``slate_id`` is named by its index (``first_index + b``) in rankings and errors.
        Raises: SlateError (bad slate), EngineError, DecodeError (non-finite scores; names the slate id).
        """
        t0 = time.perf_counter()
        rows = list(encoded) if encoded is not None else [self.encode(s) for s in slates]
        if any(isinstance(r, blk.BlockedSlate) for r in rows):
            return self._rank_blocks(slates, rows, first_index, t0)
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

    def _engine_rows(self, rows: list[EncodedSlate]) -> tuple[list[np.ndarray], float]:
        """Score matrices ``[n, K]`` of encoded prompts, ``blocks.rows_per_call`` per engine call → (matrices, calls)."""
        out, calls, step = [], 0, self.blocks.rows_per_call
        self.engine.activate()
        for i in range(0, len(rows), step):
            out.extend(slate_scores(self.engine, self.builder.collate(rows[i : i + step])))
            calls += 1
        return out, calls

    def _rank_blocks(self, slates: Sequence[dict], rows: list, first_index: int, t0: float) -> RankResult:
        """:meth:`rank_batch` when some slates are :class:`~hllm.runtime.blocks.BlockedSlate`: round A (plain
        slates and every block) in one pass, round B (each blocked slate's head) in another."""
        ids = slate_ids(slates, first_index)
        flat = [p for r in rows for p in (r.rows if isinstance(r, blk.BlockedSlate) else [r])]
        t1 = time.perf_counter()
        matrices, calls = self._engine_rows(flat)
        t2 = time.perf_counter()
        res = RankResult(calls=calls)
        done, heads, firsts, i, head_prompt = [], [], [], 0, 0.0
        for b, r in enumerate(rows):
            if isinstance(r, blk.BlockedSlate):
                mine = matrices[i : i + len(r.rows)]
                try:
                    a_scores = blk.round_a_scores(r, mine)
                except DecodeError as e:
                    raise DecodeError(f"slate {ids[b]}: {e}") from None
                firsts.append((mine, a_scores))
                if self.blocks.refine:
                    th = time.perf_counter()
                    heads.append(blk.head(self.builder, r, a_scores))
                    head_prompt += time.perf_counter() - th
                i += len(r.rows)
            else:
                firsts.append(matrices[i])
                i += 1
        t3 = time.perf_counter()
        head_matrices, more = self._engine_rows([h[1] for h in heads]) if heads else ([], 0)
        res.calls += more
        t4 = time.perf_counter()
        hi = 0
        for b, (slate, r, first) in enumerate(zip(slates, rows, firsts)):
            cands = slate["candidates"]
            if isinstance(r, blk.BlockedSlate):
                mine, a_scores = first
                hidx, hm = (heads[hi][0], head_matrices[hi]) if self.blocks.refine else (None, None)
                hi += 1 if self.blocks.refine else 0
                try:
                    br = blk.finish(r, mine, a_scores, hidx, hm)
                except DecodeError as e:
                    raise DecodeError(f"slate {ids[b]}: {e}") from None
                order, scores, matrix = br.order, br.scores, br.matrix
                extra = {"truncated": r.truncated, "blocks": br.blocks, "relevance": br.relevance}
            else:
                try:
                    order = decode(first, int(len(r.readout))).tolist()
                except DecodeError as e:
                    raise DecodeError(f"slate {ids[b]}: {e}") from None
                scores, matrix = assignment_scores(first, np.asarray(order)).tolist(), first
                extra = {"truncated": r.truncated}
            done.append(Ranking(slate_id=ids[b], order=order, item_ids=[cands[j].get("item_id", j) for j in order],
                                scores=scores, **extra))
            res.scores.append(matrix)
        res.rankings = done
        t5 = time.perf_counter()
        res.times = StageTimes((t1 - t0 + head_prompt) * 1e3, (t2 - t1 + t4 - t3) * 1e3,
                               (t3 - t2 - head_prompt + t5 - t4) * 1e3)
        return res

    def rank(self, slates: Sequence[dict], on_progress: Callable[[int], None] | None = None,
             encoded: Sequence[EncodedSlate] | None = None, batch_size: int | None = None) -> RankResult:
        """Rank any number of slates, ``batch_size`` (default: the ranker's) per engine call (with ``encoded``:
        slates whose :func:`hllm.runtime.blocks.work` sums to at most ``batch_size``, a long one alone).

        ``on_progress(n)`` is called after each engine call with the number of slates it ranked;
        ``encoded``: see :meth:`rank_batch`. Raises: as :meth:`rank_batch`; EngineError if the engine
        returns another number of rankings than slates.
        """
        step = max(1, int(batch_size or self.batch_size))
        out = RankResult()
        i = 0
        while i < len(slates):
            end, load = i + 1, 0 if encoded is None else blk.work(encoded[i])
            while end < len(slates) and end - i < step and (encoded is None or load + blk.work(encoded[end]) <= step):
                load += 0 if encoded is None else blk.work(encoded[end])
                end += 1
            chunk = slates[i:end]
            res = self.rank_batch(chunk, None if encoded is None else encoded[i:end], first_index=i)
            if len(res) != len(chunk):
                raise EngineError(f"ranker returned {len(res)} rankings for {len(chunk)} slates")
            out.extend(res)
            if on_progress:
                on_progress(len(chunk))
            i = end
        return out
