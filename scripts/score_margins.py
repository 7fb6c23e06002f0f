"""How firmly a checkpoint's FP32 score matrices decide their rankings: per slate, the LAPJV
assignment's total score minus the best total score of an assignment that puts another item first
(the top-1 margin), and the spread of M across items vs across positions.

A perturbation of the scores (quantization, FP16) can flip the top item only where it moves the two
totals by more than this margin combined. Input: a reference-score cache written by
``hllm calibrate --reference-scores`` (``.npz``, one ``[n_i, K]`` matrix per slate), or a checkpoint
scored by PyTorch from a feature cache of the slates (``hllm features``; cheap with a rows-only cache).

usage: python scripts/score_margins.py REF.npz --out OUT.json
       python scripts/score_margins.py --checkpoint CKPT --features CACHE --slates FILE [--limit N] --out OUT.json
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from hllm.files import atomic_write_json
from hllm.formats.report import envelope
from hllm.runtime.decode import decode


def top1_margin(m: np.ndarray) -> float:
    """``m`` ``[n, K]`` float64 (K ≥ n, n ≥ 2): total assigned score of the LAPJV ranking minus that of
    the best ranking with another item at position 0 (≥ 0, in score units)."""
    n = m.shape[0]
    cols = np.arange(n)
    best = decode(m, n)
    alt_m = m.copy()
    alt_m[best[0], 0] = m.min() - 1e3 * (np.abs(m).max() + 1)  # forbid the same item at position 0
    alt = decode(alt_m, n)
    return float(m[best, cols].sum() - m[alt, cols].sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reference", nargs="?")
    ap.add_argument("--checkpoint")
    ap.add_argument("--features")
    ap.add_argument("--slates")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.reference:
        z = np.load(a.reference, allow_pickle=False)
        mats = [z[f"scores/{i}"] for i in range(len(z["slate_ids"]))]  # layout of hllm.verify.reference.save_reference
    elif a.checkpoint and a.features and a.slates:
        from hllm.runtime.slates import read_slates
        from hllm.training.features import FeatureCache, scores_from_cache

        slates = read_slates(a.slates, limit=a.limit)
        ids = [str(s.get("slate_id", i)) for i, s in enumerate(slates)]
        mats = list(scores_from_cache(a.checkpoint, FeatureCache.open(a.features), ids, slates=slates))
        a.reference = f"{a.checkpoint} on {a.features} ({len(ids)} slates of {a.slates})"
    else:
        ap.error("give REF.npz, or --checkpoint, --features and --slates")
    margins = [top1_margin(m.astype(np.float64)) for m in mats]
    out = {
        "reference": a.reference,
        "slates": len(mats),
        "top1_margin": {"min": min(margins), "median": float(np.median(margins)), "max": max(margins),
                        "per_slate": margins},
        "std_across_positions_mean": float(np.mean([m.mean(0).std() for m in mats])),
        "std_across_items_mean": float(np.mean([m.mean(1).std() for m in mats])),
    }
    atomic_write_json(a.out, envelope("score_margins", out))
    print(json.dumps({k: v for k, v in out.items() if k != "top1_margin"} | {"top1_margin": {
        k: v for k, v in out["top1_margin"].items() if k != "per_slate"}}, indent=2))


if __name__ == "__main__":
    main()
