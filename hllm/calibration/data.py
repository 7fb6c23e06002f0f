"""Calibration sets: real slates encoded by the runtime's prompt builder, saved for reproducible builds.

Static INT8 / FP8 quantization needs activation ranges, measured by running the FP32 graph on
representative inputs (ONNX Runtime quantization guide,
https://onnxruntime.ai/docs/performance/model-optimizations/quantization.html). For hLLM the
representative input is a real slate, encoded exactly as at serving time: the same
:class:`hllm.runtime.prompt.PromptBuilder`, prompt spec and tokenizer as the exported graph.

A calibration set is ``count`` slates drawn without replacement with ``numpy.random.default_rng(seed)``
from a slates file (e.g. the *train* split), optionally skipping a list of slate ids; its files are
:mod:`hllm.formats.calibration_set` (``.npz`` arrays + ``.json`` record).

The fidelity gate (:mod:`hllm.verify.gate`) refuses evaluation slates whose ids appear here.
This module imports numpy only (no torch, no onnxruntime).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from hllm.errors import SlateError
from hllm.reading import sha256_file
from hllm.formats.calibration_set import FORMAT, CalibrationSet, arrays_sha256
from hllm.formats.graph import INPUT_NAMES, declared_inputs
from hllm.runtime.slates import slate_ids


def choose_slates(slates: Sequence[dict], count: int, seed: int, exclude_ids: Sequence[str] = ()) -> list[dict]:
    """Draw ``count`` slates without replacement, reproducibly.

    Args:
        slates: the pool (e.g. the train split), in file order.
        count: how many to draw (≥ 1).
        seed: seed of ``numpy.random.default_rng``; the same pool, count and seed give the same slates.
        exclude_ids: slate ids never to draw (e.g. the evaluation slates of the gate), by the one id rule
            (:func:`hllm.runtime.slates.slate_ids`: an id-less slate is its index in ``slates``).
    Returns: the drawn slates, each with its ``slate_id`` by that rule.
    Raises:
        SlateError: count < 1, or fewer than ``count`` eligible slates in the pool.
    """
    if count < 1:
        raise SlateError(f"calibration count must be ≥ 1, got {count}")
    banned = set(map(str, exclude_ids))
    pool = [(sid, s) for sid, s in zip(slate_ids(slates), slates) if sid not in banned]
    if len(pool) < count:
        raise SlateError(f"only {len(pool)} eligible slates for a calibration set of {count}")
    idx = np.random.default_rng(seed).choice(len(pool), size=count, replace=False)
    return [{**pool[int(i)][1], "slate_id": pool[int(i)][0]} for i in idx]


def build_calibration_set(
    slates: Sequence[dict],
    builder,
    count: int = 32,
    seed: int = 0,
    batch_size: int = 1,
    exclude_ids: Sequence[str] = (),
    source: str | os.PathLike | None = None,
    tokenizer_path: str | os.PathLike | None = None,
    graph_inputs: Sequence[str] = INPUT_NAMES,
) -> CalibrationSet:
    """Encode a reproducible random draw of real slates with the runtime's prompt builder.

    Args:
        slates: pool of slates (dicts in the JSONL format of :mod:`hllm.runtime.slates`).
        builder: the :class:`hllm.runtime.prompt.PromptBuilder` of the graph to quantize (use the
            export's prompt spec and tokenizer so calibration sees serving-time inputs).
        count, seed, exclude_ids: see :func:`choose_slates`.
        batch_size: slates per calibration batch (right-padded like serving batches).
        source: path of the slates file (recorded with its sha256).
        tokenizer_path: the tokenizer.json used (recorded with its sha256).
        graph_inputs: the graph's declared inputs (``Artefact.graph_inputs``): each batch is the feed dict
            of :func:`hllm.formats.graph.feed_dict`, so a context head's set holds ``context_positions``.
    Returns: a :class:`CalibrationSet` (not yet saved).
    Raises: SlateError (see :func:`choose_slates` and ``PromptBuilder.encode``); ShapeError (an unknown input).
    """
    if batch_size < 1:
        raise SlateError(f"calibration batch_size must be ≥ 1, got {batch_size}")
    chosen = choose_slates(slates, count, seed, exclude_ids)
    batches, shapes = [], []
    for i in range(0, len(chosen), batch_size):
        b = builder.encode(chosen[i : i + batch_size])
        batches.append(b.inputs(graph_inputs))
        shapes.append({"batch": int(b.input_ids.shape[0]), "seq": int(b.input_ids.shape[1]),
                       "items": int(b.item_mask.shape[1]), "lengths": b.lengths.tolist()})
    meta = {
        "format": FORMAT,
        "inputs": list(declared_inputs(graph_inputs)),
        "source": None if source is None else str(source),
        "source_sha256": sha256_file(source) if source is not None and Path(source).is_file() else None,
        "seed": int(seed),
        "count": int(count),
        "batch_size": int(batch_size),
        "excluded_ids": len(set(map(str, exclude_ids))),
        "slate_ids": slate_ids(chosen),
        "shapes": shapes,
        "prompt": builder.spec.to_dict(),
        "tokenizer_sha256": sha256_file(tokenizer_path) if tokenizer_path else None,
        "pad_id": int(builder.pad_id),
        "data_sha256": arrays_sha256(batches),
    }
    return CalibrationSet(batches, meta)
