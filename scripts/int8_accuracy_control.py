"""INT8 of a ``standard`` export through NNCF's accuracy control, judged by rankings.

Build (``--build``): :func:`hllm.calibration.recipes.accuracy_control.quantize_with_accuracy_control` with the ranking
validation function (per-slate regret / tau / AUC / NDCG@10), calibration from train slates, NNCF's
validation on eval slates kept apart from the judged ones; writes the INT8 export (f32 hint) and its
mixed INT8 + bf16 twin (the same IR, bf16 hint: the ops left in float run in bf16).

Judge: the gate (:func:`hllm.verify.sequential.run_gate`, stopping a variant once it can no longer pass unless
``--no-fail-fast``) of each variant against the FP32 reference scores of the judged eval slates (a
reference-score cache, :func:`hllm.verify.reference.load_reference`, or computed here with OpenVINO fp32), and engine time per slate as the median of interleaved rounds
(:func:`hllm.measure.time_interleaved`) against OpenVINO fp32 and, with ``--torch CKPT``, PyTorch fp32 eager.

Usage:
    python scripts/int8_accuracy_control.py STD_EXPORT WORK_DIR OUT_JSON --eval EVAL --train TRAIN
        [--build] [--judge 200] [--validation 50] [--validation-offset 200] [--max-candidates N] [--calib 32]
        [--metric regret] [--max-drop X] [--ranking-subset 5] [--max-reverted 15] [--budget S]
        [--reference-scores REF.npz] [--torch CKPT] [--rounds 5] [--no-fail-fast]
Writes OUT_JSON (refuses an existing one): the quantization records, the gate figures, the speed, the CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def build(a, work: Path) -> dict:
    from hllm.calibration.recipes.accuracy_control import cut_slate, quantize_with_accuracy_control
    from hllm.calibration.recipes.openvino_int8 import calibration_feeds
    from hllm.files import copy_files
    from hllm.formats.export import read_export, write_export
    from hllm.formats.graph import sidecar_reads_context
    from hllm.runtime.prompt import PromptBuilder, load_tokenizer
    from hllm.runtime.slates import read_slates

    meta = read_export(a.export)
    builder = PromptBuilder(load_tokenizer(meta.tokenizer_path), meta.prompt, max_items=meta.num_positions)
    evals = read_slates(a.eval)
    val = [cut_slate(s, a.max_candidates) for s in evals[a.validation_offset: a.validation_offset + a.validation]]
    calib = calibration_feeds(read_slates(a.train), builder, a.calib, 0, sidecar_reads_context(meta.raw))
    rec = quantize_with_accuracy_control(a.export, work / "int8", calib, val, metric=a.metric, max_drop=a.max_drop,
                                         ranking_subset=a.ranking_subset, max_reverted=a.max_reverted,
                                         budget_s=a.budget, say=log)
    # the mixed twin: the same IR, the ops NNCF left in float run in bf16
    (work / "int8-bf16").mkdir()
    copy_files(work / "int8", work / "int8-bf16", skip=("export.json",))
    raw = read_export(work / "int8").raw
    write_export(work / "int8-bf16", {**raw, "openvino": {**raw["openvino"], "inference_precision": "bf16"},
                                      "quantization": {**raw["quantization"], "inference_precision": "bf16"}})
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export", type=Path)
    ap.add_argument("work", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--eval", type=Path, required=True)
    ap.add_argument("--train", type=Path, required=True)
    ap.add_argument("--build", action="store_true")
    ap.add_argument("--judge", type=int, default=200)
    ap.add_argument("--validation", type=int, default=50)
    ap.add_argument("--validation-offset", type=int, default=200)
    ap.add_argument("--calib", type=int, default=32)
    ap.add_argument("--max-candidates", type=int, default=None, help="NNCF's validation slates cut to N candidates")
    ap.add_argument("--metric", default="regret")
    ap.add_argument("--max-drop", type=float, default=None)
    ap.add_argument("--ranking-subset", type=int, default=5)
    ap.add_argument("--max-reverted", type=int, default=15)
    ap.add_argument("--budget", type=float, default=None, help="seconds NNCF's search may take (None = no limit)")
    ap.add_argument("--reference-scores", type=Path, default=None)
    ap.add_argument("--torch", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-fail-fast", dest="fail_fast", action="store_false",
                    help="gate all judged slates even once a variant can no longer pass")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    if a.out.exists():
        print(f"{a.out} exists; choose a new file", file=sys.stderr)
        return 2
    if a.validation_offset < a.judge:
        print("--validation-offset must be ≥ --judge: NNCF's validation slates are kept apart from the judged ones",
              file=sys.stderr)
        return 2
    a.work.mkdir(parents=True, exist_ok=True)
    doc: dict = {"export": str(a.export), "eval": str(a.eval), "train": str(a.train),
                 "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()}}
    if a.build:
        t0 = time.perf_counter()
        doc["build"] = build(a, a.work)
        doc["build_wall_s"] = round(time.perf_counter() - t0, 1)
        (a.work / "build.json").write_text(json.dumps(doc["build"], indent=1))
    else:
        doc["build"] = json.loads((a.work / "build.json").read_text())
    if a.judge:
        doc.update(judge(a))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    from hllm.formats.report import envelope

    a.out.write_text(json.dumps(envelope("int8_accuracy_control", doc), indent=1) + "\n")
    log(f"wrote {a.out}")
    return 0


def judge(a) -> dict:
    from hllm.measure import describe_machine
    from hllm.runtime.artefact import open_engine, resolve
    from hllm.runtime.prompt import PromptBuilder, load_tokenizer
    from hllm.runtime.ranker import slate_scores
    from hllm.runtime.slates import read_slates
    from hllm.measure import time_interleaved
    from hllm.verify.gate import GateThresholds
    from hllm.verify.sequential import run_gate

    slates = read_slates(a.eval, limit=a.judge)
    art = resolve(a.export)
    builder = PromptBuilder(load_tokenizer(art.tokenizer_path), art.prompt, max_items=art.num_positions)
    batches = [builder.encode([s]) for s in slates]
    engines = {"openvino-int8": open_engine(resolve(a.work / "int8"), threads=a.threads),
               "openvino-int8-bf16": open_engine(resolve(a.work / "int8-bf16"), threads=a.threads),
               "openvino-fp32": open_engine(art, engine="openvino", threads=a.threads)}
    ref = None
    if a.reference_scores is not None:
        from hllm.verify.reference import load_reference, reference_key

        ref = load_reference(a.reference_scores, reference_key(art, slates))
        log(f"reference: {a.reference_scores}")
    out: dict = {"judged_slates": len(slates), "reference": "OpenVINO fp32 of the export (cached)"
                 if ref is not None else "OpenVINO fp32 of the export"}
    if ref is None:
        with engines["openvino-fp32"] as eng:
            ref = [m for b in batches for m in slate_scores(eng, b)]
    th = GateThresholds()
    out["thresholds"] = th.to_dict() if hasattr(th, "to_dict") else vars(th)
    out["gate"] = {}
    for name in ("openvino-int8", "openvino-int8-bf16"):
        t0 = time.perf_counter()
        rep = run_gate(ref, a.work / name.replace("openvino-", ""), slates, th, threads=a.threads,
                       fail_fast=a.fail_fast, chunk=10,
                       on_progress=lambda n, name=name: log(f"{name}: +{n} slates"))
        d = rep.to_dict()
        out["gate"][name] = {k: v for k, v in d.items() if k != "per_slate"}
        out["gate"][name]["gate_s"] = round(time.perf_counter() - t0, 1)
        log(f"{name}: {len(rep.records)} slates, passed {d.get('passed')}, failures {d.get('failures')}")
    # speed: engine time per slate, interleaved rounds over the first slates
    calls = {}
    for name, eng in engines.items():
        eng.activate()
        calls[name] = (lambda e: lambda r: e.run(batches[r % len(batches)].input_ids,
                                                  batches[r % len(batches)].readout_positions,
                                                  batches[r % len(batches)].item_mask,
                                                  batches[r % len(batches)].context_positions))(eng)
    if a.torch is not None:
        import torch

        from hllm.model.hllm import load_model

        torch.set_num_threads(a.threads)
        model = load_model(a.torch).eval()

        def eager(r):
            b = batches[r % len(batches)]
            with torch.inference_mode():
                model(*(torch.from_numpy(x) for x in b.inputs(art.graph_inputs).values()))
        calls["pytorch-fp32-eager"] = eager
    ms = time_interleaved(calls, a.rounds, warmup=1)
    med = {k: statistics.median(v) for k, v in ms.items()}
    out["speed"] = {"engine_ms_median": {k: round(v, 1) for k, v in med.items()}, "rounds": a.rounds,
                    "samples_ms": {k: [round(x, 1) for x in v] for k, v in ms.items()},
                    "speedup_vs_openvino_fp32": {k: round(med["openvino-fp32"] / v, 3) for k, v in med.items()},
                    "threads": a.threads, "batch": 1, "interleaved": True}
    if "pytorch-fp32-eager" in med:
        out["speed"]["speedup_vs_pytorch_fp32_eager"] = {k: round(med["pytorch-fp32-eager"] / v, 3) for k, v in med.items()}
    for eng in engines.values():
        eng.deactivate()
    m = describe_machine()
    out["machine"] = {**m, "shared": True, "note": "2 cores shared with other engineers' jobs; timings interleaved"}
    return out


if __name__ == "__main__":
    sys.exit(main())
