"""[experiment] last run at commit 94a096a; output: results/precision/int8-openvino-smollm2-beauty-eval20.json. Kept for provenance, not maintained (experiments/README.md).
Which INT8 keeps the ranking on the committed checkpoint: NNCF INT8 (SmoothQuant) on OpenVINO, with and
without the outlier layers' down_proj kept in fp32, judged against PyTorch fp32 eager on real eval slates.

Usage: python experiments/int8_openvino.py STD_EXPORT ORT_EXPORT OUT_JSON [--slates N] [--calib N] [--variants a,b]
Writes OUT_JSON after every variant (figures per variant: s/slate median, top-1, Kendall tau, max|ΔM|,
ΔRecall@10, gate verdict) with the machine description (CPU flags).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import os

# The Amazon Beauty split files (examples/README.md says where they come from); override with the environment.
EVAL = os.environ.get("HLLM_EVAL_SLATES", "data/amazon-beauty/eval.jsonl.gz")
TRAIN = os.environ.get("HLLM_TRAIN_SLATES", "data/amazon-beauty/train.jsonl.gz")
OUTLIERS = ["backbone.layers.11.mlp.down_proj", "backbone.layers.28.mlp.down_proj", "backbone.layers.29.mlp.down_proj"]
VARIANTS = {
    "nncf_sq": dict(keep_float=()),
    "nncf_sq_keep_outlier_down_proj": dict(keep_float=OUTLIERS),
    "nncf_nosq_keep_outlier_down_proj": dict(keep_float=OUTLIERS, smooth_quant_alpha=-1.0),
    "nncf_sq_keep_head_outliers": dict(keep_float=OUTLIERS + ["head"]),
}


def timed_scores(engine, builder, slates):
    from hllm.runtime.ranker import slate_scores

    engine.activate()
    out, ts = [], []
    for s in slates:
        b = builder.encode([s])
        t0 = time.perf_counter()
        out += slate_scores(engine, b)
        ts.append(time.perf_counter() - t0)
    return out, statistics.median(ts)


def figures(ref, got, slates, seconds, ref_seconds):
    from hllm.verify.gate import gate_scores

    rep = gate_scores(ref, got, slates)
    d = rep.to_dict()
    return {"s_per_slate": round(seconds, 3), "speedup_vs_torch": round(ref_seconds / seconds, 3),
            "top1_agreement": d["top1_agreement"], "kendall_tau_mean": d["kendall_tau_mean"],
            "max_abs_dM": float(max(np.abs(a - b).max() for a, b in zip(ref, got))),
            "recall@10_delta": d["recall@10_delta"], "nonfinite": d.get("nonfinite"), "gate_passed": d["passed"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("std"), ap.add_argument("ort"), ap.add_argument("out")
    ap.add_argument("--slates", type=int, default=20), ap.add_argument("--calib", type=int, default=16)
    ap.add_argument("--variants", default=",".join(VARIANTS)), ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workdir", default="work/precision-int8")
    ap.add_argument("--reference", default="torch", choices=["torch", "openvino_fp32"])
    a = ap.parse_args(argv)
    from hllm.measure import describe_machine
    from hllm.calibration.recipes.openvino_int8 import calibration_feeds
    from hllm.calibration.recipes.openvino_int8 import quantize_openvino
    from hllm.engines.openvino import OpenVinoEngine
    from hllm.engines.ort import OnnxRuntimeEngine
    from hllm.engines.reference import TorchEngine
    from hllm.runtime.artefact import open_engine, resolve
    from hllm.runtime.prompt import PromptBuilder
    from hllm.runtime.slates import read_slates

    art = resolve(a.std)
    from hllm.runtime.prompt import load_tokenizer

    builder = PromptBuilder(load_tokenizer(art.tokenizer_path), art.prompt, max_items=art.num_positions)
    slates = read_slates(EVAL)[: a.slates]
    res = {"cpu": describe_machine(shared=True, note="2 cores shared with other jobs; nice"), "eval": EVAL,
           "slates": len(slates), "threads": a.threads, "reference": "PyTorch fp32 eager (checkpoints/smollm2-beauty)",
           "variants": {}}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save():
        out.write_text(json.dumps(res, indent=1))

    cache = Path(a.workdir) / f"{a.reference}-ref-{a.slates}.npz"
    if cache.is_file():
        z = np.load(cache)
        ref, ref_s = [z[f"s{i}"] for i in range(len(slates))], float(z["seconds"])
    elif a.reference == "openvino_fp32":  # equals PyTorch fp32 within 6e-5 on these slates (variants.openvino_fp32)
        ref, ref_s = timed_scores(OpenVinoEngine(art.path, art.num_positions, threads=a.threads, context=art.context),
                                  builder, slates)
    else:
        ref, ref_s = timed_scores(TorchEngine("checkpoints/smollm2-beauty", threads=a.threads), builder, slates)
    if not cache.is_file():
        cache.parent.mkdir(parents=True, exist_ok=True)
        np.savez(cache, seconds=ref_s, **{f"s{i}": x for i, x in enumerate(ref)})
    res["reference_s_per_slate"] = round(ref_s, 3)
    old = json.loads(out.read_text()) if out.is_file() else {}
    res["torch_fp32_s_per_slate"] = old.get("torch_fp32_s_per_slate", round(ref_s, 3) if a.reference == "torch" else None)
    if a.reference != "torch":
        ref_s = res["torch_fp32_s_per_slate"] or ref_s  # speed-ups stay relative to PyTorch eager (not interleaved)
    if a.reference != "torch":
        res["int8_reference"] = (f"{a.reference} scores (the fp32 rows compare with PyTorch fp32 eager; "
                                 "the int8 rows with this reference, to save CPU)")
    if out.is_file():
        res["variants"].update(json.loads(out.read_text()).get("variants", {}))
    for name, eng in (("ort_fused_fp32", OnnxRuntimeEngine(Path(a.ort) / "model.onnx", art.num_positions,
                                                            intra_op_threads=a.threads, context=art.context)),
                      ("openvino_fp32", OpenVinoEngine(art.path, art.num_positions, threads=a.threads, context=art.context))):
        if name in res["variants"]:
            continue
        got, s = timed_scores(eng, builder, slates)
        eng.deactivate()
        res["variants"][name] = figures(ref, got, slates, s, ref_s)
        print(name, res["variants"][name], flush=True)
        save()
    calib = calibration_feeds(read_slates(TRAIN, limit=400), builder, a.calib, 0, art.context,
                              exclude_ids=[s["slate_id"] for s in slates])
    res["calibration"] = {"file": TRAIN, "count": a.calib, "seed": 0}
    work = Path(a.workdir)
    for v in a.variants.split(","):
        d = work / v
        if not d.exists():
            rec = quantize_openvino(a.std, d, calib, **VARIANTS[v])
        else:
            rec = json.loads((d / "export.json").read_text())["quantization"]
        eng = open_engine(resolve(d), threads=a.threads)
        got, s = timed_scores(eng, builder, slates)
        eng.deactivate()
        res["variants"][v] = {**figures(ref, got, slates, s, ref_s), "quantization": rec}
        print(v, {k: x for k, x in res["variants"][v].items() if k != "quantization"}, flush=True)
        save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
