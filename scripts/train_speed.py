#!/usr/bin/env python
"""Training throughput in fp32 and bf16 autocast on this machine: slates per hour of the two steps a
CPU training run spends its time in, measured with the trainer's own code on real slates.

* **cache step**: the frozen layers ``0..c-1`` of one slate's prompt, batch 1, no grad — what
  ``hllm features --layer c`` and ``hllm train --lora-layers`` run once per slate
  (:func:`hllm.training.data.prepare`).
* **LoRA step**: one optimizer step on one slate (batch 1, accumulation 1): forward, fp32 Sinkhorn loss,
  backward, AdamW (:func:`hllm.training.trainer.train_step`), for LoRA of rank r on every linear projection
  of every layer (``--lora-layers`` unset: the paper's setting) and, from the cached state, on the top
  ``L - c`` layers only (the CPU recipe).

The two precisions run in one process on the same slates, alternating slate by slate (fp32 then bf16),
so load from other work hits both alike; the first slate is a warm-up and is not counted (oneDNN
builds its bf16 kernels on first use). Each timing records wall seconds and the process's CPU seconds
(``time.process_time``, all threads): on cores shared with other jobs the wall time measures the share
the job got, the CPU time the work itself. Slates per hour = 3600 / median wall seconds per slate;
``cpu_s_per_slate`` / threads is what a slate takes with the cores to itself.
The JSON records the machine (:func:`hllm.measure.describe_machine`, with the 1-minute load before and
after), library versions, the command, per-slate seconds and the prompt lengths.

usage: python scripts/train_speed.py BACKBONE SLATES --out OUT.json [--limit 4] [--layer 28] [--rank 64]
       [--threads 2] [--shared]

Exits 2 with one line on bad input (a missing backbone or slates file, an existing --out, bf16 not
supported on this machine) before any measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _model(cfg):
    """The trainer's model and prompt builder for ``cfg`` on its device (:func:`hllm.training.trainer.build_model`)."""
    import torch

    from hllm.formats.prompt import PromptSpec
    from hllm.runtime.prompt import PromptBuilder, load_tokenizer
    from hllm.training.trainer import trainable_parameters, build_model

    from hllm.training.precision import resolve_compute

    model, _, _ = build_model(cfg)
    resolve_compute(cfg.precision, "cpu").cast_frozen(model.backbone)  # as hllm train does
    builder = PromptBuilder(load_tokenizer(cfg.backbone), PromptSpec.from_dict(cfg.prompt), max_items=cfg.num_positions)
    opt = torch.optim.AdamW(trainable_parameters(model).values(), lr=cfg.lr)
    return model, builder, opt


