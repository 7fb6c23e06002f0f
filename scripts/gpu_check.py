#!/usr/bin/env python
"""Helper of scripts/gpu_check.sh (runs on the GPU machine). Subcommands:

``tiny DIR``
    make a tiny random Qwen3 checkpoint (K=8), merge it, export it with ``--precision fp16`` and write
    tiny slates: the smallest end-to-end case for ``hllm build`` / ``hllm parity``.
``proxy``
    PyTorch-CUDA proxy of the TensorRT FP16 plan (no TensorRT needed): the reference model in FP16 (and
    in BF16) with the same FP32 islands (Hugging Face RMSNorm and rotary compute in FP32; CUDA SDPA keeps
    softmax statistics in FP32; the head's LayerNorms and attention run in FP32 in hllm.model.heads; the
    head's output projection is forced to FP32 here = the ``scores`` island) vs the same model in FP32 on
    the GPU (TF32 off): ranking parity on real slates (:func:`hllm.verify.parity.run_parity`: top-1
    agreement, Kendall tau, max|ΔM|) and a latency floor at N=50 (backbone+head forward,
    CUDA-synchronised, warm-up separated).
``paper-latency``
    latency at the paper's shape: a Qwen3-0.6B-shaped backbone with random weights (28 layers, hidden
    1024, 16 query / 8 KV heads of 128, MLP 3072) + a self-attention head (d_model 512, K = 50), one
    slate of N = 50 candidates in S ≈ 1,350 tokens, FP16 / BF16 with the islands and FP32, against the
    paper's hLLM figure (28 ms on an A100, Table 2).
``plan``
    print, as JSON, the steps, inputs and time budget of a run with these arguments, and check them
    (files exist, limits in range); needs no GPU (the CPU test of this script runs it).
``summary JSON...``
    print one table from the JSON files the script wrote.

``proxy`` and ``paper-latency`` fail fast without a CUDA GPU: one line on stderr, exit code 2.
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
            super().__init__(k, context=model.reads_context)  # the committed checkpoint's head reads the user context
            self.sidecar = {"precision": precision}  # read by hllm.verify.parity.run_parity

        def _activate(self):
            pass

        def _deactivate(self):
            pass

        def _run(self, input_ids, readout_positions, item_mask, context_positions=None):
            with torch.inference_mode():
                arrays = (input_ids, readout_positions, item_mask) + ((context_positions,) if self.context else ())
                return model(*[torch.from_numpy(x).to(device) for x in arrays]).float().cpu().numpy()

    return CudaTorchEngine()


DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
#: The paper's latency figures (Table 2, A100, as quoted in docs/benchmarks.md): hLLM single pass and the
#: no-reasoning autoregressive teacher.
PAPER_MS = {"hllm": 28.0, "ar_no_reasoning": 88.0}


def _scores_island(model):
    """The ``scores`` island: the head's final projection in FP32 (input cast up)."""
    out = model.head.out if hasattr(model.head, "out") else None
    if out is not None:
        out.float()
        out.register_forward_pre_hook(lambda mod, inp: tuple(x.float() for x in inp))
    return model


def _fp16_with_islands(ckpt, device: str = "cuda", precision: str = "fp16"):
    """The checkpoint's model in ``precision`` (fp16 / bf16) with the export's FP32 islands, on ``device``."""
    import torch

    from hllm.model.hllm import load_model

    return _scores_island(load_model(ckpt, dtype=getattr(torch, DTYPES[precision])).to(device).eval())


