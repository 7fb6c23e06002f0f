"""Ranking quality of several rankers side by side on the same labelled slates (``hllm eval``).

A ranker is named by a spec: ``random`` (seeded permutations), a checkpoint directory (PyTorch
reference; with a feature cache only the layers above it run), an export directory / ``.onnx`` /
``.plan`` (:meth:`hllm.runtime.Ranker.from_path`), or a JSONL with ``slate_id`` + ``order`` per slate
(``hllm teacher`` or ``hllm rank`` output). ``NAME=SPEC`` names the row. A slate is looked up in a JSONL by
:func:`hllm.runtime.slates.slate_id` (its ``slate_id``, else its index in the slates file: the name
``hllm rank`` gives it), and every JSONL is checked to cover every slate before any ranker runs. Metrics come from
:mod:`hllm.verify.metrics`, each with a 95% bootstrap interval over slates; every ranker after the first
also gets its paired difference to the first (:func:`hllm.verify.metrics.paired_difference`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from hllm.errors import SlateError

Progress = Callable[[str, int], Callable[[int], None]]


def _no_bar(_desc: str, _total: int) -> Callable[[int], None]:
    return lambda n: None


def parse_spec(spec: str) -> tuple[str, str]:
    """``NAME=SPEC`` → (NAME, SPEC); a bare spec is its own name."""
    name, _, src = spec.partition("=") if "=" in spec else (spec, "", spec)
    return name, src


def is_orders_file(src: str) -> bool:
    """Whether a ranker spec's source is a JSONL of orders (``.jsonl`` / ``.jsonl.gz`` file)."""
    p = Path(src)
    return p.is_file() and (p.name.endswith(".jsonl") or p.name.endswith(".jsonl.gz"))


def jsonl_orders(path: str | Path, slates: Sequence[dict]) -> list[list[int]]:
    """Each slate's order from a JSONL of ``{slate_id, order}`` records (``hllm rank`` / ``hllm teacher``
    output), looked up by :func:`hllm.runtime.slates.slate_id` (an id-less slate by its index).

    Raises: SlateError naming the file and how many slates (and the first) it has no ranking for, or two
        slates with the same id (which ranking is whose is unknowable).
    """
    from hllm.runtime.slates import slate_ids
    from hllm.training.targets import read_teacher

    ids = slate_ids(slates)
    seen: set[str] = set()
    twice = next((i for i in ids if i in seen or seen.add(i)), None)
    if twice is not None:
        raise SlateError(f"two slates are named {twice!r} (a slate_id, or the index of a slate without one): a ranking "
                         f"in {path} cannot be matched to one of them; give the slates distinct slate_ids")
    teacher = read_teacher(path)
    missing = [i for i in ids if i not in teacher]
    if missing:
        raise SlateError(f"{path} has no ranking for {len(missing)} of the {len(slates)} slates (first: {missing[0]}); "
                         "rank the same slates or lower --limit")
    return [teacher[i] for i in ids]