def measure(backbone: str, slates_path: str, limit: int, layer: int, rank: int, threads: int,
            all_layers: bool = True) -> dict:
    """Seconds per slate of the cache step and the LoRA steps in fp32 and bf16 (see module doc).

    ``all_layers=False`` skips the all-layer LoRA step (the slowest by far).
    Returns: ``{slates, prompt_tokens, layer, rank, runs: {name: {precision: [s per slate]}}}``; the first
    slate's times (warm-up) are dropped. Raises HllmError where bf16 is not supported here.
    """
    from hllm.formats.architectures import backbone_dims, read_config
    from hllm.model.threads import torch_threads
    from hllm.training.config import TrainConfig
    from hllm.training.data import load_slates, prepare
    from hllm.training.precision import resolve_compute
    from hllm.training.trainer import train_step

    computes = {p: resolve_compute(p, "cpu") for p in ("fp32", "bf16")}
    tmp = tempfile.mkdtemp(prefix="train-speed-")
    head = dict(d_model=256, num_heads=4, ff_dim=512, context=True)
    base = dict(backbone=backbone, slates=slates_path, out_dir=tmp, max_slates=limit + 1, target="clicks",
                lora_rank=rank, head_kwargs=head, batch_size=1, accum=1, lr=5e-4, threads=threads)
    runs: dict[str, dict[str, list[float]]] = {"cache_step": {}, "lora_step_top_layers": {}, "lora_step_all_layers": {}}
    cpu: dict[str, dict[str, list[float]]] = {k: {} for k in runs}

    def timed(name: str, precision: str, fn):
        t0, c0 = time.perf_counter(), time.process_time()
        result = fn()
        runs[name].setdefault(precision, []).append(time.perf_counter() - t0)
        cpu[name].setdefault(precision, []).append(time.process_time() - c0)
        return result

    with torch_threads(threads):
        slates, targets = load_slates(TrainConfig(**base))
        n_layers = backbone_dims(read_config(Path(backbone))).num_layers
        top = {p: TrainConfig(**{**base, "lora_layers": n_layers - layer}, precision=p) for p in computes}
        models = {p: _model(top[p]) for p in computes}
        examples: dict[str, list] = {p: [] for p in computes}
        tokens = []
        for i, s in enumerate(slates):
            tokens.append(len(models["fp32"][1].encode_one(s).ids))
            for p, c in computes.items():  # cache step: layers 0..layer-1, alternating precisions
                model, builder, _ = models[p]
                examples[p] += timed("cache_step", p, lambda: prepare(model, [s], builder, top[p], None, c))
        for i in range(len(slates)):  # top-layer LoRA step from the cached state
            for p, c in computes.items():
                model, builder, opt = models[p]
                model.train()
                timed("lora_step_top_layers", p,
                      lambda: train_step(model, opt, top[p], examples[p], targets, [i], builder.pad_id, top[p].lr, c))
        del models, examples
        if not all_layers:
            runs.pop("lora_step_all_layers"), cpu.pop("lora_step_all_layers")
            return _record(runs, cpu, slates, tokens, layer, n_layers, rank, threads, computes)
        full = {p: TrainConfig(**base, precision=p) for p in computes}
        models = {p: _model(full[p]) for p in computes}
        ids = {p: prepare(models[p][0], slates, models[p][1], full[p], None, computes[p]) for p in computes}
        for i in range(len(slates)):  # LoRA on every layer: the full forward and backward
            for p, c in computes.items():
                model, builder, opt = models[p]
                model.train()
                timed("lora_step_all_layers", p,
                      lambda: train_step(model, opt, full[p], ids[p], targets, [i], builder.pad_id, full[p].lr, c))
    return _record(runs, cpu, slates, tokens, layer, n_layers, rank, threads, computes)


def _record(runs, cpu, slates, tokens, layer, n_layers, rank, threads, computes) -> dict:
    """The measurement record, the warm-up slate dropped."""
    runs = {k: {p: [round(x, 3) for x in v[1:]] for p, v in d.items()} for k, d in runs.items()}
    cpu = {k: {p: [round(x, 3) for x in v[1:]] for p, v in d.items()} for k, d in cpu.items()}
    return {"slates": len(slates) - 1, "warmup_slates": 1, "prompt_tokens": tokens[1:], "layer": layer,
            "num_layers": n_layers, "rank": rank, "threads": threads, "compute": computes["bf16"].to_dict(),
            "frozen_weights_cast_once": True,
            "runs": runs, "cpu_s": cpu}


def gemm_rates(rows: int = 1300, d_in: int = 576, d_out: int = 1536, runs: int = 20, threads: int = 2) -> dict:
    """One decoder projection's product ``[rows, d_in] × [d_in, d_out]`` (SmolLM2's up/gate projection at a
    Beauty prompt's length), no grad: best of ``runs`` in GFLOP per CPU-second (``time.process_time``,
    robust to other jobs' share of the cores) in fp32, under bf16 autocast with an fp32 weight that needs
    no gradient (autocast converts it at every call), and with bf16 operands (the weight converted once)."""
    import torch

    from hllm.model.threads import torch_threads

    x = torch.randn(rows, d_in)
    lin = torch.nn.Linear(d_in, d_out, bias=False).requires_grad_(False)
    flop = 2.0 * rows * d_in * d_out

    def best(fn) -> float:
        fn()
        t = min(_cpu_time(fn) for _ in range(runs))
        return round(flop / t / 1e9, 1)

    with torch_threads(threads), torch.inference_mode():
        fp32 = best(lambda: lin(x))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            auto = best(lambda: lin(x))
        lb, xb = lin.to(torch.bfloat16), x.to(torch.bfloat16)
        bf16 = best(lambda: lb(xb))
    return {"shape": [rows, d_in, d_out], "runs": runs, "threads": threads, "fp32_gflops_per_cpu_s": fp32,
            "autocast_bf16_gflops_per_cpu_s": auto, "bf16_operands_gflops_per_cpu_s": bf16}


