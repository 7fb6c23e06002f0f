"""Offline ranking of slate files on Ray Data: ``hllm rank MODEL --slates F --out O --ray --workers N``.

A fixed pool of N Ray actors (``ray.data.ActorPoolStrategy(size=N)``) each holds ONE engine (the
runtime's :class:`hllm.runtime.Ranker`, activated once in the actor's constructor) and ranks the
batches Ray Data hands it (``Dataset.map_batches`` with a callable class). The driver reads and
validates the file exactly as ``hllm rank`` does (:func:`hllm.runtime.slates.iter_slates`, same
errors), groups the slates into chunks of ``batch_size`` (the slates of ONE engine call, as in the
single-process run, so padding and therefore every score is the same), and Ray Data preserves the
order (``DataContext.execution_options.preserve_order``). The result is written by the same
:func:`write_jsonl`, so the output file is byte-identical to the single-process run's.
The driver holds the slates' JSON text; the actors only see their batches.

Needs ``pip install 'hllm[ray]'``; imports neither torch nor transformers.
Ray Data API: https://docs.ray.io/en/latest/data/api/doc/ray.data.Dataset.map_batches.html
"""

from __future__ import annotations

import json
import os
from typing import Callable

import numpy as np

from hllm.extras import require
from hllm.runtime.slates import iter_slates, write_jsonl


class RankActor:
    """A Ray Data actor: one engine, ranks batches of slate chunks (``{"chunk": [JSON list of slates]}``)."""

    def __init__(self, model: str, threads: int | None = None):
        from hllm.runtime.ranker import Ranker

        self.ranker = Ranker.from_path(model, threads=threads)
        self.ranker.engine.activate()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``chunk`` [n] JSON lists of slates (``first`` [n]: index of each chunk's first slate in the
        file, which names slates without an id) → ``rankings`` [n] JSON lists of ``Ranking.to_dict()``."""
        out = []
        for chunk, first in zip(batch["chunk"], batch["first"]):
            res = self.ranker.rank_batch(json.loads(chunk), first_index=int(first))
            out.append(json.dumps([r.to_dict() for r in res], ensure_ascii=False))
        return {"rankings": np.array(out, dtype=object)}


def read_chunks(slates: str | os.PathLike, batch_size: int, limit: int | None = None) -> list[str]:
    """The slates of ``slates`` (validated, in file order) as JSON lists of ``batch_size`` slates."""
    chunks, cur = [], []
    for s in iter_slates(slates, limit):
        cur.append(s)
        if len(cur) == batch_size:
            chunks.append(json.dumps(cur, ensure_ascii=False))
            cur = []
    if cur:
        chunks.append(json.dumps(cur, ensure_ascii=False))
    return chunks


def rank_file(
    model: str | os.PathLike,
    slates: str | os.PathLike,
    out: str | os.PathLike,
    workers: int = 2,
    batch_size: int = 1,
    threads: int | None = 1,
    limit: int | None = None,
    chunks_per_call: int = 4,
    on_progress: Callable[[int], None] | None = None,
) -> int:
    """Rank the slates file ``slates`` with ``workers`` Ray actors and write JSONL rankings to ``out``.

    Uses the initialised Ray, else joins ``RAY_ADDRESS`` or starts (and afterwards stops) a local
    instance on 127.0.0.1 (:func:`init_local_or_cluster`). ``threads`` is each actor's engine intra-op threads; ``chunks_per_call`` chunks of
    ``batch_size`` slates go to an actor per call. Returns the number of slates ranked.
    Raises: MissingExtraError (ray not installed), SlateError (as ``hllm rank``), EngineError.
    """
    ray = require("ray")
    require("ray.data")
    if workers < 1 or batch_size < 1 or chunks_per_call < 1:
        raise ValueError("workers, batch_size and chunks_per_call must be ≥ 1")
    chunks = read_chunks(slates, batch_size, limit)
    started = not ray.is_initialized()
    if started:
        init_local_or_cluster(ray, workers)
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = False
    results = []
    if chunks:
        ds = ray.data.from_items([{"chunk": c, "first": i * batch_size} for i, c in enumerate(chunks)],
                                 override_num_blocks=min(len(chunks), workers * 4))
        ranked = ds.map_batches(
            RankActor,
            fn_constructor_kwargs={"model": str(model), "threads": threads},
            compute=ray.data.ActorPoolStrategy(size=workers),
            batch_size=chunks_per_call,
            batch_format="numpy",
            num_cpus=1,
        )
        for row in ranked.iter_rows():
            part = json.loads(row["rankings"])
            results.extend(part)
            if on_progress:
                on_progress(len(part))
    if started:
        ray.shutdown()
    write_jsonl(out, results)
    return len(results)


def init_local_or_cluster(ray, cpus: int) -> None:
    """Join the cluster at ``RAY_ADDRESS`` if set, else start a local Ray instance on 127.0.0.1
    (no dashboard) with at least ``cpus`` logical CPUs, so ``cpus`` one-CPU actors fit on a small machine."""
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, logging_level="WARNING")
    else:
        ray.init(address="local", num_cpus=max(os.cpu_count() or 1, cpus), include_dashboard=False,
                 _node_ip_address="127.0.0.1", logging_level="WARNING")
