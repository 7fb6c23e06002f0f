"""Parse an autoregressive ranker's text output into a permutation (torch-free).

The teacher (paper §4.3 Phase 1) is asked for the candidate numbers (1-based ordinals) best first.
A small model's output can hold garbage, repeats, numbers outside 1..N, or stop early. The parser
takes every maximal digit run in order; the first occurrence of an ordinal in 1..N is kept, a later
occurrence counts as *repeated*, a number outside 1..N (or with a leading zero) as *invalid*; the
ordinals never seen are *missing* and are appended in their original slate order (the repair).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NUMBER = re.compile(r"\d+")


@dataclass
class ParsedRanking:
    """A repaired permutation and what had to be repaired.

    Attributes:
        order: 0-based candidate indices, best first, a permutation of ``range(n)``.
        invalid: numbers that were not an ordinal in 1..N (out of range, 0, leading zeros).
        repeated: ordinals that appeared again after their first occurrence.
        missing: ordinals never produced (appended in original order).
    """

    order: list[int]
    invalid: int
    repeated: int
    missing: int

    @property
    def valid(self) -> bool:
        """True when the raw output was already a complete permutation (nothing repaired)."""
        return self.invalid == 0 and self.repeated == 0 and self.missing == 0


def parse_ordinals(text: str, n: int) -> ParsedRanking:
    """Turn model output ``text`` into a permutation of ``n`` candidates.

    Args:
        text: decoded generation, e.g. ``"3, 1, 2"`` (any separators; non-digit text is skipped).
        n: number of candidates N (≥ 1).
    Returns: :class:`ParsedRanking` (``order`` is 0-based).
    Raises: ValueError if ``n`` < 1.
    """
    if n < 1:
        raise ValueError(f"n must be ≥ 1, got {n}")
    seen: set[int] = set()
    order: list[int] = []
    invalid = repeated = 0
    for m in _NUMBER.finditer(text):
        s = m.group()
        k = int(s)
        if s.startswith("0") or not 1 <= k <= n:
            invalid += 1
        elif k in seen:
            repeated += 1
        else:
            seen.add(k)
            order.append(k - 1)
    missing = [i for i in range(n) if i + 1 not in seen]
    return ParsedRanking(order + missing, invalid, repeated, len(missing))