def _cpu_time(fn) -> float:
    c0 = time.process_time()
    fn()
    return max(time.process_time() - c0, 1e-9)


def summarize(rec: dict) -> dict:
    """Per step and precision: median wall and CPU seconds per slate, slates per hour (wall); the bf16
    speed-up over fp32 in wall time and in CPU time."""
    out = {}
    for name, d in rec["runs"].items():
        med = {p: statistics.median(v) for p, v in d.items()}
        cmed = {p: statistics.median(v) for p, v in rec["cpu_s"][name].items()}
        out[name] = {**{f"{p}_s_per_slate": round(m, 3) for p, m in med.items()},
                     **{f"{p}_cpu_s_per_slate": round(m, 3) for p, m in cmed.items()},
                     **{f"{p}_slates_per_hour": round(3600 / m) for p, m in med.items()},
                     "bf16_speedup": round(med["fp32"] / med["bf16"], 2),
                     "bf16_speedup_cpu_time": round(cmed["fp32"] / cmed["bf16"], 2)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("backbone")
    ap.add_argument("slates")
    ap.add_argument("--out", required=True)
    ap.add_argument("--limit", type=int, default=4, help="timed slates (one more is run first as warm-up)")
    ap.add_argument("--layer", type=int, default=28, help="the cache step runs layers 0..LAYER-1")
    ap.add_argument("--rank", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shared", action="store_true", help="other work ran on the same cores")
    ap.add_argument("--no-all-layers", action="store_true", help="skip the all-layer LoRA step")
    ap.add_argument("--gemm-only", action="store_true", help="only the one-projection product (gemm_rates)")
    args = ap.parse_args(argv)
    from hllm.errors import HllmError
    from hllm.files import atomic_write_json
    from hllm.formats.report import envelope
    from hllm.measure import describe_machine

    try:
        if not Path(args.backbone, "config.json").is_file():
            raise HllmError(f"backbone not found: {args.backbone}")
        if not Path(args.slates).is_file():
            raise HllmError(f"slates file not found: {args.slates}")
        if Path(args.out).exists():
            raise HllmError(f"{args.out} exists; choose another --out")
        if not 1 <= args.limit <= 100 or args.rank < 1:
            raise HllmError("--limit must be in 1..100 and --rank ≥ 1")
        load_before = round(os.getloadavg()[0], 2)
        t0 = time.perf_counter()
        if args.gemm_only:
            from hllm.formats.provenance import library_versions

            machine = describe_machine(shared=args.shared, note="best of 20 calls, CPU seconds")
            machine["load_avg_1m_before"] = load_before
            reps = [gemm_rates(threads=args.threads) for _ in range(5)]  # five repetitions: the spread is the noise
            atomic_write_json(args.out, envelope("train_speed", {"command": "python scripts/train_speed.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                                         "machine": machine, "versions": library_versions(), "gemm_repetitions": reps}))
            print(json.dumps(reps))
            return 0
        rec = measure(args.backbone, args.slates, args.limit, args.layer, args.rank, args.threads,
                      all_layers=not args.no_all_layers)
    except HllmError as e:
        print(f"train_speed: {e}", file=sys.stderr)
        return 2
    from hllm.formats.provenance import library_versions

    machine = describe_machine(shared=args.shared, note="both precisions alternate slate by slate in one process")
    machine["load_avg_1m_before"] = load_before
    result = {"command": "python scripts/train_speed.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": machine, "versions": library_versions(), "wall_s": round(time.perf_counter() - t0, 1),
              "summary": summarize(rec), **rec}
    atomic_write_json(args.out, envelope("train_speed", result))
    for name, s in result["summary"].items():
        print(f"{name}: fp32 {s['fp32_s_per_slate']} s/slate ({s['fp32_slates_per_hour']}/h), "
              f"bf16 {s['bf16_s_per_slate']} s/slate ({s['bf16_slates_per_hour']}/h), ×{s['bf16_speedup']} "
              f"(CPU time ×{s['bf16_speedup_cpu_time']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
