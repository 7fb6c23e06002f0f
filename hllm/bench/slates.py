"""Sub-slates of N candidates cut from real slates (torch-free).

The Beauty slates hold 50 candidates with one positive. The latency of hLLM at N ∈ {10, 25, 50}
is measured on sub-slates: the first N candidates in the slate's own order, with the positive(s)
kept (replacing the last kept negatives) so that every sub-slate is still a ranking task.
"""

from __future__ import annotations

from hllm.errors import SlateError


def subslate(slate: dict, n: int) -> dict:
    """The slate restricted to ``n`` of its candidates (a new dict; the input is not changed).

    Keeps the candidates' original order; labels (when present) follow their candidates; every
    positive (label 1) is kept while it fits, dropping the latest negatives to make room. ``slate_id``
    gets the suffix ``@n``.

    Raises: SlateError if ``n < 1`` or the slate has fewer than ``n`` candidates.
    """
    cands = slate.get("candidates") or []
    if n < 1 or n > len(cands):
        raise SlateError(f"slate {slate.get('slate_id', '?')}: cannot take {n} of {len(cands)} candidates")
    labels = slate.get("labels")
    pos = [i for i, y in enumerate(labels or []) if y]
    keep = list(range(n))
    missing = [i for i in pos if i >= n][: n]
    if missing:
        negatives = [i for i in keep if i not in pos]
        drop = set(negatives[len(negatives) - len(missing):])
        keep = sorted([i for i in keep if i not in drop] + missing)[:n]
    out = dict(slate)
    out["candidates"] = [cands[i] for i in keep]
    if labels is not None:
        out["labels"] = [labels[i] for i in keep]
    out["slate_id"] = f"{slate.get('slate_id', '?')}@{n}"
    return out


def subslates(slates: list[dict], n: int) -> list[dict]:
    """:func:`subslate` of each slate."""
    return [subslate(s, n) for s in slates]
