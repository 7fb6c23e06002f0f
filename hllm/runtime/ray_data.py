"""Offline ranking of slate files on Ray Data: ``hllm rank MODEL --slates F --out O --ray --workers N``.

A streaming pipeline (https://docs.ray.io/en/latest/data/data-internals.html, streaming execution):

1. **read** — :class:`SlateChunks`, a Ray Data datasource (``ray.data.read_datasource``): ``2 × N`` read
   tasks each stream the file with the runtime's :func:`hllm.runtime.slates.iter_slates` (the reader and
   validator of ``hllm rank``), keep one contiguous range of chunks (so every actor gets input) and yield
   blocks of ``chunks_per_block`` chunks; a chunk is ``batch_size``
   consecutive slates as JSON (the slates of ONE engine call, as in the single-process run, so the
   padding and therefore every score is the same);
2. **rank** — ``Dataset.map_batches(RankActor, compute=ActorPoolStrategy(size=N, max_tasks_in_flight_per_actor=1))``: a pool of N actors (all started before the first block goes out), each holding ONE
   engine (:class:`hllm.runtime.Ranker`, activated in the constructor) with ``num_cpus`` / ``num_gpus``
   per actor;
3. **write** — the driver iterates the ranked blocks in file order (``preserve_order``) and streams
   them into the runtime's :func:`write_jsonl` (atomic; gzip for ``.gz``), so the output is
   byte-identical to ``hllm rank``'s single file.

Ray Data's ``write_json`` is not used: it writes a directory of part files with pandas' JSON encoder,
which cannot be ``hllm rank``'s one file byte for byte. The driver holds neither the slates nor the
rankings: it first streams the file once to validate it (so a bad slate fails with ``hllm rank``'s
error, naming the line, before Ray starts), then holds only the blocks in flight (its peak memory does
not grow with the file; ``scripts/ray_data_memory.py`` measures it).

Needs ``pip install 'hllm[ray]'``; imports neither torch nor transformers.
Ray Data API: https://docs.ray.io/en/latest/data/api/doc/ray.data.Dataset.map_batches.html,
https://docs.ray.io/en/latest/data/api/doc/ray.data.Datasource.html
"""

from __future__ import annotations

import json
import os
from typing import Callable, Iterator

import numpy as np

from hllm.extras import require
from hllm.runtime.ranker import Ranker
from hllm.runtime.slates import iter_slates, write_jsonl


class RankActor:
    """A Ray Data actor: one engine, ranks batches of slate chunks (``{"chunk": [JSON list of slates]}``)."""

    def __init__(self, model: str, threads: int | None = None):
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


def iter_chunks(slates: str | os.PathLike, batch_size: int, limit: int | None = None,
                stop: int | None = None) -> Iterator[tuple[int, str]]:
    """(index of the first slate, JSON list of ``batch_size`` slates) for the slates of ``slates`` in file
    order (validated by :func:`iter_slates`; raises its SlateError); the first ``stop`` chunks only, if given."""
    if stop is not None:
        limit = stop * batch_size if limit is None else min(limit, stop * batch_size)
    cur, first = [], 0
    for i, s in enumerate(iter_slates(slates, limit)):
        if not cur:
            first = i
        cur.append(s)
        if len(cur) == batch_size:
            yield first, json.dumps(cur, ensure_ascii=False)
            cur = []
    if cur:
        yield first, json.dumps(cur, ensure_ascii=False)


