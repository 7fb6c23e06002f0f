"""Side-by-side CPU speed of a quantized export vs its FP32 export (torch-free).

Both engines are loaded once and timed *interleaved* on the same encoded slates (round r runs every
engine once on slate r mod len(slates), rotating the order: :func:`hllm.measure.time_interleaved`),
warm-up rounds discarded, so their ratio is fair on cores shared with other processes. Only the
engine call is timed (prompt building and LAPJV decode are the same for both).
"""

from __future__ import annotations

import os
from typing import Sequence

from hllm.formats.provenance import library_versions
from hllm.verify.reference import cpu_ranker


def compare_speed(
    artefacts: dict[str, str | os.PathLike],
    slates: Sequence[dict],
    rounds: int = 10,
    warmup: int = 2,
    threads: int | None = None,
    baseline: str = "fp32",
) -> dict:
    """Median engine time per slate of each artefact, and each one's speed-up over ``baseline``.

    Args:
        artefacts: ``{name: export dir or .onnx}``; must include ``baseline``.
        slates: slates to cycle through (B=1 per call), encoded once with the baseline's builder.
        rounds, warmup: measured and discarded interleaved rounds.
        threads: intra-op threads (None = ORT default).
    Returns: ``{"engine_ms": {name: summary}, "speedup_vs_<baseline>": {name: ratio of medians},
        "rounds", "warmup", "slates", "threads", "items"}``.
    Raises: ValueError if ``baseline`` is not among the artefacts.
    """
    from hllm.measure import summarize, time_interleaved

    if baseline not in artefacts:
        raise ValueError(f"baseline {baseline!r} not in {list(artefacts)}")
    rankers = {k: cpu_ranker(p, threads) for k, p in artefacts.items()}
    builder = rankers[baseline].builder
    batches = [builder.encode([s]) for s in slates]
    for r in rankers.values():
        r.engine.activate()
    try:
        calls = {k: (lambda i, r=r: r.scores(batches[i % len(batches)])) for k, r in rankers.items()}
        samples = time_interleaved(calls, rounds=rounds, warmup=warmup, unit=1e3)
    finally:
        for r in rankers.values():
            r.engine.deactivate()
    summ = {k: summarize(v) for k, v in samples.items()}
    base = summ[baseline]["median"]
    return {
        "engine_ms": summ,
        f"speedup_vs_{baseline}": {k: round(base / v["median"], 3) for k, v in summ.items()},
        "rounds": rounds,
        "warmup": warmup,
        "slates": len(slates),
        "threads": threads,
        "items": sorted({int(b.n_items[0]) for b in batches}),
        "seq_lens": [int(b.lengths[0]) for b in batches],
        "libraries": library_versions(),
    }
