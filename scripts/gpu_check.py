#!/usr/bin/env python
"""Helper of scripts/gpu_check.sh (runs on the GPU machine). Subcommands:

``tiny DIR``
    make a tiny random Qwen3 checkpoint (K=8), merge it, export it with ``--precision fp16`` and write
    tiny slates: the smallest end-to-end case for ``hllm build`` / ``hllm parity``.
``proxy``
    PyTorch-CUDA proxy of the TensorRT FP16 plan (no TensorRT needed): the reference model in FP16 with
    the same FP32 islands (Hugging Face RMSNorm and rotary compute in FP32; CUDA SDPA keeps softmax
    statistics in FP32; the head's LayerNorms and attention run in FP32 in hllm.model.heads; the head's
    output projection is forced to FP32 here = the ``scores`` island) vs the same model in FP32 on the
    GPU: ranking parity on real slates (:func:`hllm.verify.parity.run_parity`) and a latency floor at N=50
    (backbone+head forward, CUDA-synchronised, warm-up separated).
``summary JSON...``
    print one table from the JSON files the script wrote.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np


def cmd_tiny(args) -> int:
    from hllm.checkpoint.merge import merge_checkpoint
    from hllm.exporter.onnx import export_onnx
    from hllm.checkpoint.init import init_checkpoint
    from hllm.runtime.slates import write_jsonl
    from hllm.testing import tiny_backbone, tiny_slates

    d = Path(args.dir)
    bb = tiny_backbone(d / "backbone", "qwen3", seed=0)
    ck = init_checkpoint(bb, d / "ckpt", "self_attention", 8, seed=0, lora_rank=4,
                         head_kwargs=dict(d_model=32, num_heads=4, ff_dim=64), overwrite=True)
    merge_checkpoint(ck, d / "merged", tiny_slates(2, (2, 8)), overwrite=True)
    export_onnx(d / "merged", d / "export16", precision="fp16", overwrite=True)
    write_jsonl(d / "slates.jsonl", tiny_slates(64, (1, 8), seed=7))
    print(d / "export16")
    return 0


def _cuda_engine(model, k: int, precision: str, device: str = "cuda"):
    """An :class:`hllm.engines.base.Engine` over an HllmModel on CUDA (proxy mode only)."""
    import torch

    from hllm.engines.base import Engine

    class CudaTorchEngine(Engine):
        name = f"torch-cuda-{precision}"

        def __init__(self):
            super().__init__(k)
            self.sidecar = {"precision": precision}  # read by hllm.verify.parity.run_parity

        def _activate(self):
            pass

        def _deactivate(self):
            pass

        def _run(self, input_ids, readout_positions, item_mask, context_positions=None):
            with torch.inference_mode():
                t = [torch.from_numpy(x).to(device) for x in (input_ids, readout_positions, item_mask)]
                return model(*t).float().cpu().numpy()

    return CudaTorchEngine()


def _fp16_with_islands(ckpt, device: str = "cuda"):
    import torch

    from hllm.model.hllm import load_model

    model = load_model(ckpt, dtype=torch.float16).to(device).eval()
    out = model.head.out if hasattr(model.head, "out") else None
    if out is not None:  # `scores` island: final projection in FP32
        out.float()
        out.register_forward_pre_hook(lambda mod, inp: tuple(x.float() for x in inp))
    return model


def cmd_proxy(args) -> int:
    import torch

    from hllm.timing import summarize
    from hllm.files import atomic_write_json
    from hllm.model.hllm import load_model
    from hllm.verify.parity import Thresholds, run_parity
    from hllm.runtime import Ranker, read_slates
    from hllm.runtime.artefact import resolve
    from hllm.runtime.prompt import PromptBuilder, load_tokenizer

    dev = args.device
    if dev == "cuda" and not torch.cuda.is_available():
        print("proxy mode needs torch with CUDA and a GPU (--device cpu only smoke-tests the code)", file=sys.stderr)
        return 2
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    art = resolve(args.checkpoint)
    builder = PromptBuilder(load_tokenizer(art.tokenizer_path), art.prompt, max_items=art.num_positions)
    fp32 = load_model(args.checkpoint).to(dev).eval()
    fp16 = _fp16_with_islands(args.checkpoint, dev)
    ref = Ranker(_cuda_engine(fp32, art.num_positions, "fp32", dev), builder)
    tst = Ranker(_cuda_engine(fp16, art.num_positions, "fp16", dev), builder)
    slates = read_slates(args.slates, limit=args.limit)
    th = Thresholds(atol=args.atol, min_perm_match=0.0, min_top1=0.99, min_tau=0.99)
    t0 = time.perf_counter()
    rep = run_parity(ref, tst, slates, th)
    parity = rep.to_dict(per_slate=False)
    parity["seconds"] = round(time.perf_counter() - t0, 1)

    full = [s for s in slates if len(s["candidates"]) >= args.n_items] or slates
    lat = {}
    for name, model in (("fp16_islands", fp16), ("fp32", fp32)):
        samples = []
        for i in range(args.warmup + args.runs):
            s = dict(full[i % len(full)])
            s["candidates"] = s["candidates"][: args.n_items]
            b = builder.encode([s])
            t = [torch.from_numpy(x).to(dev) for x in (b.input_ids, b.readout_positions, b.item_mask)]
            sync()
            t1 = time.perf_counter()
            with torch.inference_mode():
                model(*t)
            sync()
            if i >= args.warmup:
                samples.append((time.perf_counter() - t1) * 1e3)
        lat[name] = {"forward_ms": summarize(samples), "n_items": args.n_items, "batch": 1,
                     "runs": args.runs, "warmup": args.warmup}
    with tst:
        stage = []
        for i in range(args.warmup + args.runs):
            s = dict(full[i % len(full)])
            s["candidates"] = s["candidates"][: args.n_items]
            _, st = tst.rank_batch([s])
            if i >= args.warmup:
                stage.append({"prompt_ms": st.prompt_ms, "engine_ms": st.engine_ms, "decode_ms": st.decode_ms})
        lat["fp16_islands"]["ranker_stages_ms"] = {k: summarize([x[k] for x in stage]) for k in stage[0]}
    out = {
        "mode": "pytorch-cuda proxy (no TensorRT): FP16 with FP32 islands vs FP32, both on the GPU",
        "device": torch.cuda.get_device_name(0) if dev == "cuda" else f"{dev} (smoke test, not a GPU figure)",
        "compute_capability": ".".join(map(str, torch.cuda.get_device_capability(0))) if dev == "cuda" else None,
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "checkpoint": args.checkpoint, "slates_file": args.slates, "slate_subset": f"first {len(slates)}",
        "islands": "rmsnorm (HF, FP32), rotary (HF, FP32), softmax (SDPA FP32 statistics), layernorm + head "
                   "attention (hllm heads, FP32), scores (head.out forced FP32)",
        "parity": parity, "latency": lat,
    }
    atomic_write_json(args.out, out)
    print(json.dumps({k: out[k] for k in ("device", "torch", "cuda")}))
    return 0 if rep.passed else 1


def _rows(path: Path):
    d = json.loads(path.read_text())
    if "parity" in d and "latency" in d:  # proxy
        p, lat = d["parity"], d["latency"]
        yield ("proxy fp16 vs fp32 (GPU)", d["device"], p["slates"], p["top1_agreement"], p["kendall_tau_mean"],
               p["perm_match_rate"], p["nonfinite"], lat["fp16_islands"]["forward_ms"]["median"],
               lat["fp32"]["forward_ms"]["median"])
    elif "top1_agreement" in d:  # hllm parity report
        yield (f"parity {path.stem}", d.get("backend", ""), d["slates"], d["top1_agreement"], d["kendall_tau_mean"],
               d["perm_match_rate"], d["nonfinite"], None, None)
    elif "records" in d:  # hllm bench stages
        for r in d["records"]:
            if r.get("kind") == "stages":
                ms = r["stage_ms"]
                yield (f"bench B={r['batch_size']} N={r['n_items']}", r["backend"], None, None, None, None, None,
                       ms.get("engine"), ms.get("total"))


def cmd_summary(args) -> int:
    hdr = ("check", "backend/device", "slates", "top1", "tau", "perm", "nonfinite", "ms (fp16/engine)", "ms (fp32/total)")
    rows = [r for p in args.files for r in _rows(Path(p))]
    fmt = lambda v: "" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))  # noqa: E731
    widths = [max(len(h), *(len(fmt(r[i])) for r in rows)) if rows else len(h) for i, h in enumerate(hdr)]
    print(" | ".join(h.ljust(w) for h, w in zip(hdr, widths)))
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(fmt(v).ljust(w) for v, w in zip(r, widths)))
    return 0


def main(argv=None) -> int:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    ap = argparse.ArgumentParser(description="gpu_check helper")
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tiny")
    t.add_argument("dir")
    p = sub.add_parser("proxy")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--slates", required=True)
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--n-items", type=int, default=50)
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--atol", type=float, default=1.0)
    p.add_argument("--device", default="cuda", help="cuda (the check) or cpu (smoke test of this code only)")
    p.add_argument("-o", "--out", required=True)
    s = sub.add_parser("summary")
    s.add_argument("files", nargs="+")
    args = ap.parse_args(argv)
    return {"tiny": cmd_tiny, "proxy": cmd_proxy, "summary": cmd_summary}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
