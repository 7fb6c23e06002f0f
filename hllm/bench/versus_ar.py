"""hLLM single pass vs greedy autoregressive ranking on the same backbone and slates (paper Table 2).

(a) hLLM: :meth:`hllm.runtime.Ranker.rank_batch` — one prefill pass, readout, head, LAPJV.
(b) autoregressive: :class:`hllm.teacher.ArRanker` — greedy decoding with KV cache of the candidate
    numbers, ``constrained`` (a logits processor keeps the output inside the ordinal grammar until
    all N numbers are out, as a teacher fine-tuned for the format would) and unconstrained (stops
    where the model stops; the output is parsed and counted invalid if it is not a full permutation).

Per slate the three (or more, with several hLLM models) are run interleaved with a rotating order,
after one warm-up call each on a separate, shorter slate (:data:`WARMUP_ITEMS` candidates), so the speed-up is a ratio measured side by side.
Wall times include prompt building and tokenization on both sides.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Sequence

import numpy as np

from hllm.bench import SCHEMA_VERSION
from hllm.runtime import Ranker
from hllm.runtime.slates import subslate
from hllm.measure import summarize
from hllm.teacher import ArRanker

#: Candidates of the warm-up slate (a short one: the warm-up loads kernels, it is not measured).
WARMUP_ITEMS = 10


def bench_versus_ar(
    hllm_models: Sequence[str | os.PathLike],
    ar_model: str | os.PathLike,
    slates: Sequence[dict],
    n_items: int = 50,
    threads: int | None = None,
    unconstrained: bool = True,
    on_call: Callable[[str], None] | None = None,
) -> dict:
    """Rank each slate (cut to ``n_items``) with every hLLM model and with the AR teacher.

    Args:
        hllm_models: hLLM artefacts (checkpoint / export); the first is the one ``speedup`` uses.
        ar_model: Hugging Face causal LM directory of the same backbone (e.g. ``work/smollm2``).
        slates: real slates; ``slates[0]`` (cut to :data:`WARMUP_ITEMS`) is used for warm-up only, the
            rest are measured.
        threads: intra-op threads for every engine and for torch.
        unconstrained: also run unconstrained greedy decoding (invalid-output rate).
    Returns:
        a record with ``kind="versus_ar"``, ``n_items``, ``slates`` (measured), ``hllm_ms``, ``ar_ms``
        (constrained, medians over slates), ``ar_decode_passes`` (median generated tokens),
        ``speedup`` (median over slates of ar/hllm), ``per_slate`` details, ``hllm_backends``,
        and for unconstrained decoding ``ar_unconstrained_ms``, ``ar_unconstrained_decode_passes``,
        ``ar_unconstrained_invalid_rate`` (fraction of slates whose output is not a valid ranking).
    Raises: HllmError from loading/running; SlateError if a slate has fewer than ``n_items`` candidates.
    """
    if len(slates) < 2:
        from hllm.errors import SlateError

        raise SlateError("need at least 2 slates (one warm-up, one measured)")
    subs = [subslate(s, n_items) for s in slates]
    rankers = []
    for path in hllm_models:
        r = Ranker.from_path(path, threads=threads)
        r.engine.activate()
        rankers.append((f"hllm:{r.engine.name}", r))
    ar = ArRanker(ar_model, threads=threads)

    def run_hllm(r, s):
        t0 = time.perf_counter()
        st = r.rank_batch([s]).times
        return {"ms": (time.perf_counter() - t0) * 1e3, "engine_ms": st.engine_ms, "lapjv_ms": st.decode_ms}

    def run_ar(constrained, s):
        t0 = time.perf_counter()
        res = ar.rank(s, constrained=constrained)
        return {"ms": (time.perf_counter() - t0) * 1e3, "decode_passes": res.decode_passes,
                "prefill_tokens": res.prefill_tokens, "valid": res.valid, "invalid": res.invalid,
                "repeated": res.repeated, "missing": res.missing, "raw_text": res.raw_text[:200]}

    calls: dict[str, Callable[[dict], dict]] = {name: (lambda s, r=r: run_hllm(r, s)) for name, r in rankers}
    calls["ar_constrained"] = lambda s: run_ar(True, s)
    if unconstrained:
        calls["ar_unconstrained"] = lambda s: run_ar(False, s)

    try:
        per_slate = _interleaved(calls, subs, slates[0], n_items, rankers[0][1], on_call)
    finally:
        for _, r in rankers:
            r.engine.deactivate()
    return _summary(per_slate, rankers, hllm_models, ar_model, n_items, unconstrained)


def _interleaved(calls: dict, subs: list[dict], first: dict, n_items: int, ranker, on_call) -> list[dict]:
    """Warm every contender up on a short cut of ``first``, then run them on each measured slate
    (``subs[1:]``), rotating their order slate by slate."""
    warm = subslate(first, min(n_items, WARMUP_ITEMS))
    for name, fn in calls.items():  # warm-up on slate 0, cut short (discarded)
        fn(warm)
        if on_call:
            on_call(f"warm-up {name}")
    per_slate = []
    names = list(calls)
    for i, s in enumerate(subs[1:]):
        k = i % len(names)
        row = {"slate_id": s.get("slate_id"), "order": names[k:] + names[:k]}
        for name in row["order"]:
            row[name] = calls[name](s)
            if on_call:
                on_call(name)
        row["hllm_prompt_tokens"] = int(ranker.builder.encode([s]).lengths[0])
        per_slate.append(row)
    return per_slate


def _summary(per_slate: list[dict], rankers, hllm_models, ar_model, n_items: int, unconstrained: bool) -> dict:
    """The ``versus_ar`` record (see :func:`bench_versus_ar`) from the per-slate rows."""
    main = rankers[0][0]
    hl = [row[main]["ms"] for row in per_slate]
    arc = [row["ar_constrained"]["ms"] for row in per_slate]
    out = {
        "kind": "versus_ar",
        "schema": SCHEMA_VERSION,
        "n_items": n_items,
        "slates": len(per_slate),
        "warmup": 1,
        "warmup_items": min(n_items, WARMUP_ITEMS),
        "hllm_model": str(hllm_models[0]),
        "ar_model": str(ar_model),
        "hllm_backends": {name: summarize([row[name]["ms"] for row in per_slate], 1) for name, _ in rankers},
        "hllm_ms": round(float(np.median(hl)), 1),
        "hllm_prompt_tokens": round(float(np.mean([row["hllm_prompt_tokens"] for row in per_slate])), 1),
        "ar_ms": round(float(np.median(arc)), 1),
        "ar_ms_stats": summarize(arc, 1),
        "ar_decode_passes": float(np.median([row["ar_constrained"]["decode_passes"] for row in per_slate])),
        "ar_prefill_tokens": round(float(np.mean([row["ar_constrained"]["prefill_tokens"] for row in per_slate])), 1),
        "ar_constrained_valid_rate": float(np.mean([row["ar_constrained"]["valid"] for row in per_slate])),
        "speedup": round(float(np.median(np.asarray(arc) / np.asarray(hl))), 2),
        "speedup_of_medians": round(float(np.median(arc) / np.median(hl)), 2),
        "per_slate": per_slate,
    }
    if unconstrained:
        un = [row["ar_unconstrained"] for row in per_slate]
        out.update({
            "ar_unconstrained_ms": round(float(np.median([u["ms"] for u in un])), 1),
            "ar_unconstrained_decode_passes": float(np.median([u["decode_passes"] for u in un])),
            "ar_unconstrained_invalid_rate": round(1.0 - float(np.mean([u["valid"] for u in un])), 3),
            "ar_unconstrained_missing_mean": round(float(np.mean([u["missing"] for u in un])), 1),
            "speedup_vs_unconstrained": round(float(np.median(np.asarray([u["ms"] for u in un]) / np.asarray(hl))), 2),
        })
    return out