def _make_datasource():
    """:class:`SlateChunks` (defined on first use: its base class is Ray Data's ``Datasource``)."""
    from ray.data import Datasource, ReadTask
    from ray.data.block import BlockMetadata

    class SlateChunks(Datasource):
        """The chunks of a slates file (:func:`iter_chunks`) as blocks of ``{"chunk", "first"}`` rows
        (``n_chunks`` counted by the driver's validation pass), read by ``parallelism`` tasks that each
        stream the file and keep one contiguous range of chunks. Ray Data merges the blocks one task yields
        into one output (its block target is bytes, 128 MiB), and one input reaches ONE actor: with one read
        task, ``--workers 2`` ranked everything on one actor. One range per task gives the pool an input per
        task; the chunks, and so the rankings, are those of a single reader."""

        def __init__(self, path: str, batch_size: int, limit: int | None, n_chunks: int, chunks_per_block: int):
            self.path, self.batch_size, self.limit = path, batch_size, limit
            self.n_chunks, self.chunks_per_block = n_chunks, chunks_per_block

        def estimate_inmemory_data_size(self) -> int | None:
            return None

        def get_read_tasks(self, parallelism: int, per_task_row_limit=None, data_context=None) -> list:
            path, bs, limit, per_block = self.path, self.batch_size, self.limit, self.chunks_per_block
            k = max(1, min(int(parallelism), self.n_chunks))
            bounds = [self.n_chunks * i // k for i in range(k + 1)]  # chunk ranges [bounds[i], bounds[i+1])

            def read(start: int, stop: int):
                import pyarrow as pa

                rows = {"chunk": [], "first": []}
                for i, (first, chunk) in enumerate(iter_chunks(path, bs, limit, stop=stop)):
                    if i < start:
                        continue
                    rows["chunk"].append(chunk)
                    rows["first"].append(first)
                    if len(rows["chunk"]) == per_block:
                        yield pa.table(rows)
                        rows = {"chunk": [], "first": []}
                if rows["chunk"]:
                    yield pa.table(rows)

            tasks = []
            for a, b in zip(bounds, bounds[1:]):
                meta = BlockMetadata(num_rows=b - a, size_bytes=None, input_files=[path], exec_stats=None)
                tasks.append(ReadTask(lambda a=a, b=b: read(a, b), meta, per_task_row_limit=per_task_row_limit))
            return tasks

    return SlateChunks


def count_slates(slates: str | os.PathLike, limit: int | None = None) -> int:
    """Stream ``slates`` once, validating every slate as ``hllm rank`` does; returns how many (constant memory).
    Raises: SlateError naming the file and line."""
    return sum(1 for _ in iter_slates(slates, limit))


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
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    chunks_per_block: int = 16,
) -> int:
    """Rank the slates file ``slates`` with ``workers`` Ray actors and stream JSONL rankings to ``out``.

    Uses the initialised Ray, else joins ``RAY_ADDRESS`` or starts (and afterwards stops) a local
    instance on 127.0.0.1 (:func:`init_local_or_cluster`). ``threads``: each actor's engine intra-op
    threads; ``num_cpus`` / ``num_gpus``: Ray resources per actor; ``chunks_per_call`` chunks of
    ``batch_size`` slates go to an actor per call; blocks of ``chunks_per_block`` chunks stream from the
    reader. Returns the number of slates ranked.
    Raises: MissingExtraError (ray not installed), SlateError (as ``hllm rank``), EngineError, ValueError.
    """
    ray = require("ray")
    require("ray.data")
    if workers < 1 or batch_size < 1 or chunks_per_call < 1 or chunks_per_block < 1 or num_cpus < 0 or num_gpus < 0:
        raise ValueError("workers, batch_size, chunks_per_call and chunks_per_block must be ≥ 1, num_cpus and num_gpus ≥ 0")
    n = count_slates(slates, limit)  # validates the whole file before Ray starts (hllm rank's errors)
    started = not ray.is_initialized()
    if started:
        init_local_or_cluster(ray, max(1, int(np.ceil(workers * num_cpus))))
    try:
        ctx = ray.data.DataContext.get_current()
        ctx.execution_options.preserve_order = True
        ctx.enable_progress_bars = False
        # Every actor is up before the first block is dispatched, and an actor holds one task at a time: the
        # blocks spread over the pool instead of queueing on the actor that started first (Ray Data
        # ActorPoolStrategy: "set max_tasks_in_flight_per_actor to 1" to cut queueing on the worker actors).
        ctx.wait_for_min_actors_s = 600
        n_chunks = -(-n // batch_size)
        source = _make_datasource()(str(slates), batch_size, limit, n_chunks, chunks_per_block)
        # The reader takes no CPU slot: it only decompresses and re-serialises JSON, and with a slot it would
        # wait forever behind actors that hold every CPU of a small machine (the actor pool starts first).
        ranked = ray.data.read_datasource(source, override_num_blocks=min(n_chunks, 2 * workers), num_cpus=0).map_batches(
            RankActor, fn_constructor_kwargs={"model": str(model), "threads": threads},
            compute=ray.data.ActorPoolStrategy(size=workers, max_tasks_in_flight_per_actor=1),
            batch_size=chunks_per_call, batch_format="numpy", num_cpus=num_cpus, num_gpus=num_gpus)
        count = [0]

        def records():
            for batch in ranked.iter_batches(batch_size=None, batch_format="numpy"):
                for text in batch["rankings"]:
                    part = json.loads(text)
                    count[0] += len(part)
                    yield from part
                    if on_progress:
                        on_progress(len(part))

        write_jsonl(out, records())
    finally:
        if started:
            ray.shutdown()
    return count[0]


def init_local_or_cluster(ray, cpus: int) -> None:
    """Join the cluster at ``RAY_ADDRESS`` if set, else start a local Ray instance on 127.0.0.1
    (no dashboard) with at least ``cpus`` logical CPUs, so the actors fit on a small machine."""
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, logging_level="WARNING")
    else:
        ray.init(address="local", num_cpus=max(os.cpu_count() or 1, cpus), include_dashboard=False,
                 _node_ip_address="127.0.0.1", logging_level="WARNING")
