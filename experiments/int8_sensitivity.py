"""[experiment] last run at commit dc247ae; output: results/calibration/smollm2-int8-sensitivity.json. Kept for provenance, not maintained (experiments/README.md).
How much INT8 rounding moves an hLLM checkpoint's score matrix, part by part (CPU, PyTorch).

Emulates the two ONNX Runtime CPU schemes with fake quantization of the backbone's ``nn.Linear``
layers (the scoring head stays float, as in ``hllm calibrate -x head``):

* ``dynamic`` — ``quantize_dynamic``: activations uint8 asymmetric, one scale per tensor per call;
  weights int8 symmetric per output channel, 7-bit range (``reduce_range``).
* ``weight-only`` — ``MatMulNBits`` bits=8: weights int8 symmetric, one scale per 32 weights along
  the reduction axis; activations float.

For each variant (every projection type across all blocks, every block alone, everything) it reports
top-1 agreement, mean Kendall tau and max/mean |ΔM| against the unquantized model on held-out slates
(``hllm.verify.parity.compare_slate``), plus the spread of the reference scores across items (the top-1 margins of
the gate slates: scripts/score_margins.py). Figures of docs/calibration.md come from its JSON.

usage: python experiments/int8_sensitivity.py CHECKPOINT SLATES --skip 34 --count 2 --out results/calibration/x.json
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import time

import numpy as np
import torch

from hllm.files import atomic_write_json
from hllm.formats.report import envelope
from hllm.verify.parity import compare_slate
from hllm.runtime.ranker import Ranker
from hllm.runtime.slates import read_slates

PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def fake_dynamic_act(_mod, args):
    """Forward pre-hook: the Linear's input ``[..., in]`` float32 quantized to uint8 with one
    asymmetric scale for the whole tensor (this call's min/max, 0 kept exact) and dequantized."""
    x = args[0]
    lo, hi = torch.clamp(x.min(), max=0), torch.clamp(x.max(), min=0)
    s = (hi - lo) / 255
    zp = torch.round(-lo / s)
    return ((torch.clamp(torch.round(x / s) + zp, 0, 255) - zp) * s,)


def quant_weight(w: torch.Tensor, scheme: str) -> torch.Tensor:
    """``w`` ``[out, in]`` float32 rounded as ``scheme`` stores it, returned dequantized (same shape):
    ``weight-only``: int8 symmetric, one scale per 32 inputs (``in`` divisible by 32); ``dynamic``:
    7-bit symmetric ([-64, 63]), one scale per output row."""
    if scheme == "weight-only":
        o, k = w.shape
        wb = w.reshape(o, k // 32, 32)
        s = wb.abs().amax(-1, keepdim=True) / 127
        return (torch.round(wb / s).clamp(-128, 127) * s).reshape(o, k)
    s = w.abs().amax(1, keepdim=True) / 63
    return torch.round(w / s).clamp(-64, 63) * s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("slates")
    ap.add_argument("--skip", type=int, default=34, help="skip the first SKIP slates (the gate's)")
    ap.add_argument("--count", type=int, default=2)
    ap.add_argument("--schemes", default="dynamic,weight-only", help="schemes: every one gets the 'all' row")
    ap.add_argument("--proj-schemes", default="dynamic,weight-only", help="schemes that get one row per projection type")
    ap.add_argument("--block-schemes", default="dynamic,weight-only", help="schemes that get one row per decoder block")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    slates = read_slates(a.slates)[a.skip: a.skip + a.count]
    r = Ranker.from_path(a.checkpoint, threads=1)
    r.engine.activate()  # keep one model object: the hooks below must stay on it
    lin = {n: m for n, m in r.engine.model.named_modules()
           if isinstance(m, torch.nn.Linear) and not n.startswith("head")}
    block = {n: int(re.search(r"layers\.(\d+)\.", n).group(1)) for n in lin}
    orig = {n: m.weight.data.clone() for n, m in lin.items()}
    hooks: dict = {}

    def scores():
        out = []
        with torch.no_grad():
            for s in slates:
                b = r.builder.encode([s])
                out.append(r.scores(b)[0, : int(b.n_items[0])].copy())
        return out

    ref = scores()

    def run(names, scheme):
        for n, m in lin.items():
            m.weight.data = quant_weight(orig[n], scheme) if n in names else orig[n]
            want = n in names and scheme == "dynamic"
            if want and n not in hooks:
                hooks[n] = m.register_forward_pre_hook(fake_dynamic_act)
            elif not want and n in hooks:
                hooks.pop(n).remove()
        recs = [compare_slate(x, y) for x, y in zip(ref, scores())]
        return {"top1_agreement": float(np.mean([q["top1_match"] for q in recs])),
                "kendall_tau_mean": float(np.mean([q["kendall_tau"] for q in recs])),
                "max_abs_diff": max(q["max_abs_diff"] for q in recs),
                "mean_abs_diff": float(np.mean([q["mean_abs_diff"] for q in recs]))}

    t0 = time.time()
    res: dict = {}
    for scheme in a.schemes.split(","):
        rows = {"all": run(set(lin), scheme)}
        for p in PROJ if scheme in a.proj_schemes.split(",") else ():
            rows[f"proj:{p}"] = run({n for n in lin if n.endswith(p)}, scheme)
        for b in sorted(set(block.values())) if scheme in a.block_schemes.split(",") else ():
            rows[f"block:{b}"] = run({n for n in lin if block[n] == b}, scheme)
        res[scheme] = rows
        print(scheme, json.dumps(rows["all"]), flush=True)
    out = {
        "what": "INT8 fake-quantization sensitivity of the backbone (head float), PyTorch emulation of ORT dynamic INT8 and MatMulNBits 8-bit weight-only",
        "checkpoint": a.checkpoint, "slates": a.slates, "slate_range": [a.skip, a.skip + len(slates)],
        "reference_score_spread": {
            "std_all": float(np.mean([m.std() for m in ref])),
            "std_of_item_means": float(np.mean([m.mean(1).std() for m in ref])),
        },
        "schemes": res,
        "seconds": round(time.time() - t0, 1),
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": 1},
    }
    atomic_write_json(a.out, envelope("int8_sensitivity", out))
    print("→", a.out)


if __name__ == "__main__":
    main()