def require_gpu(device: str) -> int:
    """0 when ``device`` is usable; else print one line on stderr and return 2 (no traceback)."""
    if device == "cpu":
        return 0
    try:
        import torch
    except ImportError:
        print("gpu_check: torch is not installed; this check needs torch with CUDA and an NVIDIA GPU", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print(f"gpu_check: no CUDA GPU (torch {torch.__version__}, torch.cuda.is_available() is False); "
              "run it on a GPU machine (--device cpu only smoke-tests the code)", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # the FP32 reference is IEEE FP32
    torch.backends.cudnn.allow_tf32 = False
    return 0


def _forward_ms(model, builder, slates, n_items: int, warmup: int, runs: int, dev: str) -> dict:
    """Median/p90 of a CUDA-synchronised forward of one slate of ``n_items`` (warm-up discarded)."""
    import torch

    from hllm.measure import summarize

    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    samples = []
    for i in range(warmup + runs):
        s = dict(slates[i % len(slates)])
        s["candidates"] = s["candidates"][:n_items]
        b = builder.encode([s])
        t = [torch.from_numpy(x).to(dev) for x in b.inputs(model.reads_context).values()]
        sync()
        t1 = time.perf_counter()
        with torch.inference_mode():
            model(*t)
        sync()
        if i >= warmup:
            samples.append((time.perf_counter() - t1) * 1e3)
    return {"forward_ms": summarize(samples), "n_items": n_items, "batch": 1, "runs": runs, "warmup": warmup}


def cmd_proxy(args) -> int:
    rc = require_gpu(args.device)
    if rc:
        return rc
    import torch

    from hllm.files import atomic_write_json
    from hllm.formats.report import envelope
    from hllm.model.hllm import load_model
    from hllm.verify.parity import Thresholds, run_parity
    from hllm.runtime import Ranker, read_slates
    from hllm.runtime.artefact import resolve
    from hllm.runtime.prompt import PromptBuilder, load_tokenizer

    dev = args.device
    art = resolve(args.checkpoint)
    builder = PromptBuilder(load_tokenizer(art.tokenizer_path), art.prompt, max_items=art.num_positions)
    models = {"fp32": load_model(args.checkpoint).to(dev).eval()}
    for prec in args.precisions:
        models[prec] = _fp16_with_islands(args.checkpoint, dev, prec)
    ref = Ranker(_cuda_engine(models["fp32"], art.num_positions, "fp32", dev), builder)
    slates = read_slates(args.slates, limit=args.limit)
    th = Thresholds(atol=args.atol, min_perm_match=0.0, min_top1=0.99, min_tau=0.99)
    parity, passed = {}, True
    for prec in args.precisions:
        t0 = time.perf_counter()
        rep = run_parity(ref, Ranker(_cuda_engine(models[prec], art.num_positions, prec, dev), builder), slates, th)
        parity[prec] = {**rep.to_dict(per_slate=False), "seconds": round(time.perf_counter() - t0, 1)}
        passed = passed and rep.passed
    full = [s for s in slates if len(s["candidates"]) >= args.n_items] or slates
    lat = {f"{k}_islands" if k != "fp32" else k: _forward_ms(m, builder, full, args.n_items, args.warmup, args.runs, dev)
           for k, m in models.items()}
    out = {
        "mode": "pytorch-cuda proxy (no TensorRT): FP16 / BF16 with FP32 islands vs FP32 (TF32 off), all on the GPU",
        **_machine(dev),
        "checkpoint": args.checkpoint, "slates_file": args.slates, "slate_subset": f"first {len(slates)}",
        "islands": "rmsnorm (HF, FP32), rotary (HF, FP32), softmax (SDPA FP32 statistics), layernorm + head "
                   "attention (hllm heads, FP32), scores (head.out forced FP32)",
        "parity": parity, "latency": lat,
    }
    atomic_write_json(args.out, envelope("gpu_check", out))
    print(json.dumps({k: out[k] for k in ("device", "torch", "cuda")}))
    return 0 if passed else 1


def _machine(dev: str) -> dict:
    import torch

    gpu = dev == "cuda"
    return {"device": torch.cuda.get_device_name(0) if gpu else f"{dev} (smoke test, not a GPU figure)",
            "compute_capability": ".".join(map(str, torch.cuda.get_device_capability(0))) if gpu else None,
            "torch": torch.__version__, "cuda": torch.version.cuda}


def paper_model(layers: int, hidden: int, dtype: str, dev: str, k: int = 50, seed: int = 0):
    """A Qwen3-0.6B-shaped HllmModel with random weights (Qwen3-0.6B config.json: 28 layers, hidden 1024,
    intermediate 3072, 16 heads / 8 KV heads, head_dim 128, vocab 151,936) + a self-attention head
    (paper §3.3: d_model 512, 2 layers, K = ``k``), in ``dtype`` with the scores island."""
    import torch
    from transformers import AutoModel, Qwen3Config

    from hllm.formats.checkpoint import HeadSpec
    from hllm.model.heads import build_head
    from hllm.model.hllm import HllmModel

    cfg = Qwen3Config(vocab_size=151936, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                      num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                      tie_word_embeddings=True)
    torch.manual_seed(seed)
    with torch.device(dev):
        backbone = AutoModel.from_config(cfg, dtype=getattr(torch, DTYPES[dtype]))
    head = build_head(HeadSpec("self_attention", input_dim=hidden, num_positions=k), seed=seed)
    model = HllmModel(backbone, head.to(dev, getattr(torch, DTYPES[dtype]))).eval()
    return _scores_island(model) if dtype != "fp32" else model


def cmd_paper_latency(args) -> int:
    rc = require_gpu(args.device)
    if rc:
        return rc
    import torch

    from hllm.measure import summarize
    from hllm.files import atomic_write_json
    from hllm.formats.report import envelope

    dev, n, s = args.device, args.n_items, args.seq
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 151936, (1, s), generator=g).to(dev)
    readout = torch.sort(torch.randperm(s - 100, generator=g)[:n] + 100).values.view(1, n).to(dev)
    mask = torch.ones(1, n, dtype=torch.bool, device=dev)
    lat = {}
    for dtype in [*args.precisions, "fp32"]:
        model = paper_model(args.layers, args.hidden, dtype, dev, k=n)
        samples = []
        for i in range(args.warmup + args.runs):
            sync()
            t0 = time.perf_counter()
            with torch.inference_mode():
                model(ids, readout, mask)
            sync()
            if i >= args.warmup:
                samples.append((time.perf_counter() - t0) * 1e3)
        st = summarize(samples)
        lat[dtype] = {"forward_ms": st, "vs_paper_hllm": round(st["median"] / PAPER_MS["hllm"], 3)}
        del model
        if dev == "cuda":
            torch.cuda.empty_cache()
    out = {"mode": "paper-shape latency: Qwen3-0.6B-shaped random weights, PyTorch eager + SDPA (no TensorRT)",
           **_machine(dev), "shape": {"layers": args.layers, "hidden": args.hidden, "seq": s, "n_items": n, "batch": 1},
           "runs": args.runs, "warmup": args.warmup, "paper_ms": PAPER_MS,
           "paper_source": "hLLM paper Table 2 (A100), as quoted in docs/benchmarks.md", "latency": lat}
    atomic_write_json(args.out, envelope("gpu_check", out))
    print(json.dumps({k: {"median_ms": v["forward_ms"]["median"]} for k, v in lat.items()}))
    return 0


def cmd_plan(args) -> int:
    """Check the arguments of a full run and print its plan as JSON (no GPU, nothing written)."""
    problems = [f"{what} not found: {p}" for what, p in (("checkpoint", args.checkpoint), ("slates", args.slates))
                if not Path(p).exists()]
    if not 100 <= args.limit <= 5000:
        problems.append(f"--limit must be 100..5000 real slates (got {args.limit})")
    if not 1 <= args.seq - 100 >= args.n_items:
        problems.append(f"--seq {args.seq} leaves fewer than --n-items {args.n_items} readout positions")
    if problems:
        print("gpu_check plan: " + "; ".join(problems), file=sys.stderr)
        return 2
    steps = [
        {"step": "proxy", "precisions": ["fp32", *args.precisions], "slates": args.limit, "n_items": 50,
         "runs": args.runs, "warmup": args.warmup, "out": f"{args.out_dir}/proxy.json"},
        {"step": "paper-latency", "precisions": args.precisions + ["fp32"], "layers": args.layers, "hidden": args.hidden,
         "seq": args.seq, "n_items": args.n_items, "runs": args.runs, "warmup": args.warmup,
         "out": f"{args.out_dir}/paper_latency.json"},
        {"step": "summary", "out": "stdout"},
    ]
    print(json.dumps({"checkpoint": args.checkpoint, "slates": args.slates, "budget_s": args.budget_s,
                      "paper_ms": PAPER_MS, "steps": steps}, indent=2))
    return 0


def _rows(path: Path):
    d = json.loads(path.read_text())
    if "parity" in d and "latency" in d:  # proxy
        lat = d["latency"]
        for prec, p in d["parity"].items():
            yield (f"proxy {prec} vs fp32 (GPU)", d["device"], p["slates"], p["top1_agreement"], p["kendall_tau_mean"],
                   p["perm_match_rate"], p["nonfinite"], lat[f"{prec}_islands"]["forward_ms"]["median"],
                   lat["fp32"]["forward_ms"]["median"])
    elif "paper_ms" in d:  # paper-latency
        for prec, v in d["latency"].items():
            yield (f"paper shape {prec} S={d['shape']['seq']} N={d['shape']['n_items']}", d["device"], None, None,
                   None, None, None, v["forward_ms"]["median"], d["paper_ms"]["hllm"])
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
    hdr = ("check", "backend/device", "slates", "top1", "tau", "perm", "nonfinite", "ms (fp16/engine)", "ms (fp32/total/paper)")
    rows = [r for p in args.files for r in _rows(Path(p))]
    fmt = lambda v: "" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))  # noqa: E731
    widths = [max(len(h), *(len(fmt(r[i])) for r in rows)) if rows else len(h) for i, h in enumerate(hdr)]
    print(" | ".join(h.ljust(w) for h, w in zip(hdr, widths)))
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(fmt(v).ljust(w) for v, w in zip(r, widths)))
    return 0


