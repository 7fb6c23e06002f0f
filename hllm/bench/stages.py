"""Per-stage latency of the runtime on real sub-slates (paper Table 5 on this machine), torch-free.

For each model (checkpoint → PyTorch engine, export → ONNX Runtime, ``.plan`` → TensorRT), each
slate size N and batch size B, :meth:`hllm.runtime.Ranker.rank_batch` is called on real sub-slates
(:func:`hllm.runtime.slates.subslate`); its own stage clock gives

* ``prompt``: prompt building + tokenization (:class:`PromptBuilder.encode`),
* ``engine``: the engine call (input checks, prefill, readout gather, head; :meth:`Engine.run`),
* ``decode_output``: LAPJV decode of every slate + building the :class:`Ranking` objects,
* ``total``: their sum,

and, on the same score matrices right after each call, ``lapjv``: :func:`decode_batch` alone (the
runtime's real solve path, µs per slate) and ``engine_io``: the engine wrapper's numpy-side input
checks (:func:`hllm.engines.base.check_inputs`). Models are run interleaved (each round runs every
model once, rotating the order) after separate warm-up calls, so their ratios are fair on a busy
machine. ``overhead_fraction`` = (prompt + decode_output + engine_io) / total, from medians.

Throughput: ``tokens_per_s`` = real prompt tokens / engine seconds; ``gflops`` = prefill FLOPs of the
real tokens (:func:`hllm.measure.prefill_flops`) / engine seconds, compared with the fp32
GEMM peak measured in the same run (``peak_fraction``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from hllm.bench import SCHEMA_VERSION
from hllm.engines.base import check_inputs
from hllm.errors import HllmError
from hllm.formats.checkpoint import load_manifest
from hllm.measure import prefill_flops, summarize
from hllm.runtime import Ranker
from hllm.runtime.artefact import resolve
from hllm.runtime.decode import decode_batch
from hllm.runtime.slates import subslate

STAGES = ("prompt", "engine", "decode_output", "total")


def model_dims(model: str | os.PathLike):
    """Backbone dimensions of a checkpoint, or of an export's source checkpoint; None if unknown."""
    try:
        art = resolve(model)
        if art.kind == "checkpoint":
            return load_manifest(art.path).dims
        src = (art.meta.get("source_checkpoint") or {}).get("path")
        return load_manifest(src).dims if src and Path(src).is_dir() else None
    except HllmError:
        return None


@dataclass
class _Contender:
    label: str
    path: str
    ranker: object
    dims: object
    load_s: float
    precision: str = "fp32"
    flavour: str | None = None
    samples: dict = field(default_factory=dict)


def _batches(slates: Sequence[dict], n: int, batch_size: int, count: int) -> list[list[dict]]:
    """``count`` batches of ``batch_size`` consecutive sub-slates of size n, cycling over ``slates``."""
    subs = [subslate(s, n) for s in slates]
    out = []
    for r in range(count):
        out.append([subs[(r * batch_size + j) % len(subs)] for j in range(batch_size)])
    return out


