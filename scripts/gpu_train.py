#!/usr/bin/env python
"""Helper of scripts/gpu_train.sh. Subcommands:

``arithmetic --backbone DIR --slates N --tokens T --epochs E --rank R``
    the run's arithmetic as JSON: tokens per epoch, FLOPs per slate and per run (forward of the frozen
    weights, backward through them for the activation gradients only, LoRA forward + backward with
    weight gradients), LoRA parameters and adapter bytes, and the expected time on one GPU at a given
    peak and model-FLOPs utilisation (``--peak-tflops``, ``--mfu``). FLOP counts:
    :func:`hllm.measure.prefill_flops` (``2·P·S`` linear + causal attention) per forward; a backward
    costs about 2× its forward where weight gradients are computed and 1× where only activation
    gradients are (frozen weights) (Kaplan et al. 2020, §2.1: training ≈ 6·N FLOPs per token, of which
    2·N forward).
``tiny DIR --slates FILE --limit N --items 10``
    the plan's stand-ins: a tiny random Llama backbone (``hllm.testing``), the first N slates of FILE cut
    to ``--items`` candidates each (every positive + seeded others: short prompts, so the CPU dry run
    stays within seconds), and a teacher JSONL for them (candidates in reverse listing order:
    a synthetic teacher, used only where no teacher file or embedding model is at hand). Prints the paths
    as shell assignments.
``check CKPT OUT --train-json FILE``
    after training: the checkpoint has a head and an adapter whose tensors are all float32; copies
    ``hllm.json``, the head and the adapter into OUT/ckpt (not the optimizer state; an existing OUT/ckpt is
    replaced only where an earlier ``check`` wrote it, marked by ``.gpu_train-ckpt``, else exit 2) and writes
    OUT/gpu_train.json (hllm train's --json output, the compute used, tensor counts and bytes, the
    machine). Exit 1 when a check fails.

Bad input exits 2 with one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

SMOLLM2_135M = {"model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
                "num_key_value_heads": 3, "head_dim": 64, "intermediate_size": 1536, "vocab_size": 49152,
                "tie_word_embeddings": True}
CKPT_MARKER = ".gpu_train-ckpt"  # written into OUT/ckpt by ``check``; an OUT/ckpt without it is never deleted


def arithmetic(config: dict, slates: int, tokens: int, epochs: float, rank: int, peak_tflops: float,
               mfu: float) -> dict:
    """The numbers in scripts/gpu_train.sh's header, from a backbone config (see module doc)."""
    from hllm.formats.architectures import backbone_dims
    from hllm.measure import prefill_flops

    dims = backbone_dims(config)
    fwd = prefill_flops(dims, tokens)  # frozen weights, one slate
    lora_params = dims.num_layers * rank * sum(i + o for i, o in dims.linear_shapes().values())
    lora_fwd = 2.0 * lora_params * tokens
    per_slate = fwd * 2 + lora_fwd * 3  # frozen: forward + activation-gradient backward; LoRA: 1 + 2
    total = per_slate * slates * epochs
    seconds = total / (peak_tflops * 1e12 * mfu)
    return {"backbone": {"layers": dims.num_layers, "hidden": dims.hidden_size,
                         "decoder_linear_params": dims.non_embedding_params()},
            "slates": slates, "tokens_per_slate": tokens, "epochs": epochs,
            "tokens_per_epoch": slates * tokens, "lora_rank": rank, "lora_params": lora_params,
            "adapter_mb_fp32": round(lora_params * 4 / 1e6, 1), "adapter_mb_bf16": round(lora_params * 2 / 1e6, 1),
            "forward_gflop_per_slate": round(fwd / 1e9, 1), "train_gflop_per_slate": round(per_slate / 1e9, 1),
            "train_pflop_total": round(total / 1e15, 2), "peak_tflops": peak_tflops, "mfu": mfu,
            "expected_train_s": round(seconds)}


def cmd_arithmetic(args) -> int:
    cfg = SMOLLM2_135M
    if args.backbone and (Path(args.backbone) / "config.json").is_file():
        cfg = json.loads((Path(args.backbone) / "config.json").read_text())
    a = arithmetic(cfg, args.slates, args.tokens, args.epochs, args.rank, args.peak_tflops, args.mfu)
    print(json.dumps(a, indent=2))
    print(f"gpu_train: {a['tokens_per_epoch']:,} tokens per epoch, {a['train_gflop_per_slate']:,} GFLOP per slate, "
          f"{a['train_pflop_total']} PFLOP for {args.epochs} epoch(s); at {args.mfu:.0%} of {args.peak_tflops:g} TFLOP/s "
          f"≈ {a['expected_train_s']} s; adapter {a['lora_params']:,} parameters "
          f"({a['adapter_mb_fp32']} MB fp32)", file=sys.stderr)
    return 0


