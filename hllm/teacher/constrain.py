"""Constrained decoding of ordinals: only the next valid ordinal digits and separators may be
generated, and end-of-sequence only once all N ordinals are out (torch-free grammar).

Output grammar (1-based ordinals, each exactly once)::

    " "? ORD ("," " "? ORD)*        ORD ∈ {1..N}, no leading zero, not produced before

This is how a teacher fine-tuned for the format behaves ("constrained mode"); the
Hugging Face logits processor that applies it lives in :mod:`hllm.teacher.ranker`.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GrammarState:
    """Decoding state: ordinals done, current partial digits, and the separator run since the last ordinal."""

    done: frozenset = field(default_factory=frozenset)
    partial: str = ""
    sep: str = ""  # "" at start, "," or ", " after an ordinal, " " for a leading space
    started: bool = False


class OrdinalGrammar:
    """The ordinal grammar for a slate of ``n`` candidates.

    ``advance(state, text)`` returns the new state or None if ``text`` would leave the grammar;
    ``can_end(state)`` says whether end-of-sequence is allowed (all N ordinals out).
    """

    def __init__(self, n: int):
        if n < 1:
            raise ValueError(f"n must be ≥ 1, got {n}")
        self.n = n
        self._strs = [str(k) for k in range(1, n + 1)]

    def _prefix_ok(self, partial: str, done: frozenset) -> bool:
        if partial.startswith("0"):
            return False
        return any(s.startswith(partial) and int(s) not in done for s in self._strs)

    def _complete_ok(self, partial: str, done: frozenset) -> bool:
        return bool(partial) and not partial.startswith("0") and 1 <= int(partial) <= self.n and int(partial) not in done

    def advance(self, state: GrammarState, text: str) -> GrammarState | None:
        """Feed ``text`` (one token's string) character by character; None when invalid."""
        done, partial, sep, started = state.done, state.partial, state.sep, state.started
        for ch in text:
            if ch.isdigit() and ch in "0123456789":
                if len(done) == self.n or not self._prefix_ok(partial + ch, done):
                    return None
                partial += ch
                started = True
            elif ch == ",":
                if not self._complete_ok(partial, done) or len(done) + 1 == self.n:
                    return None  # the last ordinal is followed by end-of-sequence, not a comma
                done = done | {int(partial)}
                partial, sep = "", ","
            elif ch == " ":
                if partial or sep not in ("", ",") or (sep == "" and started):
                    return None
                sep = ", " if sep == "," else " "
            else:
                return None
        return GrammarState(done, partial, sep, started)

    def can_end(self, state: GrammarState) -> bool:
        """End-of-sequence allowed: every ordinal is out (counting a complete trailing partial)."""
        if state.partial:
            return self._complete_ok(state.partial, state.done) and len(state.done) + 1 == self.n
        return len(state.done) == self.n

    def max_tokens(self) -> int:
        """Upper bound on generated tokens when every character is its own token (+1 for EOS)."""
        return sum(len(s) for s in self._strs) + 2 * (self.n - 1) + 2
