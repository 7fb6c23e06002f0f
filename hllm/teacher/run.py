"""Teacher runs over a slate file, with incremental output (the loops ``hllm teacher`` drives)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Sequence

from hllm.files import atomic_write_json
from hllm.formats.report import envelope
from hllm.measure import describe_machine
from hllm.runtime.slates import slate_id, write_jsonl


def run_ar_teacher(ranker, rows: Sequence[dict], out_file: Path, constrained: bool, batch_size: int = 1,
                   summary_path: Path | None = None, meta: dict | None = None,
                   on_batch: Callable[[list], None] | None = None) -> dict:
    """Rank ``rows`` with an :class:`hllm.teacher.ranker.ArRanker`, ``batch_size`` slates per ``generate``.

    ``out_file`` (JSONL of ``ArResult.to_dict()``) is rewritten atomically after every batch, so a
    stopped run keeps what it finished; ``summary_path`` likewise gets :func:`summarize` + ``meta`` in the
    report envelope (kind ``teacher``, :func:`hllm.formats.report.envelope`).
    ``on_batch(results of the batch)`` is called after each batch. An empty input still writes the
    (empty) file. Returns the summary dict. Raises: ValueError for ``batch_size`` < 1.
    """
    from hllm.teacher.ranker import summarize

    if batch_size < 1:
        raise ValueError(f"batch_size must be ≥ 1, got {batch_size}")
    results: list = []
    machine = describe_machine() if summary_path else None
    stats = lambda: {**summarize(results), **(meta or {})}  # noqa: E731
    for i in range(0, len(rows), batch_size):
        batch = ranker.rank_batch(list(rows[i : i + batch_size]), constrained)
        for b, r in enumerate(batch):  # the one id rule: an id-less slate is named by its index in the input
            r.slate_id = slate_id(rows[i + b], i + b)
        results.extend(batch)
        write_jsonl(out_file, [r.to_dict() for r in results])
        if summary_path:
            atomic_write_json(summary_path, envelope("teacher", {"teacher": "ar", **stats()}, machine=machine))
        if on_batch:
            on_batch(batch)
    if not results:
        write_jsonl(out_file, [])
    return stats()


def run_embedding_teacher(ranker, rows: Sequence[dict], out_file: Path,
                          on_progress: Callable[[int], None] | None = None) -> dict:
    """Rank ``rows`` with an :class:`hllm.teacher.embedding.EmbeddingRanker`; write ``out_file`` once at
    the end (seconds per 100 slates). Returns ``{slates, wall_s}``."""
    t0 = time.perf_counter()
    results = []
    for i, s in enumerate(rows):
        results.append({**ranker.rank(s).to_dict(), "slate_id": slate_id(s, i)})  # the one id rule
        if on_progress:
            on_progress(1)
    write_jsonl(out_file, results)
    return {"slates": len(results), "wall_s": round(time.perf_counter() - t0, 1)}
