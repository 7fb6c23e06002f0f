"""Engine time against prompt length: contenders side by side at fixed S (torch-free).

Real Beauty slates stop near 1,400 tokens (50 candidates × ≤ 32 tokens + history), so the engine
alone is timed on synthetic inputs of exactly ``S`` tokens (random ids of the model's vocabulary, N
readout positions spread over the second half, the context position before them): the prefill cost
depends on S and N, not on which tokens they are. Contenders run interleaved (round r runs each
once, rotating the order; :func:`hllm.measure.time_interleaved`) after discarded warm-up rounds,
and every one gets the same arrays. Per contender and S: median engine ms, its ratio to the first
contender (the reference, usually the PyTorch checkpoint), GFLOP/s of the prefill and the fraction of
the fp32 GEMM peak measured in the same run.
"""

from __future__ import annotations

import os
from typing import Callable, Sequence

import numpy as np

from hllm.bench import SCHEMA_VERSION
from hllm.bench.stages import model_dims
from hllm.measure import prefill_flops, summarize, time_interleaved
from hllm.runtime.artefact import open_engine, resolve


def synthetic_inputs(seq_len: int, n_items: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    """One prompt of ``seq_len`` tokens: ``input_ids [1, S]``, ``readout_positions [1, N]`` (sorted,
    distinct, in the second half), ``item_mask [1, N]``, ``context_positions [1]``.

    Raises: ValueError if N > S / 2.
    """
    if n_items > seq_len // 2:
        raise ValueError(f"{n_items} items need at least {2 * n_items} tokens, got {seq_len}")
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, size=(1, seq_len), dtype=np.int64)
    pos = np.sort(rng.choice(np.arange(seq_len // 2, seq_len), size=n_items, replace=False))[None].astype(np.int64)
    return {"input_ids": ids, "readout_positions": pos, "item_mask": np.ones((1, n_items), dtype=bool),
            "context_positions": np.array([seq_len // 2 - 1], dtype=np.int64)}


def bench_scaling(models: Sequence[str | os.PathLike], seq_lens: Sequence[int], n_items: int = 50, runs: int = 5,
                  warmup: int = 1, threads: int | None = None, peak_gflops: float | None = None,
                  on_call: Callable[[str], None] | None = None) -> list[dict]:
    """One record per (S, contender): ``kind="scaling"``, ``seq_len``, ``n_items``, ``model``, ``backend``,
    ``precision``, ``flavour``, ``engine_ms`` (statistics), ``ratio_to_reference`` (median reference ms /
    median ms: > 1 is faster than the reference), ``gflops``, ``peak_fraction``.

    Raises: HllmError from loading / running a model; ValueError for an S too short for N.
    """
    arts = [resolve(m) for m in models]
    engines = [open_engine(a, threads=threads).activate() for a in arts]
    dims = model_dims(models[0])
    vocab = dims.vocab_size if dims is not None else 1000
    records = []
    try:
        for s in seq_lens:
            x = synthetic_inputs(s, n_items, vocab)
            calls = {f"{i}:{a.path}": (lambda r, e=e: e.run(x["input_ids"], x["readout_positions"], x["item_mask"],
                                                               x["context_positions"]))
                     for i, (a, e) in enumerate(zip(arts, engines))}
            samples = time_interleaved(calls, rounds=runs, warmup=warmup, unit=1e3)
            if on_call:
                on_call(f"S={s}")
            ref = float(np.median(next(iter(samples.values()))))
            flops = prefill_flops(dims, s) if dims is not None else None
            for (key, ms), a, e in zip(samples.items(), arts, engines):
                med = float(np.median(ms))
                gf = flops / (med / 1e3) / 1e9 if flops else None
                records.append({
                    "kind": "scaling", "schema": SCHEMA_VERSION, "seq_len": s, "n_items": n_items,
                    "model": str(a.path), "backend": e.name, "precision": str(a.precision), "flavour": a.flavour,
                    "engine_ms": summarize(ms, 2), "ratio_to_reference": round(ref / med, 3),
                    "gflops": None if gf is None else float(f"{gf:.4g}"),
                    "peak_fraction": None if gf is None or not peak_gflops else float(f"{gf / peak_gflops:.4g}"),
                })
    finally:
        for e in engines:
            e.deactivate()
    return records
