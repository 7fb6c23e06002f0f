"""Prompt building: slates → ``input_ids``, ``readout_positions``, ``item_mask``, ``context_positions`` (torch-free).

hLLM (paper §3.1-3.2) puts the user context and all N candidate texts into ONE prompt and reads
the backbone's final hidden state at the *last token of each candidate's text* (the readout
position). To make readout positions exact, the prompt is built by concatenating the token ids of
separately tokenized segments (user context, each candidate, separators) instead of tokenizing one
long string, so no BPE merge can cross a segment boundary.

Hostile text is bounded before the tokenizer sees it: a title is cut to ``budget ×``
:data:`CHARS_PER_TOKEN_CEILING` characters first (tokenizing a 100 MB title in full costs ~200× its size
in memory), then tokenized and cut to the token budget; either cut is recorded in ``truncated``.

Batches are right-padded. With right padding and purely causal attention, real tokens never attend
to pad tokens and position ids of real tokens are unchanged, so no attention mask is needed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from hllm.errors import CheckpointError, SlateError
from hllm.formats.graph import feed_dict
from hllm.formats.prompt import PromptSpec, candidate_fields

#: The most characters one token is assumed to cover. A text is cut to ``token budget × this`` characters
#: before it is tokenized: byte-level BPE tokens of natural text average 3-5 characters and rarely exceed 16,
#: so the first ``budget`` tokens of the cut text equal those of the whole text unless the text's tokens
#: average over 32 characters (e.g. one character repeated thousands of times); such a text is still cut,
#: and recorded as truncated. Memory and time of tokenization are then bounded by the budget, not the text.
CHARS_PER_TOKEN_CEILING = 32


class PromptTooLong(SlateError):
    """A slate's prompt is longer than the spec's ``max_seq_len`` (:meth:`PromptBuilder.encode_one`); a
    :class:`~hllm.runtime.ranker.Ranker` then ranks the slate in blocks (:mod:`hllm.runtime.blocks`)."""


def cut_text(text: str, token_budget: int) -> tuple[str, bool]:
    """``text`` cut to ``token_budget × CHARS_PER_TOKEN_CEILING`` characters, and whether it was cut.

    The one bound in front of the tokenizer (candidate titles, history titles): a slice, O(limit) memory.
    """
    limit = token_budget * CHARS_PER_TOKEN_CEILING
    return (text[:limit], True) if len(text) > limit else (text, False)


@dataclass(frozen=True)
class EncodedSlate:
    """One slate's prompt before padding.

    Attributes:
        ids: token ids (list of int). readout: index into ``ids`` of each candidate's last token.
        truncated: candidate indices whose text was cut to the token budget.
        history_dropped: how many history items were dropped to fit the budget.
        context_end: index into ``ids`` of the last token of the user context (before the first
            candidate); a head with a user-context readout reads the hidden state there.
    """

    ids: list[int]
    readout: list[int]
    truncated: list[int]
    history_dropped: int
    context_end: int = 0


@dataclass
class Batch:
    """Engine inputs for B slates (numpy, right-padded).

    Attributes:
        input_ids: ``[B, S]`` int64 token ids; positions ≥ ``lengths[b]`` hold the pad id.
        readout_positions: ``[B, N]`` int64 index into S of each candidate's last token (0 where
            ``item_mask`` is False).
        item_mask: ``[B, N]`` bool, True for real candidates.
        lengths: ``[B]`` int64 prompt lengths in tokens.
        n_items: ``[B]`` int64 candidates per slate.
        context_positions: ``[B]`` int64 index of each prompt's last user-context token.
        truncated: per slate, the candidate indices whose text was cut to the token budget.
        history_dropped: per slate, how many history items were dropped to fit the budget.
    """

    input_ids: np.ndarray
    readout_positions: np.ndarray
    item_mask: np.ndarray
    lengths: np.ndarray
    n_items: np.ndarray
    truncated: list[list[int]] = field(default_factory=list)
    history_dropped: list[int] = field(default_factory=list)
    context_positions: np.ndarray | None = None

    def inputs(self, graph_inputs) -> dict[str, np.ndarray]:
        """The feed dict of the graph that declares ``graph_inputs`` (:func:`hllm.formats.graph.feed_dict`:
        a sidecar, its input names or specs, or a bool — the head reads the user context).

        Raises: ShapeError if the graph declares an input this batch lacks.
        """
        return feed_dict(graph_inputs, self)


def load_tokenizer(path: str | os.PathLike):
    """Load a ``tokenizers.Tokenizer`` from ``tokenizer.json`` or a directory holding one.

    Raises: CheckpointError if the file is missing or unreadable.
    """
    from tokenizers import Tokenizer

    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise CheckpointError(f"tokenizer.json not found: {p}")
    try:
        return Tokenizer.from_file(str(p))
    except Exception as e:  # tokenizers raises a bare Exception on parse errors
        raise CheckpointError(f"cannot read tokenizer {p}: {e}") from None


class PromptBuilder:
    """Builds engine inputs from slates with a :class:`PromptSpec` and a ``tokenizers.Tokenizer``.

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` (the backbone's ``tokenizer.json``).
        spec: the prompt spec.
        max_items: K of the head; a slate with more candidates raises SlateError. None = no check.
    """

    def __init__(self, tokenizer, spec: PromptSpec, max_items: int | None = None):
        self.tokenizer = tokenizer
        self.spec = spec
        self.max_items = max_items
        self._sep_ids = self._ids(spec.separator) if spec.separator else []
        self._bos = []
        if spec.bos_token is not None:
            tid = tokenizer.token_to_id(spec.bos_token)
            if tid is None:
                raise CheckpointError(f"bos_token {spec.bos_token!r} is not in the tokenizer vocabulary")
            self._bos = [tid]
        self._cand_fields = candidate_fields(spec.candidate_template)
        pad = tokenizer.token_to_id("<|endoftext|>")
        self.pad_id = int(pad) if pad is not None else 0
        self._overhead: dict[int, int] = {}  # candidate index → tokens of the template with an empty title

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def _fields(self, cand: dict, sid, i: int, budget: int) -> tuple[dict[str, str], bool]:
        """The candidate's fields the template names, each cut to the token budget (:func:`cut_text`),
        and whether any was cut. Raises SlateError naming a field the candidate lacks or that is not a string."""
        out, cut = {}, False
        for name in self._cand_fields:
            v = cand.get(name)
            if not isinstance(v, str):
                what = "lacks" if v is None else f"has a non-string ({type(v).__name__})"
                raise SlateError(f"slate {sid}: candidate {i} {what} field {name!r}, which the prompt's "
                                 f"candidate_template uses")
            out[name], c = cut_text(v, budget)
            cut = cut or c
        return out, cut

    def template_tokens(self, n: int) -> list[int]:
        """Token count of ``candidate_template`` rendered with an empty title (and every other candidate field
        it names empty), for indices 1..``n`` (list of int).

        These tokens (``"{index}. "`` in the default template) are the template's, not the candidate's: a
        candidate token budget that they fill would keep none of the candidate's text, so such a slate is
        refused (:meth:`encode_one`). Counts are cached per index.
        """
        missing = [i for i in range(1, n + 1) if i not in self._overhead]
        if missing:
            blank = {f: "" for f in self._cand_fields}
            empty = [self.spec.candidate_template.format(index=i, **blank) for i in missing]
            for i, enc in zip(missing, self.tokenizer.encode_batch(empty, add_special_tokens=False)):
                self._overhead[i] = len(enc.ids)
        return [self._overhead[i] for i in range(1, n + 1)]

    def _context_ids(self, history: Sequence[str]) -> tuple[list[int], int]:
        spec = self.spec
        hist = list(history)[-spec.max_history:] if spec.max_history else []
        dropped = len(history) - len(hist)
        hist = [cut_text(t, spec.history_token_budget)[0] for t in hist]
        while True:
            rendered = "".join(
                spec.history_item_template.format(title=t, index=i + 1) for i, t in enumerate(hist)
            )
            ids = self._ids(spec.user_template.format(history=rendered))
            if len(ids) <= spec.history_token_budget or not hist:
                return ids[: spec.history_token_budget], dropped
            hist = hist[1:]
            dropped += 1

    def encode_one(self, slate: dict, check_length: bool = True) -> EncodedSlate:
        """Encode one slate (see :class:`EncodedSlate`). ``check_length=False`` measures a prompt of any
        length (:mod:`hllm.runtime.blocks` plans its blocks from the whole list's token counts).

        Raises:
            SlateError: empty slate, more candidates than ``max_items`` (K), a candidate that tokenizes
                to nothing, or (``check_length``) a prompt longer than ``max_seq_len`` (PromptTooLong); the
                message names the slate id.
        """
        cands = slate.get("candidates") or []
        sid = slate.get("slate_id", "?")
        if not cands:
            raise SlateError(f"slate {sid}: empty slate (no candidates)")
        if self.max_items is not None and len(cands) > self.max_items:
            raise SlateError(
                f"slate {sid}: {len(cands)} candidates but the head ranks at most K={self.max_items}"
            )
        ids, dropped = self._context_ids(slate.get("history") or [])
        ids = self._bos + ids
        context_end = len(ids) - 1
        budget = self.spec.candidate_token_budget
        cuts = [self._fields(c, sid, i, budget) for i, c in enumerate(cands)]
        texts = [self.spec.candidate_template.format(index=i + 1, **f) for i, (f, _) in enumerate(cuts)]
        encs = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        overhead = self.template_tokens(len(cands))
        readout, truncated = [], []
        for i, enc in enumerate(encs):
            cid = enc.ids
            if not cid:
                raise SlateError(f"slate {sid}: candidate {i} tokenizes to nothing")
            if budget <= overhead[i] and len(cid) > overhead[i]:
                raise SlateError(f"slate {sid}: a candidate token budget of {budget} keeps no token of candidate {i}'s "
                                 f"text: the template's own part takes {overhead[i]} tokens; give a budget above it")
            if len(cid) > budget or cuts[i][1]:
                cid = cid[:budget]
                truncated.append(i)
            ids.extend(cid)
            readout.append(len(ids) - 1)
            ids.extend(self._sep_ids)
        if check_length and len(ids) > self.spec.max_seq_len:
            raise PromptTooLong(
                f"slate {sid}: prompt is {len(ids)} tokens, over max_seq_len={self.spec.max_seq_len} "
                "(lower candidate_token_budget or history_token_budget)"
            )
        return EncodedSlate(ids, readout, truncated, dropped, max(0, context_end))

    def collate(self, rows: Sequence[EncodedSlate]) -> Batch:
        """Right-pad encoded slates into one :class:`Batch` (pad id :attr:`pad_id`).

        Raises: SlateError if ``rows`` is empty.
        """
        if not rows:
            raise SlateError("no slates to encode")
        b = len(rows)
        s_max = max(len(r.ids) for r in rows)
        n_max = max(len(r.readout) for r in rows)
        input_ids = np.full((b, s_max), self.pad_id, dtype=np.int64)
        readout = np.zeros((b, n_max), dtype=np.int64)
        mask = np.zeros((b, n_max), dtype=bool)
        for i, r in enumerate(rows):
            input_ids[i, : len(r.ids)] = r.ids
            readout[i, : len(r.readout)] = r.readout
            mask[i, : len(r.readout)] = True
        return Batch(
            input_ids=input_ids,
            readout_positions=readout,
            item_mask=mask,
            lengths=np.array([len(r.ids) for r in rows], dtype=np.int64),
            n_items=np.array([len(r.readout) for r in rows], dtype=np.int64),
            truncated=[r.truncated for r in rows],
            history_dropped=[r.history_dropped for r in rows],
            context_positions=np.array([r.context_end for r in rows], dtype=np.int64),
        )

    def encode(self, slates: Sequence[dict]) -> Batch:
        """Encode B slates into one right-padded :class:`Batch` (:meth:`encode_one` + :meth:`collate`).

        Raises: SlateError (see :meth:`encode_one`), or if ``slates`` is empty.
        """
        return self.collate([self.encode_one(s) for s in slates])
