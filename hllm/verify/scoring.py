"""The one "encode → engines → real rows" loop of the verifiers (torch-free).

Parity, the reduced-precision gate, the merge self-check and the LAP benchmark all need the score
matrices of one or more engines on the *same* encoded slates. :func:`score_slates` encodes each batch
once with one prompt builder and runs every engine on it, cutting each slate's real rows
(:func:`hllm.runtime.ranker.slate_scores`).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from hllm.engines.base import Engine
from hllm.runtime.prompt import PromptBuilder
from hllm.runtime.ranker import slate_scores


def score_slates(
    engines: Sequence[Engine],
    builder: PromptBuilder,
    slates: Sequence[dict],
    batch_size: int = 1,
    on_progress: Callable[[int], None] | None = None,
) -> list[list[np.ndarray]]:
    """Score matrices of every engine on every slate.

    Args:
        engines: engines to run (activated here if they are not; left active).
        builder: encodes each batch ONCE for all engines (identical inputs).
        slates: the slates. batch_size: slates per engine call (≥ 1).
        on_progress: called with the number of slates after each batch.
    Returns: ``out[e][i]`` = engine e's ``[n_i, K]`` float32 matrix of slate i.
    Raises: SlateError (encoding), ShapeError / EngineError (an engine).
    """
    out: list[list[np.ndarray]] = [[] for _ in engines]
    for e in engines:
        e.activate()
    step = max(1, int(batch_size))
    for i in range(0, len(slates), step):
        chunk = slates[i : i + step]
        batch = builder.encode(chunk)
        for e, acc in zip(engines, out):
            acc.extend(slate_scores(e, batch))
        if on_progress:
            on_progress(len(chunk))
    return out
