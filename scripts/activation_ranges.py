"""Per-layer activation ranges of an FP32 export on real slates (does INT8 need SmoothQuant?).

For the input of every weight MatMul of each decoder block: max |x|, the 99.9th percentile of |x| and
the outlier ratio (max channel abs-max / median channel abs-max), measured with ONNX Runtime on a
reproducible draw of real slates (hllm.calibration.recipes.activation_ranges; the figures and their definitions are
in its docstring). Draw from the calibration pool (the train split), not from the gate's slates.

usage: python scripts/activation_ranges.py EXPORT_DIR SLATES [--count 32] [--seed 0] [--batch-size 1]
       [--threads N] --out results/calibration/activation-ranges.json
"""

from __future__ import annotations

import argparse
import sys
import time

from hllm.calibration.recipes.activation_ranges import activation_ranges
from hllm.calibration.data import choose_slates
from hllm.files import atomic_write_json
from hllm.formats.report import envelope
from hllm.reading import sha256_file
from hllm.runtime.slates import read_slates


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export_dir")
    ap.add_argument("slates", help="slates file to draw from (JSONL, .gz ok), e.g. the train split")
    ap.add_argument("--count", type=int, default=32, help="slates to draw (default 32)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the draw (numpy default_rng)")
    ap.add_argument("--batch-size", type=int, default=1, help="slates per ORT run (pads are not counted)")
    ap.add_argument("--threads", type=int, default=None, help="ORT intra-op threads")
    ap.add_argument("--out", required=True, help="JSON report ('-' = stdout)")
    a = ap.parse_args(argv)
    if a.count < 1 or a.batch_size < 1:
        ap.error("--count and --batch-size must be ≥ 1")
    chosen = choose_slates(read_slates(a.slates), a.count, a.seed)
    t0 = time.perf_counter()
    rep = activation_ranges(a.export_dir, chosen, batch_size=a.batch_size, threads=a.threads)
    rep["seconds"] = round(time.perf_counter() - t0, 1)
    rep["draw"] = {"file": a.slates, "sha256": sha256_file(a.slates), "count": a.count, "seed": a.seed,
                   "slate_ids": [str(s.get("slate_id", "")) for s in chosen]}
    for layer in rep["layers"]:
        for e in layer["inputs"]:
            ratio = "n/a" if e["outlier_ratio"] is None else f"{e['outlier_ratio']:.1f}"
            print(f"layer {layer['layer']:>2}  {e['matmuls'][0].rsplit('.', 1)[-1]:<10} max {e['max_abs']:10.4g}  "
                  f"p99.9 {e['p99_9']:10.4g}  outlier ratio {ratio}", file=sys.stderr)
    if a.out == "-":
        import json

        print(json.dumps(rep, indent=1))
    else:
        atomic_write_json(a.out, envelope("activation_ranges", rep))
        print(f"→ {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
