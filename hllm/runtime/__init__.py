"""The lean hLLM runtime: tokenizer + engine + LAPJV. Imports neither torch nor transformers.

    from hllm.runtime import Ranker, read_slates
    with Ranker.from_path("export/") as r:
        for ranking in r.rank(read_slates("slates.jsonl")):
            print(ranking.item_ids[:10])
"""

from hllm.runtime.decode import decode, decode_batch
from hllm.formats.prompt import PromptSpec
from hllm.runtime.prompt import Batch, PromptBuilder, load_tokenizer
from hllm.runtime.ranker import Ranker, Ranking, StageTimes
from hllm.runtime.slates import read_slates, write_jsonl

__all__ = [
    "Batch",
    "PromptBuilder",
    "PromptSpec",
    "Ranker",
    "Ranking",
    "StageTimes",
    "decode",
    "decode_batch",
    "load_tokenizer",
    "read_slates",
    "write_jsonl",
]
