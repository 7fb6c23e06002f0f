"""Orders and assigned scores of stored engine rankings (``hllm rank`` JSONL) against the PyTorch
checkpoint run from a feature cache (``hllm features``) on the same slates: how many permutations
match exactly, top-1 agreement, and max |Δ| of the scores at the assigned (item, position) cells.

usage: python scripts/rankings_vs_checkpoint.py RANKINGS.jsonl CHECKPOINT CACHE SLATES [--limit N] --out OUT.json
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from hllm.files import atomic_write_json
from hllm.formats.report import envelope
from hllm.runtime.decode import decode
from hllm.runtime.slates import read_slates
from hllm.training.features import FeatureCache, scores_from_cache


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rankings")
    ap.add_argument("checkpoint")
    ap.add_argument("cache")
    ap.add_argument("slates")
    ap.add_argument("--limit", type=int, help="only the first LIMIT slates of SLATES")
    ap.add_argument("--what", default="", help="free text stored in the JSON")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    rows = {r["slate_id"]: r for r in map(json.loads, open(a.rankings, encoding="utf-8"))}
    slates = read_slates(a.slates, limit=a.limit)
    ids = [s["slate_id"] for s in slates]
    missing = [i for i in ids if i not in rows]
    if missing:
        raise SystemExit(f"{a.rankings} lacks {len(missing)} of the {len(ids)} slates (first {missing[0]})")
    same = top1 = 0
    maxd = 0.0
    for s, m in zip(slates, scores_from_cache(a.checkpoint, FeatureCache.open(a.cache), ids, threads=1)):
        r = rows[s["slate_id"]]
        o = decode(m, len(s["candidates"])).tolist()
        same += o == r["order"]
        top1 += o[0] == r["order"][0]
        assigned = m[r["order"], np.arange(len(o))]
        maxd = max(maxd, float(np.max(np.abs(np.array(r["scores"]) - assigned))))
    out = {"what": a.what, "rankings": a.rankings, "checkpoint": a.checkpoint, "feature_cache": a.cache,
           "slates_file": a.slates, "slates": len(ids), "perm_match_rate": same / len(ids),
           "top1_agreement": top1 / len(ids), "max_abs_diff_assigned_scores": maxd}
    atomic_write_json(a.out, envelope("rankings_vs_checkpoint", out))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
