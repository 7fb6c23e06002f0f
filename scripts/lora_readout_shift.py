"""How much a checkpoint's LoRA adapter moves what the head reads, and what switching it off does to
the ranking: the adapter's share of the paper's §5.3 claim ("LoRA is the enabler"), measured.

For each slate of a feature cache (``hllm features --layer c``, c ≤ the lowest adapted layer) the top
layers run twice from the same cached hidden state: with the adapter, and inside peft's
``disable_adapter()`` (the frozen backbone). Per slate it records

* the relative change of the readout rows the head reads (candidate rows + the user-context row),
  ``‖H_lora − H_base‖_F / ‖H_base‖_F``, and the mean cosine between matching rows;
* the head's rankings (LAPJV) on both: Kendall tau, top-1 agreement, and AUC / Recall@10 against the
  slate's labels (the head is the checkpoint's, trained together with the adapter), and the paired
  difference on − off (:func:`hllm.verify.metrics.evaluate` and :func:`~hllm.verify.metrics.paired_difference`).

It also lists, per adapted weight, ``‖scale·B·A‖_F / ‖W‖_F`` (peft LoRA: ``W + scale·B·A``).

usage: python scripts/lora_readout_shift.py CHECKPOINT CACHE SLATES [--limit N] [--threads T] --out OUT.json

Bad input (no adapter, a cache above an adapted layer or of other slates, slates without labels, an
existing or overlapping --out) exits 2 with one line, before anything is written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import numpy as np
import torch

from hllm.errors import CheckpointError, HllmError, OutputError, SlateError
from hllm.files import atomic_write_json, refuse_overlap
from hllm.formats.report import envelope
from hllm.formats.checkpoint import load_manifest
from hllm.measure import describe_machine
from hllm.model.hllm import gather_context, gather_readout, load_model
from hllm.runtime.decode import decode
from hllm.runtime.slates import read_slates
from hllm.training.features import FeatureCache, backbone_hidden_size, check_adapter_above, context_positions
from hllm.verify.metrics import evaluate, paired_difference
from hllm.verify.parity import kendall_tau


def adapter_weight_ratios(backbone) -> dict[str, float]:
    """``‖scale·B·A‖_F / ‖W‖_F`` per LoRA-wrapped linear layer (peft ``LoraLayer``, adapter 'default')."""
    out = {}
    for name, mod in backbone.named_modules():
        if hasattr(mod, "lora_A") and "default" in getattr(mod, "lora_A", {}):
            a = mod.lora_A["default"].weight.detach().double()
            b = mod.lora_B["default"].weight.detach().double()
            delta = mod.scaling["default"] * (b @ a)
            w = mod.get_base_layer().weight.detach().double()
            out[name[name.find("layers."):] if "layers." in name else name] = float(delta.norm() / w.norm())
    return out


def positive_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be ≥ 1, got {v}")
    return v


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("cache")
    ap.add_argument("slates", help="the cached slates with labels (JSONL[.gz])")
    ap.add_argument("--limit", type=positive_int)
    ap.add_argument("--threads", type=positive_int, default=1)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    try:
        run(a)
    except HllmError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def run(a: argparse.Namespace) -> None:
    """The measurement; raises HllmError (exit 2) on bad input, before any output is written."""
    if os.path.lexists(a.out):
        raise OutputError(f"--out {a.out} exists; choose another path (nothing is replaced)")
    refuse_overlap(a.out, [a.checkpoint, a.cache, a.slates])
    torch.set_num_threads(a.threads)
    manifest = load_manifest(a.checkpoint)
    if manifest.adapter_path is None:
        raise CheckpointError(f"{a.checkpoint} has no LoRA adapter: nothing to measure")
    slates = read_slates(a.slates, limit=a.limit)
    if any(s.get("labels") is None for s in slates):
        raise SlateError(f"{a.slates}: every slate needs labels")
    cache = FeatureCache.open(a.cache)
    index = cache.check(manifest.backbone_path, manifest.prompt.to_dict(), [s["slate_id"] for s in slates])
    model = load_model(manifest)
    check_adapter_above(model, cache, a.checkpoint)
    d = backbone_hidden_size(manifest.backbone_path)
    rel, cos, taus, top1 = [], [], [], 0
    orders_on, orders_off = [], []
    for s, i in zip(slates, index):
        c = cache.get(i, d)
        if len(c.readout) != len(s["candidates"]):
            raise SlateError(f"slate {s['slate_id']}: {len(s['candidates'])} candidates, the cache holds "
                             f"{len(c.readout)}; the cache was made from other slates")
        h = torch.from_numpy(c.hidden)[None]
        pos = torch.from_numpy(c.readout)[None]
        mask = torch.ones(1, pos.shape[1], dtype=torch.bool)
        ctx = torch.tensor(context_positions(cache, [c], [s])) if model.reads_context else None
        with torch.inference_mode():
            hl = model.upper(h, cache.layer)
            with model.backbone.disable_adapter():
                hb = model.upper(h, cache.layer)
            rows_l, rows_b = gather_readout(hl, pos)[0], gather_readout(hb, pos)[0]
            if ctx is not None:
                rows_l = torch.cat([rows_l, gather_context(hl, ctx)])
                rows_b = torch.cat([rows_b, gather_context(hb, ctx)])
            rel.append(float((rows_l - rows_b).norm() / rows_b.norm()))
            cos.append(float(torch.nn.functional.cosine_similarity(rows_l, rows_b, dim=-1).mean()))
            n = len(s["candidates"])
            on = decode(model.score_hidden(hl, pos, mask, ctx)[0].numpy(), n)
            off = decode(model.score_hidden(hb, pos, mask, ctx)[0].numpy(), n)
        taus.append(kendall_tau(on, off))
        top1 += int(on[0] == off[0])
        orders_on.append(on.tolist())
        orders_off.append(off.tolist())

    labels = [s["labels"] for s in slates]
    paired = paired_difference(orders_off, orders_on, labels)
    if not paired.slates:
        raise SlateError("no slate has both a positive and a negative label: no AUC to compare")

    ratios = adapter_weight_ratios(model.backbone)
    result = {
        "what": "the adapter's effect: top layers from the same cached state with the adapter and with "
                "peft disable_adapter(); same head",
        "checkpoint": a.checkpoint, "feature_cache": a.cache, "cache_layer": cache.layer,
        "slates_file": a.slates, "slates": len(slates),
        "readout_rel_change": {"mean": float(np.mean(rel)), "median": float(np.median(rel)), "max": float(np.max(rel))},
        "readout_row_cosine_mean": float(np.mean(cos)),
        "ranking_adapter_off_vs_on": {"kendall_tau_mean": float(np.mean(taus)), "top1_agreement": top1 / len(slates)},
        "metrics": {"lora": evaluate(orders_on, labels).to_dict(), "adapter_off": evaluate(orders_off, labels).to_dict()},
        "paired_delta_on_minus_off": paired.to_dict(),
        "adapter_delta_over_weight": {"mean": float(np.mean(list(ratios.values()))),
                                      "max": float(max(ratios.values())), "per_module": ratios},
        "machine": describe_machine(note=f"torch {torch.__version__}, {a.threads} thread(s)"),
    }
    atomic_write_json(a.out, envelope("lora_readout_shift", result))
    print(json.dumps({k: v for k, v in result.items() if k != "adapter_delta_over_weight"}, indent=1))
    print("adapter ‖ΔW‖/‖W‖ mean %.4f max %.4f" % (result["adapter_delta_over_weight"]["mean"],
                                                  result["adapter_delta_over_weight"]["max"]))


if __name__ == "__main__":
    sys.exit(main())
