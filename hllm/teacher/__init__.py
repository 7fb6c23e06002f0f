"""The autoregressive listwise teacher (paper §4.3 Phase 1): prompt, greedy decoding with KV cache,
constrained ordinal grammar, output parser/repair. Imports torch/transformers (not runtime code).

Public API: :class:`ArRanker` (``ArRanker(model_dir, max_new_tokens=None, threads=None).rank(slate,
constrained) -> ArResult``, ``.rank_batch(slates, constrained) -> list[ArResult]``), :class:`ArResult`,
:func:`parse_ordinals`, :class:`OrdinalGrammar`.
"""

from hllm.teacher.constrain import GrammarState, OrdinalGrammar
from hllm.teacher.parse import ParsedRanking, parse_ordinals

__all__ = ["ArRanker", "ArResult", "GrammarState", "OrdinalGrammar", "ParsedRanking", "parse_ordinals", "summarize"]


def __getattr__(name):  # lazy: torch/transformers only when the ranker is used
    if name in ("ArRanker", "ArResult", "summarize"):
        from hllm.teacher import ranker

        return getattr(ranker, name)
    raise AttributeError(name)
