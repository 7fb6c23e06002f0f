#!/usr/bin/env python
"""Which FP32 islands does the FP16 graph need? Ablation on real slates, CPU emulation vs PyTorch FP32.

For each variant (default islands; none; default minus one; default plus residual; optionally a ModelOpt AutoCast graph) the FP32 ONNX graph of ``hllm export`` is rewritten
by :func:`hllm.exporter.fp16.convert_to_fp16`, emulated in float32 by
:func:`hllm.exporter.fp16.emulate_fp16` (float16 rounding and overflow after every float16 node),
run in ONNX Runtime CPU, and compared slate by slate with the PyTorch FP32 reference
(:func:`hllm.verify.parity.compare_slate`; reference scores computed once). Writes one JSON.

    python scripts/fp16_islands.py --checkpoint work/demo/merged --fp32-onnx work/demo/export/model.onnx \\
        --slates data/amazon-beauty/eval.jsonl.gz --limit 10 -o results/fp16/islands_smollm2.json
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True, help="merged checkpoint (the FP32 PyTorch reference)")
    ap.add_argument("--fp32-onnx", required=True, help="FP32 model.onnx exported from that checkpoint")
    ap.add_argument("--slates", default="examples/beauty-eval-sample.jsonl.gz")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--candidates", type=int, default=0, help="keep only the first N candidates of each slate (0 = all)")
    ap.add_argument("--variants", default="default,none,-rmsnorm,-rotary,-softmax,-layernorm,-scores,+residual",
                    help="default = DEFAULT_ISLANDS; none; -X = default without X; +X = default plus X")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--autocast-onnx", help="also test this graph made by ModelOpt AutoCast (variant 'autocast')")
    ap.add_argument("-o", "--out", required=True)
    args = ap.parse_args(argv)

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from hllm.engines.ort import OnnxRuntimeEngine
    from hllm.formats.provenance import library_versions
    from hllm.exporter.fp16 import (DEFAULT_ISLANDS, PrecisionReport, convert_to_fp16, emulate_fp16,
                                    island_precision)
    from hllm.exporter.onnx_io import load_onnx, save_onnx
    from hllm.files import atomic_write_json
    from hllm.formats.report import envelope
    from hllm.reading import sha256_file
    from hllm.verify.parity import ParityReport, Thresholds, compare_slate
    from hllm.runtime import Ranker, read_slates

    slates = read_slates(args.slates, limit=args.limit)
    if args.candidates:
        slates = [{**s, "candidates": s["candidates"][: args.candidates]} for s in slates]
    ref = Ranker.from_path(args.checkpoint, threads=args.threads or None)
    t0 = time.perf_counter()
    batches, refs = [], []
    with ref:
        for s in slates:
            b = ref.builder.encode([s])
            batches.append(b)
            refs.append(ref.scores(b)[0, : int(b.n_items[0])])
    ref_s = time.perf_counter() - t0
    print(f"reference: {len(slates)} slates in {ref_s:.0f} s", flush=True)
    fp32 = load_onnx(args.fp32_onnx)
    th = Thresholds(atol=1e9, min_perm_match=0.0, min_top1=0.99, min_tau=0.99)  # |ΔM| recorded, not gated
    variants = []
    names = [v.strip() for v in args.variants.split(",") if v.strip()] + (["autocast"] if args.autocast_onnx else [])
    for v in names:
        if v == "autocast":
            islands = ()
            model16, rep = load_onnx(args.autocast_onnx), PrecisionReport(islands=["(ModelOpt AutoCast)"])
        else:
            if v in ("default", "none"):
                islands = DEFAULT_ISLANDS if v == "default" else ()
            elif v.startswith("+"):
                islands = DEFAULT_ISLANDS + (v[1:],)
            else:
                islands = tuple(i for i in DEFAULT_ISLANDS if i != v.lstrip("-"))
            model16, rep = convert_to_fp16(fp32, islands)
        node_precision = island_precision(fp32, model16)
        with tempfile.TemporaryDirectory(dir=Path(args.out).parent if Path(args.out).parent.exists() else None) as d:
            path = Path(d) / "emulated.onnx"
            save_onnx(emulate_fp16(model16), path)
            del model16
            t1 = time.perf_counter()
            records = []
            with OnnxRuntimeEngine(path, ref.engine.num_positions, intra_op_threads=args.threads) as eng:
                for s, b, r in zip(slates, batches, refs):
                    got = eng.run(b.input_ids, b.readout_positions, b.item_mask)[0, : int(b.n_items[0])]
                    records.append(compare_slate(r, got, str(s.get("slate_id", ""))))
        summary = ParityReport(records, th, precision="fp16").to_dict(per_slate=False)
        row = {"variant": v, "fp32_islands": list(islands), "conversion": rep.to_dict(),
               "node_precision_by_island": node_precision, **summary,
               "seconds": round(time.perf_counter() - t1, 1)}
        variants.append(row)
        print(f"{v:>11}: top1 {row['top1_agreement']:.3f} tau {row['kendall_tau_mean']:.4f} perm "
              f"{row['perm_match_rate']:.2f} max|Δ| {row['max_abs_diff']:.3g} nonfinite {row['nonfinite']}", flush=True)
    atomic_write_json(args.out, envelope("fp16_islands", {
        "what": "FP32-island ablation: FP16 graph (CPU emulation) vs PyTorch FP32 reference, same encoded slates",
        "emulation": "float16 weights kept as float32 holding float16 values; every float16 tensor a node produces "
                     "rounded by Cast(float16)->Cast(float32) (overflow -> inf); each node computes in float32 "
                     "(MatMul/ReduceMean accumulate in float32, as tensor cores with FP32 accumulate)",
        "checkpoint": args.checkpoint,
        "fp32_onnx": args.fp32_onnx,
        "fp32_onnx_sha256": sha256_file(args.fp32_onnx),
        "slates_file": args.slates,
        "slates": len(slates),
        "slate_subset": f"first {len(slates)} slates of the file"
                        + (f", each cut to its first {args.candidates} candidates" if args.candidates else ""),
        "pass_criteria": {"min_top1": th.min_top1, "min_tau": th.min_tau, "max_nonfinite": 0},
        "variants": variants,
        "versions": library_versions(),
        "reference_seconds": round(ref_s, 1),
    }))
    print(f"→ {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