def _common(p, out_default: str | None = None) -> None:
    p.add_argument("--precisions", type=lambda t: [x for x in t.split(",") if x], default=["fp16", "bf16"],
                   help="comma list of fp16,bf16 (each with the FP32 islands) compared with fp32")
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--device", default="cuda", help="cuda (the check) or cpu (smoke test of this code only)")
    if out_default is not None:
        p.add_argument("-o", "--out", default=out_default)


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
    p.add_argument("--atol", type=float, default=1.0)
    _common(p, "results/gpu/proxy.json")
    q = sub.add_parser("paper-latency")
    q.add_argument("--layers", type=int, default=28)
    q.add_argument("--hidden", type=int, default=1024)
    q.add_argument("--seq", type=int, default=1350)
    q.add_argument("--n-items", type=int, default=50)
    _common(q, "results/gpu/paper_latency.json")
    pl = sub.add_parser("plan")
    pl.add_argument("--checkpoint", default="checkpoints/smollm2-beauty")
    pl.add_argument("--slates", default="examples/beauty-eval-sample.jsonl.gz")
    pl.add_argument("--limit", type=int, default=100)
    pl.add_argument("--layers", type=int, default=28)
    pl.add_argument("--hidden", type=int, default=1024)
    pl.add_argument("--seq", type=int, default=1350)
    pl.add_argument("--n-items", type=int, default=50)
    pl.add_argument("--out-dir", default="results/gpu")
    pl.add_argument("--budget-s", type=int, default=480)
    _common(pl)
    s = sub.add_parser("summary")
    s.add_argument("files", nargs="+")
    args = ap.parse_args(argv)
    bad = [x for x in getattr(args, "precisions", []) if x not in ("fp16", "bf16")]
    if bad:
        print(f"gpu_check: --precisions takes fp16,bf16, got {bad}", file=sys.stderr)
        return 2
    return {"tiny": cmd_tiny, "proxy": cmd_proxy, "paper-latency": cmd_paper_latency, "plan": cmd_plan,
            "summary": cmd_summary}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
