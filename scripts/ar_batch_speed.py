"""Autoregressive teacher, one slate at a time vs B slates per ``generate`` call, on the same slates
in one run: wall time per slate of each, and whether the rankings are identical.

usage: python scripts/ar_batch_speed.py MODEL_DIR SLATES --count 4 --batch-size 4 --threads 2 --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import time

from hllm.measure import describe_machine
from hllm.files import atomic_write_json
from hllm.formats.report import envelope
from hllm.runtime.slates import read_slates
from hllm.teacher import ArRanker


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("slates")
    ap.add_argument("--count", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--free", action="store_true", help="unconstrained decoding")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    slates = read_slates(a.slates, limit=a.count)
    ar = ArRanker(a.model_dir, threads=a.threads)
    constrained = not a.free
    ar.rank(slates[0], constrained)  # warm-up, discarded
    t = time.perf_counter()
    single = [ar.rank(s, constrained) for s in slates]
    t_single = time.perf_counter() - t
    t = time.perf_counter()
    batched = list(ar.rank_all(slates, constrained, batch_size=a.batch_size))
    t_batched = time.perf_counter() - t
    out = {
        "model": a.model_dir, "slates_file": a.slates, "slates": len(slates), "batch_size": a.batch_size,
        "constrained": constrained, "threads": a.threads,
        "s_per_slate": {"one_by_one": t_single / len(slates), "batched": t_batched / len(slates)},
        "speedup": t_single / t_batched,
        "identical_orders": sum(x.order == y.order for x, y in zip(single, batched)),
        "valid": {"one_by_one": sum(x.valid for x in single), "batched": sum(x.valid for x in batched)},
        "decode_passes_mean": sum(x.decode_passes for x in single) / len(single),
        "prefill_tokens_mean": sum(x.prefill_tokens for x in single) / len(single),
        "machine": describe_machine(shared=True, note="other jobs may share the cores"),
    }
    atomic_write_json(a.out, envelope("ar_batch_speed", out))
    print(json.dumps({k: v for k, v in out.items() if k != "machine"}, indent=2))


if __name__ == "__main__":
    main()