def ranker_orders(spec: str, slates: Sequence[dict], seed: int = 0, batch_size: int = 1,
                  features: Path | None = None, progress: Progress = _no_bar,
                  orders: list[list[int]] | None = None, artefact=None) -> tuple[str, str, list[list[int]]]:
    """(name, kind, orders) of one ranker spec on ``slates`` (orders: best-first candidate indices).

    ``orders``: a JSONL ranker's orders already read (:func:`jsonl_orders`), not read again; ``artefact``:
    a model ranker's :class:`hllm.runtime.artefact.Artefact` already resolved.
    Raises: SlateError (a JSONL lacking some slate), EngineError / CheckpointError (a model path).
    """
    name, src = parse_spec(spec)
    if src == "random":
        rng = np.random.default_rng(seed)
        return name, "random", [rng.permutation(len(s["candidates"])).tolist() for s in slates]
    p = Path(src)
    if is_orders_file(src):
        return name, "jsonl", orders if orders is not None else jsonl_orders(p, slates)
    from hllm.runtime.artefact import resolve
    from hllm.runtime.ranker import Ranker

    art = artefact if artefact is not None else resolve(p)
    kind = art.kind
    advance = progress(f"ranking with {name}", len(slates))
    if features is not None and kind == "checkpoint":
        from hllm.runtime.decode import decode
        from hllm.runtime.slates import slate_ids
        from hllm.training.features import FeatureCache, scores_from_cache

        ids = slate_ids(slates)
        scores = scores_from_cache(p, FeatureCache.open(features), ids, on_progress=lambda done, total: advance(1),
                                   slates=slates)
        return name, "checkpoint+features", [decode(m, len(s["candidates"])).tolist() for s, m in zip(slates, scores)]
    with Ranker.from_path(art, batch_size=batch_size) as ranker:
        return name, kind, [r.order for r in ranker.rank(slates, on_progress=advance)]


def subset_record(slates: Sequence[dict], slates_file: str) -> dict:
    """Which slates were evaluated: count, first and last id, sha256 of the ids (one per line)."""
    from hllm.runtime.slates import slate_ids

    ids = slate_ids(slates)
    return {"first": len(ids), "slate_ids_sha256": hashlib.sha256("\n".join(ids).encode()).hexdigest(),
            "first_id": ids[0] if ids else None, "last_id": ids[-1] if ids else None}


def evaluate_rankers(specs: Sequence[str], slates: Sequence[dict], slates_file: str = "", seed: int = 0,
                     batch_size: int = 1, features: Path | None = None, progress: Progress = _no_bar,
                     on_ranker: Callable[[str, dict, dict], None] | None = None) -> dict:
    """Metrics of every ranker on the same slates.

    Returns ``{slates_file, subset, random_seed, features, rankers: {name: QualityReport dict + kind,
    source}}``; rows after the first also hold ``paired_vs_first`` = ``{baseline, delta, slates, ci95}``
    (this ranker minus the first, slate by slate, 95% paired bootstrap interval).
    ``on_ranker(name, row, result so far)`` is called after each ranker (to save partial results).
    Raises: SlateError if a slate has no labels; HllmError if two rankers have the same name (the second
        row would replace the first).
    """
    from hllm.errors import HllmError
    from hllm.verify.metrics import evaluate, paired_difference

    names = [parse_spec(s)[0] for s in specs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise HllmError(f"ranker name {twice[0]!r} is given more than once; name the rows apart with NAME=SPEC "
                        f"(e.g. a={twice[0]} b={twice[0]})")
    if any(s.get("labels") is None for s in slates):
        raise SlateError(f"{slates_file or 'slates'}: every slate needs labels for eval")
    result = {"slates_file": slates_file, "subset": subset_record(slates, slates_file), "random_seed": seed,
              "features": str(features) if features else None, "rankers": {}}
    labels = [s["labels"] for s in slates]
    # before any ranker runs: every JSONL covers every slate, every model path is an artefact
    from hllm.runtime.artefact import resolve

    read, arts = {}, {}
    for spec in specs:
        src = parse_spec(spec)[1]
        if is_orders_file(src):
            read[spec] = jsonl_orders(src, slates)
        elif src != "random":
            arts[spec] = resolve(src)
    first: tuple[str, list[list[int]]] | None = None
    for spec in specs:
        name, kind, orders = ranker_orders(spec, slates, seed, batch_size, features, progress, read.get(spec),
                                           arts.get(spec))
        row = evaluate(orders, labels).to_dict()
        row.update(kind=kind, source=parse_spec(spec)[1])
        if first is None:
            first = (name, orders)
        else:
            row["paired_vs_first"] = {"baseline": first[0], **paired_difference(first[1], orders, labels).to_dict()}
        result["rankers"][name] = row
        if on_ranker:
            on_ranker(name, row, result)
    return result
