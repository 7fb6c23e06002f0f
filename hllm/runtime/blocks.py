"""Ranking lists longer than the head's K (or whose prompt is over ``max_seq_len``) in blocks, torch-free.

A head with K rank positions scores at most K candidates in one prompt of at most ``max_seq_len`` tokens
(paper §3). A longer slate is ranked in two rounds (:class:`BlockOptions`, ``method="anchors"``, the
shipped method):

* **Round A** — the candidates are split into B blocks, each of at most ``K − a`` candidates plus the same
  ``a`` *anchor* candidates (the first ``a`` candidates in input order) and the same user context, and
  the B blocks are scored in one batched engine pass. Non-anchor candidate ``j`` (in input order) goes
  to block ``j mod B`` (strided, so every block is a sample of the whole list even when the input order is
  a first-stage ranking); inside a block candidates keep their input order. Each candidate gets its
  block's Sinkhorn soft rank (:func:`hllm.runtime.decode.soft_rank`: ``1 − E[position] / (n_b − 1)``,
  the quantity ``relevance_score`` of the rerank API is made of). Blocks are then aligned: block ``b`` is
  shifted by ``δ_b = mean_b'(m_b') − m_b``, ``m_b`` the mean soft rank of the anchors in block ``b``,
  so that the anchors' mean agrees across blocks (an anchor's aligned score is its mean over blocks).
* **Round B** — the best K candidates by aligned score (fewer if their prompt would be over
  ``max_seq_len``) are ranked in ONE normal pass, in input order, decoded by LAPJV (paper §3.4); the
  rest follow in aligned round-A order. Ties are broken by input order: the result is deterministic.

The published alternative behind the internal switch ``method="jointrank"`` is JointRank (Dedov, 2025,
"JointRank: Rank Large Sets with Single Pass LLM Ranking", arXiv:2506.22262): overlapping blocks (each
candidate in ``replication`` blocks; the r-th copy of the list is a fixed permutation of it), every
block decoded by LAPJV, and the candidates ordered by their win rate over the pairwise outcomes the
block rankings imply. Round B (``refine``) applies to both; ``refine=False`` returns round A's order.

A slate of more than ``max_documents`` candidates is refused (:class:`TooManyDocuments`, a SlateError
naming the limit). A slate that fits one prompt (``N ≤ K`` and the prompt within ``max_seq_len``) is
encoded by :meth:`PromptBuilder.encode_one` exactly as before. Engine work of a blocked slate: B + 1
rows (:attr:`BlockedSlate.work`); the server's micro-batcher counts it so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from hllm.errors import DecodeError, HllmError, SlateError
from hllm.runtime.decode import assignment_scores, decode, monotone_scores, soft_rank
from hllm.runtime.prompt import EncodedSlate, PromptBuilder, PromptTooLong
from hllm.runtime.slates import take

#: The most candidates one slate may have (``BlockOptions.max_documents`` default).
MAX_DOCUMENTS = 1000
#: Anchor candidates per block of the shipped method.
ANCHORS = 5
METHODS = ("anchors", "jointrank")


class TooManyDocuments(SlateError):
    """A slate has more candidates than ``max_documents`` (the message names the limit)."""


@dataclass(frozen=True)
class BlockOptions:
    """How a :class:`~hllm.runtime.ranker.Ranker` ranks a slate that does not fit one prompt.

    Attributes:
        method: ``anchors`` (shipped) or ``jointrank`` (the published alternative; module doc).
        anchors: anchor candidates per block (``anchors`` method; fewer when the head or prompt is small).
        max_documents: most candidates in one slate (more → :class:`TooManyDocuments`).
        refine: run round B (the best K in one normal pass); False = round A's order only.
        replication: blocks each candidate is in (``jointrank``, ≥ 2).
        rows_per_call: most prompts in one engine call (bounds memory as the server's default
            ``max_batch_slates`` does: 8 prompts of up to ``max_seq_len`` tokens).
    Raises: HllmError for a value out of range.
    """

    method: str = "anchors"
    anchors: int = ANCHORS
    max_documents: int = MAX_DOCUMENTS
    refine: bool = True
    replication: int = 2
    rows_per_call: int = 8

    def __post_init__(self):
        if self.method not in METHODS:
            raise HllmError(f"block method must be one of {METHODS}, got {self.method!r}")
        if self.anchors < 0 or self.max_documents < 1 or self.replication < 2 or self.rows_per_call < 1:
            raise HllmError(f"bad block options {self}")


@dataclass(frozen=True)
class BlockedSlate:
    """A slate to be ranked in blocks: its plan and its round-A prompts.

    Attributes:
        slate: the (validated) slate. n: its candidates. method: ``anchors`` or ``jointrank``.
        anchors: anchor candidate indices (in every block; empty for jointrank).
        blocks: candidate indices (input order) of each block's prompt.
        rows: :meth:`PromptBuilder.encode_one` of each block (``rows[b]`` ↔ ``blocks[b]``).
        lengths: estimated prompt tokens of each candidate (for round B's fit). context_tokens: the
            user context's tokens. max_seq_len / k: the limits the plan was made for.
        truncated: candidate indices (of the whole slate) cut to the token budget.
        history_dropped: history items dropped to fit the budget.
    """

    slate: dict
    n: int
    method: str
    anchors: list[int]
    blocks: list[list[int]]
    rows: list[EncodedSlate]
    lengths: list[int]
    context_tokens: int
    max_seq_len: int
    k: int
    truncated: list[int] = field(default_factory=list)
    history_dropped: int = 0

    @property
    def work(self) -> int:
        """Engine rows this slate costs: B round-A blocks + 1 round-B prompt."""
        return len(self.blocks) + 1

    @property
    def n_tokens(self) -> int:
        """Prompt tokens of round A (every block)."""
        return sum(len(r.ids) for r in self.rows)


def work(row) -> int:
    """Engine rows an encoded slate costs: 1 for an :class:`EncodedSlate`, B + 1 for a :class:`BlockedSlate`."""
    return getattr(row, "work", 1)


def check_count(n: int, max_documents: int, sid="?") -> None:
    """Raise :class:`TooManyDocuments` when ``n > max_documents``."""
    if n > max_documents:
        raise TooManyDocuments(f"slate {sid}: {n} candidates, over the limit of {max_documents} documents per "
                               f"list (max_documents)")


def encode(builder: PromptBuilder, slate: dict, options: BlockOptions | None = None) -> EncodedSlate | BlockedSlate:
    """Encode ``slate`` for ranking: one :class:`EncodedSlate` when it fits one prompt (exactly
    :meth:`PromptBuilder.encode_one`), else a :class:`BlockedSlate` planned by ``options``.

    Raises: TooManyDocuments (over ``max_documents``), SlateError (as :meth:`PromptBuilder.encode_one`:
    empty slate, a candidate that tokenizes to nothing, a user context + one candidate over ``max_seq_len``).
    """
    options = options or BlockOptions()
    cands = slate.get("candidates") or []
    sid = slate.get("slate_id", "?")
    check_count(len(cands), options.max_documents, sid)
    k = builder.max_items
    if k is None or len(cands) <= k:
        try:
            return builder.encode_one(slate)
        except PromptTooLong:
            if len(cands) == 1:
                raise
    k = k or len(cands)
    spec = builder.spec
    free = PromptBuilder(builder.tokenizer, spec, max_items=None)
    whole = free.encode_one(slate, check_length=False)  # indices up to N: as long as or longer than inside a block
    # candidate i's tokens + one separator: the readout gaps (the first counts from the context's end)
    sep = len(free._sep_ids)
    lengths = np.diff([whole.context_end - sep] + whole.readout).tolist()
    ctx = whole.context_end + 1
    room = spec.max_seq_len - ctx
    if min(lengths) > room:
        return builder.encode_one(slate)  # raises PromptTooLong as before: not even one candidate fits
    anchors, blocks = _plan(options, len(cands), k, lengths, room)
    while True:
        try:
            rows = [builder.encode_one(take(slate, idx)) for idx in blocks]
            break
        except PromptTooLong:  # a block's real tokens exceeded the estimate: one block more
            more = _plan(options, len(cands), k, lengths, room, len(blocks) + 1)
            if len(more[1]) <= len(blocks):
                raise
            anchors, blocks = more
    return BlockedSlate(slate, len(cands), options.method, anchors, blocks, rows, lengths, ctx, spec.max_seq_len, k,
                        list(whole.truncated), whole.history_dropped)


def _fits(idx: Sequence[int], lengths: Sequence[int], k: int, room: int) -> bool:
    return len(idx) <= k and sum(lengths[i] for i in idx) <= room


def _plan(options: BlockOptions, n: int, k: int, lengths: Sequence[int], room: int,
          at_least: int = 2) -> tuple[list[int], list[list[int]]]:
    """(anchors, blocks): the fewest blocks (≥ ``at_least``) of the method whose prompts fit K and ``room`` tokens."""
    if options.method == "jointrank":
        return [], _joint_blocks(n, k, lengths, room, options.replication, at_least)
    a = min(options.anchors, k - 1, n - 1)
    while a > 0 and sum(lengths[:a]) + max(lengths[a:]) > room:
        a -= 1
    anchors = list(range(a))
    rest = list(range(a, n))
    cap_tokens = room - sum(lengths[:a])
    b = max(at_least, math.ceil(len(rest) / (k - a)), math.ceil(sum(lengths[i] for i in rest) / cap_tokens))
    while True:
        blocks = [anchors + rest[j::b] for j in range(min(b, len(rest)))]
        if all(_fits(blk, lengths, k, room) for blk in blocks):
            return anchors, blocks
        b += 1


def _joint_permutation(n: int, r: int) -> list[int]:
    """The r-th copy's fixed order of ``range(n)``: ``i ↦ (i · g) mod n`` with ``g`` the integer coprime to n
    nearest ``n / φ^r`` (a golden-ratio stride; r = 0 is the identity)."""
    if r == 0 or n < 3:
        return list(range(n)) if r % 2 == 0 else list(range(n))[::-1]
    target = n / ((1 + 5 ** 0.5) / 2) ** r
    g = min((c for c in range(1, n) if math.gcd(c, n) == 1), key=lambda c: (abs(c - target), c))
    return [(i * g) % n for i in range(n)]


def _joint_blocks(n: int, k: int, lengths: Sequence[int], room: int, replication: int, at_least: int) -> list[list[int]]:
    """JointRank-style overlapping blocks: ``replication`` fixed permutations of the list, concatenated and
    cut into the fewest near-equal consecutive blocks that fit (a candidate twice in one block is kept once)."""
    slots = [i for r in range(replication) for i in _joint_permutation(n, r)]
    b = max(at_least, math.ceil(len(slots) / k), math.ceil(sum(lengths[i] for i in slots) / room))
    while True:
        cuts = [round(j * len(slots) / b) for j in range(b + 1)]
        blocks = [sorted(set(slots[cuts[j]:cuts[j + 1]])) for j in range(b)]
        if all(_fits(blk, lengths, k, room) for blk in blocks):
            return blocks
        b += 1


def round_a_scores(blocked: BlockedSlate, matrices: Sequence[np.ndarray]) -> np.ndarray:
    """Round A's score of every candidate: ``[n]`` float64, higher = better.

    ``anchors``: the aligned block soft rank (module doc); ``jointrank``: the win rate over the pairs each
    block's LAPJV ranking orders. ``matrices[b]``: block b's score matrix ``[n_b, K]`` (its real rows).
    Raises: DecodeError (non-finite scores).
    """
    for b, m in enumerate(matrices):
        if not np.isfinite(np.asarray(m[:, : len(blocked.blocks[b])])).all():
            raise DecodeError(f"block {b} score matrix has non-finite values; refusing to rank")
    if blocked.method == "jointrank":
        wins, games = np.zeros(blocked.n), np.zeros(blocked.n)
        for idx, m in zip(blocked.blocks, matrices):
            order = np.asarray(idx)[decode(m, len(idx))]
            nb = len(order)
            wins[order] += np.arange(nb - 1, -1, -1)
            games[order] += nb - 1
        return wins / np.maximum(games, 1)
    soft = [soft_rank(m[:, : len(idx)]) for idx, m in zip(blocked.blocks, matrices)]
    a = len(blocked.anchors)
    means = np.array([s[:a].mean() for s in soft]) if a else np.zeros(len(soft))
    delta = means.mean() - means
    out = np.zeros(blocked.n)
    for idx, s, d in zip(blocked.blocks, soft, delta):
        out[idx[a:]] = s[a:] + d
    if a:
        out[blocked.anchors] = np.mean([s[:a] + d for s, d in zip(soft, delta)], axis=0)
    return out


def by_score(scores: np.ndarray) -> np.ndarray:
    """Candidate indices by descending score, ties in input order: ``[n]`` int64."""
    return np.lexsort((np.arange(len(scores)), -np.asarray(scores, dtype=np.float64)))


def head(builder: PromptBuilder, blocked: BlockedSlate, scores: np.ndarray) -> tuple[list[int], EncodedSlate]:
    """Round B's candidates (the best K by ``scores`` that fit ``max_seq_len``, in input order) and their prompt."""
    room = blocked.max_seq_len - blocked.context_tokens
    keep, used = [], 0
    for i in by_score(scores).tolist():
        if len(keep) == blocked.k or used + blocked.lengths[i] > room:
            break
        keep.append(i)
        used += blocked.lengths[i]
    while True:
        idx = sorted(keep)
        try:
            return idx, builder.encode_one(take(blocked.slate, idx))
        except PromptTooLong:
            keep = keep[:-1]


@dataclass
class BlockRanking:
    """The final ranking of a blocked slate.

    Attributes:
        order: candidate indices, best first (a permutation of ``range(n)``).
        scores: per position: round B's ``M[i, p]`` for the head, the round-A score below it.
        relevance: per position, in [0, 1], non-increasing: ``1 − E[global position] / (n − 1)`` from round
            B's soft rank in the head, round A's score below (isotonic fit, :func:`monotone_scores`).
        matrix: ``[n, K]`` float32, each candidate's row from the last pass that scored it.
        blocks: B (round-A blocks).
    """

    order: list[int]
    scores: list[float]
    relevance: list[float]
    matrix: np.ndarray
    blocks: int


def finish(blocked: BlockedSlate, matrices: Sequence[np.ndarray], scores: np.ndarray,
           head_idx: Sequence[int] | None = None, head_matrix: np.ndarray | None = None) -> BlockRanking:
    """Assemble the ranking from round A (``matrices``, ``scores`` of :func:`round_a_scores`) and, when given,
    round B (``head_idx`` and its score matrix ``[h, K]``). Raises: DecodeError (round B's scores)."""
    n = blocked.n
    k_cols = matrices[0].shape[1]
    matrix = np.zeros((n, k_cols), dtype=np.float32)
    for idx, m in zip(blocked.blocks, matrices):
        matrix[idx] = m[: len(idx)]
    ranked = by_score(scores).tolist()
    top: list[int] = []
    pos_scores: list[float] = []
    rel: list[float] = []
    if head_idx is not None:
        local = decode(head_matrix, len(head_idx))
        top = [head_idx[j] for j in local.tolist()]
        pos_scores = assignment_scores(head_matrix, local).tolist()
        h = len(top)
        soft = soft_rank(head_matrix[:h])[local]
        rel = (1.0 - (1.0 - soft) * (h - 1) / max(n - 1, 1)).tolist()
        matrix[list(head_idx)] = head_matrix[:h]
    chosen = set(top)
    rest = [i for i in ranked if i not in chosen]
    order = top + rest
    pos_scores += [float(scores[i]) for i in rest]
    rel += [float(scores[i]) for i in rest]
    if sorted(order) != list(range(n)):
        raise DecodeError(f"block ranking {order} is not a permutation of 0..{n - 1}")
    return BlockRanking(order, pos_scores, monotone_scores(rel).tolist(), matrix, len(blocked.blocks))