def cmd_tiny(args) -> int:
    from hllm.runtime.slates import read_slates, write_jsonl
    from hllm.testing import tiny_backbone

    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    bb = tiny_backbone(d / "backbone", "llama", seed=0)
    from hllm.runtime.slates import sample_subslate

    rows = [sample_subslate(s, args.items, seed=i)[0] for i, s in enumerate(read_slates(args.slates, limit=args.limit))]
    write_jsonl(d / "train.jsonl", rows)
    write_jsonl(d / "teacher.jsonl", [{"slate_id": s["slate_id"], "order": list(range(len(s["candidates"])))[::-1]}
                                      for s in rows])
    print(f"BACKBONE={bb}\nTRAIN={d / 'train.jsonl'}\nTEACHER={d / 'teacher.jsonl'}")
    return 0


def cmd_check(args) -> int:
    from safetensors.torch import load_file

    from hllm.files import atomic_write_json
    from hllm.formats.report import envelope
    from hllm.measure import describe_machine

    ck, out = Path(args.ckpt), Path(args.out)
    head, adapter = ck / "head.safetensors", ck / "adapter" / "adapter_model.safetensors"
    missing = [str(p) for p in (ck / "hllm.json", head, adapter) if not p.is_file()]
    if missing:
        print(f"gpu_train check: missing {', '.join(missing)}", file=sys.stderr)
        return 1
    tensors = {**{f"head/{k}": v for k, v in load_file(str(head)).items()},
               **{f"adapter/{k}": v for k, v in load_file(str(adapter)).items()}}
    not32 = sorted(k for k, v in tensors.items() if str(v.dtype) != "torch.float32")
    dst = out / "ckpt"
    src_r, dst_r = ck.resolve(), dst.resolve()
    if src_r == dst_r or dst_r in src_r.parents or src_r in dst_r.parents:
        print(f"gpu_train check: OUT/ckpt ({dst}) overlaps the checkpoint {ck}; choose another OUT", file=sys.stderr)
        return 2
    if dst.exists() or dst.is_symlink():
        if not (dst / CKPT_MARKER).is_file():   # only ever delete a copy this subcommand wrote
            print(f"gpu_train check: {dst} exists and was not written by gpu_train check (no {CKPT_MARKER}); "
                  "choose another OUT", file=sys.stderr)
            return 2
        shutil.rmtree(dst)
    (dst / "adapter").mkdir(parents=True)
    (dst / CKPT_MARKER).touch()
    for src in (ck / "hllm.json", head):
        shutil.copy2(src, dst / src.name)
    for src in (ck / "adapter").iterdir():
        shutil.copy2(src, dst / "adapter" / src.name)
    prov = json.loads((ck / "hllm.json").read_text()).get("provenance") or {}
    train = json.loads(Path(args.train_json).read_text()) if args.train_json else None
    rec = {"train": train, "compute": prov.get("compute"), "step": prov.get("step"),
           "train_slates": prov.get("train_slates"), "validation": prov.get("validation"),
           "tensors": len(tensors), "params": sum(v.numel() for v in tensors.values()),
           "adapter_bytes": adapter.stat().st_size, "non_fp32_tensors": not32, "machine": describe_machine()}
    atomic_write_json(out / "gpu_train.json", envelope("gpu_train", rec))
    print(f"gpu_train check: {len(tensors)} tensors ({rec['params']:,} parameters), "
          f"{'all float32' if not not32 else f'{len(not32)} not float32'}; adapter + head → {dst}")
    return 1 if not32 else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("arithmetic")
    a.add_argument("--backbone")
    a.add_argument("--slates", type=int, default=12000)
    a.add_argument("--tokens", type=int, default=1350)
    a.add_argument("--epochs", type=float, default=1.0)
    a.add_argument("--rank", type=int, default=64)
    a.add_argument("--peak-tflops", type=float, default=790.0)
    a.add_argument("--mfu", type=float, default=0.15)
    t = sub.add_parser("tiny")
    t.add_argument("dir")
    t.add_argument("--slates", required=True)
    t.add_argument("--limit", type=int, default=8)
    t.add_argument("--items", type=int, default=10, help="candidates kept per slate (every positive + seeded others)")
    c = sub.add_parser("check")
    c.add_argument("ckpt")
    c.add_argument("out")
    c.add_argument("--train-json")
    args = ap.parse_args(argv)
    from hllm.errors import HllmError

    try:
        return {"arithmetic": cmd_arithmetic, "tiny": cmd_tiny, "check": cmd_check}[args.cmd](args)
    except (HllmError, OSError, ValueError) as e:
        print(f"gpu_train {args.cmd}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