def bench_stages(
    models: Sequence[str | os.PathLike],
    slates: Sequence[dict],
    n_items: Sequence[int] = (10, 25, 50),
    batch_sizes: Sequence[int] = (1,),
    runs: int = 3,
    warmup: int = 1,
    threads: int | None = None,
    peak_gflops: float | None = None,
    on_call: Callable[[str], None] | None = None,
    configs: Sequence[tuple[int, int]] | None = None,
) -> list[dict]:
    """Per-stage timings: one record per (model, N, batch size).

    Args:
        models: paths (checkpoint dir, export dir / ``.onnx``, ``.plan``), run interleaved.
        slates: real slates with at least ``max(n_items)`` candidates each.
        n_items / batch_sizes: the grid (every N × every B) unless ``configs`` lists (N, B) pairs.
        runs: measured calls per model and configuration (``warmup`` more are discarded first).
        threads: engine intra-op threads (None = engine default).
        peak_gflops: the machine's measured fp32 GEMM peak (for ``peak_fraction``).
        on_call: progress callback, called with a label after every engine call.
    Returns:
        records with keys ``kind, schema, model, backend, precision, flavour, n_items, batch_size, runs, warmup,
        stage_ms`` (per-stage medians, ms per call), ``stage_stats`` (full statistics),
        ``lapjv_us`` (per slate), ``engine_io_ms``, ``overhead_fraction``, ``prompt_tokens_mean``,
        ``tokens_per_s``, ``gflops``, ``peak_fraction``, ``load_s``.
    Raises: HllmError subclasses from loading or running a model; SlateError if a slate is too small.
    """
    opened: list[_Contender] = []
    for path in models:
        art = resolve(path)
        t0 = time.perf_counter()
        ranker = Ranker.from_path(path, threads=threads)
        ranker.engine.activate()
        opened.append(_Contender(f"{ranker.engine.name}:{path}", str(path), ranker, model_dims(path),
                                 time.perf_counter() - t0, str(art.precision), art.flavour))
    grid = list(configs) if configs else [(n, b) for n in n_items for b in batch_sizes]
    records = []
    try:
        for n, b in grid:
            batches = _batches(slates, n, b, warmup + runs)
            for m in opened:  # warm-up, separate per model
                for i in range(warmup):
                    m.ranker.rank_batch(batches[i])
                    if on_call:
                        on_call(f"warm-up {m.ranker.engine.name} N={n} B={b}")
                m.samples = {k: [] for k in (*STAGES, "lapjv_us", "engine_io", "tokens", "flops")}
            for r in range(runs):
                k = r % len(opened)
                for m in opened[k:] + opened[:k]:
                    _measure(m, batches[warmup + r])
                    if on_call:
                        on_call(f"{m.ranker.engine.name} N={n} B={b}")
            for m in opened:
                records.append(_record(m, n, b, runs, warmup, peak_gflops))
    finally:
        for m in opened:
            m.ranker.engine.deactivate()
    return records


def _measure(m: "_Contender", batch: list[dict]) -> None:
    """One measured call of model ``m`` on ``batch``: its stage clock, plus the input check and the
    LAPJV decode timed on their own; appended to ``m.samples``."""
    res = m.ranker.rank_batch(batch)
    st = res.times
    enc = m.ranker.builder.encode(batch)  # same inputs again, for the io-check timing
    scores = np.zeros((*enc.item_mask.shape, m.ranker.engine.num_positions), dtype=np.float32)
    for j, sj in enumerate(res.scores):  # the padded [B, N, K] the engine returned
        scores[j, : len(sj)] = sj
    t0 = time.perf_counter()
    check_inputs(enc.input_ids, enc.readout_positions, enc.item_mask)
    np.asarray(scores, dtype=np.float32)
    io = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    decode_batch(scores, enc.n_items)
    lap_us = (time.perf_counter() - t0) * 1e6 / len(batch)
    s = m.samples
    for key, v in (("prompt", st.prompt_ms), ("engine", st.engine_ms), ("decode_output", st.decode_ms),
                   ("total", st.total_ms), ("lapjv_us", lap_us), ("engine_io", io), ("tokens", int(enc.lengths.sum()))):
        s[key].append(v)
    if m.dims is not None:
        s["flops"].append(sum(prefill_flops(m.dims, L) for L in enc.lengths))


def _record(m: _Contender, n: int, b: int, runs: int, warmup: int, peak: float | None) -> dict:
    s = m.samples
    stats = {k: summarize(s[k], 3) for k in STAGES}
    med = {k: v["median"] for k, v in stats.items()}
    io = summarize(s["engine_io"], 4)
    eng_s = np.asarray(s["engine"]) / 1e3
    tok_s = float(np.median(np.asarray(s["tokens"]) / eng_s))
    gflops = float(np.median(np.asarray(s["flops"]) / eng_s / 1e9)) if s["flops"] else None
    overhead = (med["prompt"] + med["decode_output"] + io["median"]) / med["total"]
    return {
        "kind": "stages",
        "schema": SCHEMA_VERSION,
        "model": m.path,
        "backend": m.ranker.engine.name,
        "precision": m.precision,
        "flavour": m.flavour,
        "n_items": n,
        "batch_size": b,
        "runs": runs,
        "warmup": warmup,
        "stage_ms": {**med, "lapjv": round(float(np.median(s["lapjv_us"])) * b / 1e3, 4), "engine_io": io["median"]},
        "stage_stats": stats,
        "lapjv_us": summarize(s["lapjv_us"], 2),
        "engine_io_ms": io,
        "overhead_fraction": round(overhead, 5),
        "prompt_tokens_mean": round(float(np.mean(s["tokens"])) / b, 1),
        "tokens_per_s": round(tok_s, 1),
        "gflops": round(gflops, 3) if gflops is not None else None,
        "peak_fraction": round(gflops / peak, 4) if gflops is not None and peak else None,
        "load_s": round(m.load_s, 2),
    }
