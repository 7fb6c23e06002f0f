"""A client of the Triton ``hllm_ranker`` ensemble: slates in, rankings out (``tritonclient[http]``).

The ensemble takes slate JSON (the tokenization runs inside Triton, in the preprocessing model), so a
client sends one BYTES element per slate, ``slates [B, 1]``, and reads ``ranking [B, K]`` int64
(candidate index per rank position, -1 past the slate), ``scores [B, K, K]`` float32 and
``truncated [B, K]`` bool. Each slate becomes the dict of :meth:`hllm.runtime.Ranking.to_dict`.
``hllm triton-repo`` copies this module (and the hllm modules it imports) into ``OUT/client/`` with
``rank.py``, which needs only ``pip install 'tritonclient[http]'`` (numpy comes with it).
Protocol: KServe v2 (https://github.com/kserve/open-inference-protocol), client API:
https://github.com/triton-inference-server/client (``tritonclient.http``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

from hllm.errors import HllmError
from hllm.runtime.decode import assignment_scores
from hllm.runtime.slates import read_slates

INPUT = "slates"
OUTPUTS = ("ranking", "scores", "truncated")


def slates_tensor(slates: Sequence[dict]) -> np.ndarray:
    """``[B, 1]`` object array of UTF-8 JSON bytes, one slate per row (the ensemble's ``slates`` input)."""
    return np.array([[json.dumps(s, ensure_ascii=False).encode("utf-8")] for s in slates], dtype=object)


def rankings_from_outputs(ranking: np.ndarray, scores: np.ndarray, truncated: np.ndarray, slates: Sequence[dict]) -> list[dict]:
    """Rankings (as ``Ranking.to_dict()``) from the ensemble's outputs for ``slates``.

    Args: ``ranking [B, K]`` int64 (-1 past the slate), ``scores [B, K, K]`` float32,
    ``truncated [B, K]`` bool (``hllm serve`` widens K to the longest slate ranked in blocks; scores are then
    given for the first K positions, the rank positions of the head). Raises: HllmError if the batch sizes differ from ``len(slates)``.
    """
    if not (len(ranking) == len(scores) == len(truncated) == len(slates)):
        raise HllmError(f"outputs for {len(ranking)} slates, sent {len(slates)}")
    result = []
    for b, slate in enumerate(slates):
        order = ranking[b][ranking[b] >= 0].astype(np.int64)
        cands = slate["candidates"]
        result.append({
            "slate_id": str(slate.get("slate_id", b)),
            "ranking": [cands[i].get("item_id", int(i)) for i in order],
            "order": order.tolist(),
            "scores": [round(float(x), 6) for x in assignment_scores(scores[b], order[: scores.shape[-1]])],
            "truncated": np.flatnonzero(truncated[b]).tolist(),
        })
    return result


def rank_slates(client, model: str, slates: Sequence[dict]) -> list[dict]:
    """Rank ``slates`` in ONE request to ``model`` with a ``tritonclient.http.InferenceServerClient``.

    Raises: ``tritonclient.utils.InferenceServerException`` (server error, e.g. a bad slate).
    """
    import tritonclient.http as httpclient

    inp = httpclient.InferInput(INPUT, [len(slates), 1], "BYTES")
    inp.set_data_from_numpy(slates_tensor(slates))
    res = client.infer(model, [inp], outputs=[httpclient.InferRequestedOutput(n) for n in OUTPUTS])
    return rankings_from_outputs(*(res.as_numpy(n) for n in OUTPUTS), slates)


def main(argv: list[str] | None = None, client_dir: Path | None = None) -> int:
    """``rank.py``: read slates, send them to Triton, print one JSON ranking per line."""
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    p = argparse.ArgumentParser(description="Rank slates with Triton's hllm_ranker ensemble (KServe v2 HTTP).")
    p.add_argument("--url", default="127.0.0.1:8000", help="Triton HTTP endpoint, host:port")
    p.add_argument("--slates", required=True, help="JSONL(.gz) slates")
    p.add_argument("--limit", type=int, default=None, help="rank only the first LIMIT slates")
    p.add_argument("--batch-size", type=int, default=None, help="slates per request (default and at most: max_batch_size)")
    p.add_argument("--client-dir", default=str(client_dir or "."), help="the repository's client/ folder")
    a = p.parse_args(argv)
    try:
        cfg = json.loads((Path(a.client_dir) / "hllm_client.json").read_text(encoding="utf-8"))
        slates = read_slates(a.slates, limit=a.limit)
        step = min(a.batch_size or cfg["max_batch_size"], cfg["max_batch_size"])
        if step < 1:
            raise HllmError("--batch-size must be ≥ 1")
        url = a.url.split("://", 1)[-1].rstrip("/")
        client = httpclient.InferenceServerClient(url=url, network_timeout=300.0)
        for i in range(0, len(slates), step):
            for ranking in rank_slates(client, cfg["model"], slates[i : i + step]):
                print(json.dumps(ranking, ensure_ascii=False), flush=True)
    except (HllmError, OSError, InferenceServerException) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
