"""A small client of the Triton ``hllm_ranker`` ensemble over the KServe v2 HTTP/JSON protocol (httpx).

Prompt building is the runtime's :class:`PromptBuilder` with the tokenizer and prompt spec that
``hllm triton-repo`` puts in ``OUT/client/``. To let Triton's dynamic batcher merge requests (it only
merges equal shapes), rows are right-padded to ``N = K`` items and ``S`` to a multiple of
``seq_bucket`` tokens; right padding leaves every real token's hidden state unchanged.
Protocol: https://github.com/kserve/open-inference-protocol (``POST /v2/models/{name}/infer``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Sequence

import numpy as np

from hllm.errors import HllmError
from hllm.runtime.decode import assignment_scores
from hllm.runtime.prompt import Batch, PromptBuilder, load_tokenizer
from hllm.formats.prompt import PromptSpec

V2_TYPES = {np.dtype(np.int64): "INT64", np.dtype(np.bool_): "BOOL", np.dtype(np.float32): "FP32"}


def load_builder(client_dir: str | Path) -> tuple[PromptBuilder, dict]:
    """The PromptBuilder and settings stored in a Triton repository's ``client/`` folder."""
    d = Path(client_dir)
    try:
        cfg = json.loads((d / "hllm_client.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise HllmError(f"cannot read {d / 'hllm_client.json'}: {e}") from None
    builder = PromptBuilder(load_tokenizer(d / "tokenizer.json"), PromptSpec.from_dict(cfg["prompt"]), max_items=cfg["num_positions"])
    return builder, cfg


def pad_batch(batch: Batch, n_items: int, seq_bucket: int, pad_id: int) -> Batch:
    """Right-pad a batch to ``n_items`` item slots and a sequence length that is a multiple of ``seq_bucket``."""
    b, s = batch.input_ids.shape
    n = batch.item_mask.shape[1]
    s2 = -(-s // seq_bucket) * seq_bucket
    ids = np.full((b, s2), pad_id, dtype=np.int64)
    ids[:, :s] = batch.input_ids
    pos = np.zeros((b, max(n, n_items)), dtype=np.int64)
    pos[:, :n] = batch.readout_positions
    mask = np.zeros((b, max(n, n_items)), dtype=bool)
    mask[:, :n] = batch.item_mask
    return Batch(ids, pos, mask, batch.lengths, batch.n_items, batch.truncated, batch.history_dropped)


def build_request(batch: Batch) -> dict:
    """KServe v2 JSON body for the ensemble from an encoded batch (row-major flattened data)."""
    inputs = []
    for name, arr in batch.inputs().items():
        inputs.append({"name": name, "shape": list(arr.shape), "datatype": V2_TYPES[arr.dtype], "data": arr.reshape(-1).tolist()})
    return {"inputs": inputs, "outputs": [{"name": "ranking"}, {"name": "scores"}]}


def parse_response(body: dict, slates: Sequence[dict]) -> list[dict]:
    """Rankings (as ``Ranking.to_dict()``) from the ensemble's v2 JSON response for ``slates``."""
    outs = {o["name"]: o for o in body.get("outputs", [])}
    if "ranking" not in outs or "scores" not in outs:
        raise HllmError(f"response lacks ranking/scores outputs: {sorted(outs)}")
    ranking = np.asarray(outs["ranking"]["data"], dtype=np.int64).reshape(outs["ranking"]["shape"])
    scores = np.asarray(outs["scores"]["data"], dtype=np.float32).reshape(outs["scores"]["shape"])
    result = []
    for b, slate in enumerate(slates):
        order = ranking[b][ranking[b] >= 0]
        cands = slate["candidates"]
        result.append({
            "slate_id": str(slate.get("slate_id", b)),
            "ranking": [cands[i].get("item_id", i) for i in order],
            "order": order.tolist(),
            "scores": [round(float(x), 6) for x in assignment_scores(scores[b], order)],
        })
    return result


def main(argv: list[str] | None = None, client_dir: Path | None = None) -> int:
    """``rank.py``: read slates, send them to Triton, print one JSON ranking per line."""
    import httpx

    from hllm.runtime.slates import read_slates

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000", help="Triton HTTP endpoint")
    p.add_argument("--slates", required=True, help="JSONL(.gz) slates")
    p.add_argument("--limit", type=int, default=1)
    p.add_argument("--client-dir", default=str(client_dir or "."), help="the repository's client/ folder")
    a = p.parse_args(argv)
    builder, cfg = load_builder(a.client_dir)
    slates = read_slates(a.slates, limit=a.limit)
    for i in range(0, len(slates), cfg["max_batch_size"]):
        chunk = slates[i : i + cfg["max_batch_size"]]
        batch = pad_batch(builder.encode(chunk), cfg["num_positions"], cfg["seq_bucket"], builder.pad_id)
        r = httpx.post(f"{a.url.rstrip('/')}/v2/models/{cfg['model']}/infer", json=build_request(batch), timeout=120)
        if r.status_code != 200:
            raise HllmError(f"Triton answered {r.status_code}: {r.text[:500]}")
        for ranking in parse_response(r.json(), chunk):
            print(json.dumps(ranking))
    return 0
