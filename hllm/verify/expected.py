"""Parity against the trainer's own numbers, and which convention explains a mismatch.

hllm's parity compares hllm's engines with hllm's PyTorch reference; a trainer whose code read the
readout elsewhere, scored M transposed or decoded differently agrees with hllm's ranking on few
slates while every hllm gate passes. Only the team's own outputs can show it. The expected file is
made by the team's code:

* score matrices: ``.npz`` (read with ``allow_pickle=False``) holding ``slate_ids`` (``[S]`` strings) and
  ``scores`` (``[S, R, C]`` float; slate i's matrix is its first ``n_i`` rows — NaN padding allowed —, or,
  transposed, its first ``n_i`` columns);
* rankings: JSON Lines ``{"slate_id": …, "ranking": [...]}``, best first, as item indices (0-based) or
  the candidates' ``item_id`` strings.

When slates disagree, :func:`diagnose` recomputes hllm's scores or rankings under each common
convention mismatch and names the one that matches the team's numbers on every slate:

==================  ================================================================================
``transposed``      M stored as ``[K, N]`` (positions × items)
``minimised``       the assignment *minimises* Σ M (M used as a cost)
``rectangular``     the assignment over all K columns (``N × K``), not the first N
``separator``       readout at the separator token after each candidate, not the candidate's last token
``pre_norm``        the hidden state before the backbone's final norm (needs a PyTorch checkpoint)
``whole_string``    the prompt tokenised as one string (BPE merges across segment boundaries)
==================  ================================================================================
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from hllm.errors import HllmError
from hllm.runtime.decode import decode
from hllm.runtime.slates import slate_ids as _ids_of
from hllm.verify.parity import kendall_tau

#: Most bytes an expected file may have (a 1,118-slate 50×50 float64 npz is ~22 MB).
MAX_EXPECTED_BYTES = 1 << 30
CONVENTIONS = ("transposed", "minimised", "rectangular", "separator", "pre_norm", "whole_string")


class ExpectedError(HllmError):
    """An expected file that cannot be read or does not fit the slates (exit 2)."""


@dataclass
class Expected:
    """The team's numbers: ``scores[slate_id]`` (``[R, C]`` float64) or ``rankings[slate_id]`` (item indices)."""

    kind: str  # "scores" | "rankings"
    scores: dict[str, np.ndarray] = field(default_factory=dict)
    rankings: dict[str, list] = field(default_factory=dict)


def read_expected(path: str | Path) -> Expected:
    """Read an expected file (module doc). Raises ExpectedError naming the problem."""
    path = Path(path)
    if not path.is_file():
        raise ExpectedError(f"--expected {path}: not a file")
    if path.stat().st_size > MAX_EXPECTED_BYTES:
        raise ExpectedError(f"--expected {path}: over {MAX_EXPECTED_BYTES >> 20} MiB")
    if path.suffix == ".npz":
        from hllm.formats.npz import CheckedNpz

        # each member's header is checked before it is decompressed (a small compressed file can declare gigabytes)
        with CheckedNpz(path, ExpectedError, MAX_EXPECTED_BYTES) as z:
            ids, scores = z.get("slate_ids", ndim=1), z.get("scores", ndim=3)
        if len(ids) != len(scores) or scores.dtype.kind not in "fiu":
            raise ExpectedError(f"--expected {path}: scores must be [S, N, K] real numbers and slate_ids [S] "
                                f"(got {scores.shape} {scores.dtype} and {ids.shape})")
        keys = [s.decode("utf-8", "replace") if isinstance(s, bytes) else str(s) for s in ids.tolist()]
        _no_duplicate(keys, path)
        return Expected("scores", scores={k: scores[i].astype(np.float64) for i, k in enumerate(keys)})
    out = Expected("rankings")
    seen: list[str] = []
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    row = json.loads(line)
                    if not isinstance(row, dict) or not isinstance(row.get("ranking"), list) \
                            or isinstance(row.get("slate_id"), bool) or not isinstance(row.get("slate_id"), (str, int)):
                        raise ExpectedError(f"--expected {path} line {n}: an object with slate_id (a string) and "
                                            "ranking (a list) is needed")
                    seen.append(str(row["slate_id"]))
                    out.rankings[seen[-1]] = row["ranking"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ExpectedError(f"--expected {path}: not JSON Lines of rankings ({e})") from None
    _no_duplicate(seen, path)
    return out


def _no_duplicate(ids: list[str], path: Path) -> None:
    """Refuse a slate id given twice (which of the two is the trainer's is unknowable)."""
    if len(set(ids)) != len(ids):
        seen: set[str] = set()
        dup = next(i for i in ids if i in seen or seen.add(i))
        raise ExpectedError(f"--expected {path}: slate_id {dup!r} appears more than once")


@dataclass
class ExpectedSlate:
    """One slate: agreement of hllm's ranking with the team's, and max|ΔM| where scores were given."""

    slate_id: str
    agrees: bool
    kendall_tau: float
    max_abs_diff: float | None


@dataclass
class ExpectedReport:
    """``hllm parity --expected``: per-slate agreement, the share that agrees, max|ΔM|, and (when some
    slate disagrees) the convention that explains the team's numbers (``None``: none of them does;
    ``convention_agreement`` gives each one's share of agreeing slates)."""

    kind: str
    slates: list[ExpectedSlate]
    atol: float
    convention: str | None = None
    convention_agreement: dict[str, float] = field(default_factory=dict)

    @property
    def agreement(self) -> float:
        return float(np.mean([s.agrees for s in self.slates])) if self.slates else 0.0

    @property
    def passed(self) -> bool:
        return bool(self.slates) and all(s.agrees for s in self.slates)

    def to_dict(self) -> dict:
        diffs = [s.max_abs_diff for s in self.slates if s.max_abs_diff is not None]
        return {"expected_kind": self.kind, "slates": len(self.slates), "agreement": self.agreement,
                "max_abs_diff": max(diffs) if diffs else None, "atol": self.atol, "passed": self.passed,
                "convention": self.convention, "convention_agreement": self.convention_agreement,
                "per_slate": [asdict(s) for s in self.slates]}


def _ranking_of(expected: Expected, sid: str, slate: dict) -> list[int]:
    """The team's ranking of ``slate`` as item indices (item ids mapped through its candidates)."""
    r = expected.rankings[sid]
    ids = [c.get("item_id") for c in slate["candidates"]]
    if not all(isinstance(x, str) or (isinstance(x, int) and not isinstance(x, bool)) for x in r):
        bad = next(x for x in r if not isinstance(x, (str, int)) or isinstance(x, bool))
        raise ExpectedError(f"slate {sid}: the expected ranking holds {bad!r}; give item indices (integers, "
                            "0-based) or the candidates' item_id strings")
    try:
        out = [ids.index(x) if isinstance(x, str) else x for x in r]
    except ValueError:
        raise ExpectedError(f"slate {sid}: the expected ranking names items the slate does not have") from None
    if sorted(out) != list(range(len(ids))):
        raise ExpectedError(f"slate {sid}: the expected ranking is not a permutation of its {len(ids)} candidates")
    return out


def _compare(expected: Expected, sid: str, slate: dict, ours: np.ndarray, atol: float,
             decoder: Callable[[np.ndarray, int], np.ndarray] = decode, transposed: bool = False) -> ExpectedSlate:
    n = len(slate["candidates"])
    mine = decoder(ours, n)
    if expected.kind == "rankings":
        theirs = np.asarray(_ranking_of(expected, sid, slate))
        return ExpectedSlate(sid, bool(np.array_equal(mine, theirs)), kendall_tau(mine, theirs), None)
    m = expected.scores[sid]
    if min(m.shape) < n:
        raise ExpectedError(f"slate {sid}: the expected scores are {list(m.shape)}, but the slate has {n} candidates "
                            f"(a score matrix holds at least {n} × {n})")
    if not np.isfinite(m[:n, :n]).all():
        raise ExpectedError(f"slate {sid}: the expected scores hold NaN or infinity among its {n} × {n} scores "
                            "(NaN may only pad past them)")
    m = m[:, :n].T if transposed else m[:n]
    k = min(m.shape[1], ours.shape[1])
    if m.shape[0] != n or not np.isfinite(m[:, :k]).all():
        return ExpectedSlate(sid, False, -1.0, float("inf"))
    theirs = decode(m[:, :k], n)
    diff = float(np.abs(m[:, :k] - ours[:, :k]).max())
    return ExpectedSlate(sid, diff <= atol and bool(np.array_equal(mine, theirs)), kendall_tau(mine, theirs), diff)


def compare_expected(expected: Expected, slates: Sequence[dict], ours: Sequence[np.ndarray], atol: float = 1e-4,
                     **variant) -> list[ExpectedSlate]:
    """Compare hllm's score matrices ``ours[i]`` (``[n_i, K]``) with the team's on each slate.

    Raises: ExpectedError if a slate's id is not in the expected file (naming it).
    """
    out = []
    for sid, slate, m in zip(_ids_of(slates), slates, ours):
        if sid not in (expected.scores if expected.kind == "scores" else expected.rankings):
            raise ExpectedError(f"slate {sid} is not in the expected file (its slate_ids must name the slates given)")
        out.append(_compare(expected, sid, slate, m, atol, **variant))
    return out


def rectangular_decode(scores: np.ndarray, n: int) -> np.ndarray:
    """Ranking from the max-weight assignment of the n items to all K positions (scipy), best first."""
    from scipy.optimize import linear_sum_assignment

    rows, cols = linear_sum_assignment(scores[:n].astype(np.float64), maximize=True)
    return rows[np.argsort(cols)]


def diagnose(expected: Expected, slates: Sequence[dict], ours: Sequence[np.ndarray], rescore: Callable[[str], list | None],
             atol: float = 1e-4) -> tuple[str | None, dict[str, float]]:
    """The convention (:data:`CONVENTIONS`) under which hllm's numbers agree with the team's on every
    slate, and each convention's share of agreeing slates.

    ``rescore(name)`` returns hllm's score matrices recomputed under a convention that changes the
    inputs (``separator``, ``pre_norm``, ``whole_string``) or None when it cannot (e.g. ``pre_norm`` on
    an export); the decode-side conventions reuse ``ours``.
    """
    shares: dict[str, float] = {}
    for name in CONVENTIONS:
        if name == "transposed":
            if expected.kind != "scores":
                continue
            res = compare_expected(expected, slates, ours, atol, transposed=True)
        elif name == "minimised":
            res = compare_expected(expected, slates, [-m for m in ours], atol) if expected.kind == "rankings" else None
        elif name == "rectangular":
            res = compare_expected(expected, slates, ours, atol, decoder=rectangular_decode) \
                if expected.kind == "rankings" else None
        else:
            alt = rescore(name)
            res = None if alt is None else compare_expected(expected, slates, alt, atol)
        if res is not None:
            shares[name] = float(np.mean([r.agrees for r in res]))
    full = [n for n, s in shares.items() if s == 1.0]
    return (full[0] if full else None), shares


def _slate_batch(builder, slate: dict):
    return builder.encode([slate])


def _whole_string_batch(builder, slate: dict):
    """The slate's prompt text tokenised as ONE string; readout = the token holding each candidate's last
    character (the segments' texts are recovered by decoding hllm's own segment tokens)."""
    from hllm.runtime.prompt import Batch

    enc = builder.encode_one(slate)
    tok = builder.tokenizer
    text, ends, start = "", [], 0
    bounds = [enc.context_end] + list(enc.readout)
    pieces = [enc.ids[: enc.context_end + 1]]
    sep = len(builder._sep_ids)
    for i, r in enumerate(enc.readout):
        begin = bounds[i] + 1 + (sep if i else 0)
        pieces.append(enc.ids[begin: r + 1])
    for i, piece in enumerate(pieces):
        text += tok.decode(piece, skip_special_tokens=False)
        if i:
            ends.append(len(text))
            text += builder.spec.separator
    full = tok.encode(text, add_special_tokens=False)
    readout = [next(t for t, (s, e) in enumerate(full.offsets) if e >= end and s < end) for end in ends]
    ctx = next((t for t, (s, e) in enumerate(full.offsets) if e >= len(tok.decode(pieces[0]))), 0)
    ids = np.asarray([full.ids], dtype=np.int64)
    n = len(readout)
    return Batch(ids, np.asarray([readout], np.int64), np.ones((1, n), bool), np.asarray([ids.shape[1]]),
                 np.asarray([n]), [[]], [0], np.asarray([ctx], np.int64))


def rescorer(engine, builder, slates: Sequence[dict]) -> Callable[[str], list | None]:
    """``rescore(name)`` for :func:`diagnose`: hllm's score matrices (``[n_i, K]`` per slate) with the
    inputs of a convention: ``separator`` (readout at the last separator token), ``whole_string``, and
    ``pre_norm`` (only for the PyTorch engine, whose model is at hand; None otherwise)."""
    from hllm.runtime.ranker import slate_scores

    def run(make_batch, shift: int = 0) -> list[np.ndarray]:
        out = []
        for s in slates:
            b = make_batch(builder, s)
            b.readout_positions = np.where(b.item_mask, b.readout_positions + shift, 0)
            out.extend(slate_scores(engine, b))
        return out

    def rescore(name: str):
        if name == "separator":
            return run(_slate_batch, len(builder._sep_ids)) if builder._sep_ids else None
        if name == "whole_string":
            return run(_whole_string_batch)
        if name == "pre_norm":
            model = getattr(engine, "model", None)
            return None if model is None else _pre_norm_scores(model, builder, slates)
        return None

    return rescore


def _pre_norm_scores(model, builder, slates: Sequence[dict]) -> list[np.ndarray]:
    """Scores from the hidden state entering the final norm (:func:`hllm.model.hllm.run_layers`)."""
    import torch

    from hllm.model.hllm import run_layers

    out = []
    with torch.inference_mode():
        for s in slates:
            b = builder.encode([s])
            t = {k: torch.from_numpy(getattr(b, k)) for k in ("input_ids", "readout_positions", "item_mask",
                                                                "context_positions")}
            h = run_layers(model.backbone, t["input_ids"], 0, model.num_layers)
            m = model.score_hidden(h, t["readout_positions"], t["item_mask"], t["context_positions"])
            out.append(m[0, : int(b.n_items[0])].float().numpy())
    return out
