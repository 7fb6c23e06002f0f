"""[experiment] last run at commit 9c0e620; output: results/precision/bf16-islands-fidelity-smollm2-beauty-eval200.json. Kept for provenance, not maintained (experiments/README.md).
Gate figures (hllm.verify.gate.gate_scores, quality mode, and the strict agreement figures) of bf16 engines
on the first N eval slates against the cached fp32 reference: the typed bf16-GEMM graph on OpenVINO with the
given islands, and OpenVINO's plain bf16 hint. Raw scores are cached per engine (.npz) so a run resumes.
Usage: python experiments/bf16_islands_fidelity.py STD N REF.npz WORKDIR OUT.json ENGINE...
ENGINE: hint (OpenVINO bf16 hint) or islands:ISL1+ISL2 (typed graph; e.g. islands:head+attention)."""
import json
import os
import sys
import time
from pathlib import Path

import numpy as np


def main(std, n, ref_path, work, out, engines):
    from hllm.calibration.precision_search.bf16_islands import Bf16Variants
    from hllm.engines.openvino import OpenVinoEngine
    from hllm.measure import describe_machine
    from hllm.runtime.artefact import resolve
    from hllm.runtime.prompt import PromptBuilder, load_tokenizer
    from hllm.runtime.slates import read_slates
    from hllm.verify.gate import GateThresholds, gate_scores
    from hllm.verify.reference import load_reference, reference_key

    art = resolve(std)
    slates = read_slates(os.environ.get("HLLM_EVAL_SLATES", "data/amazon-beauty/eval.jsonl.gz"))[:n]
    ref = load_reference(ref_path, reference_key(art, slates))
    b = PromptBuilder(load_tokenizer(art.tokenizer_path), art.prompt, max_items=art.num_positions)
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    doc = json.loads(Path(out).read_text()) if Path(out).exists() else {"engines": {}}
    for name in engines:
        raw = work / f"{name.replace(':', '_').replace('+', '-')}.npz"
        have = dict(np.load(raw)) if raw.exists() else {}
        v = Bf16Variants(std, [], "openvino", threads=2)
        if name == "hint":
            eng = OpenVinoEngine(art.path, art.num_positions, threads=2, inference_precision="bf16",
                                 flavour="standard", context=art.context)
        else:
            eng = v.engine(tuple(name.split(":", 1)[1].split("+")))
        t0 = time.time()
        with eng:
            for i, s in enumerate(slates):
                if f"s{i}" in have:
                    continue
                bt = b.encode([s])
                have[f"s{i}"] = eng.run(bt.input_ids, bt.readout_positions, bt.item_mask, bt.context_positions)[0, : int(bt.n_items[0])]
                if i % 10 == 9:
                    np.savez(raw, **have)
                    print(name, i + 1, round(time.time() - t0), flush=True)
        np.savez(raw, **have)
        v.close()
        got = [have[f"s{i}"] for i in range(n)]
        rep = {m: gate_scores(ref, got, slates, GateThresholds(mode=m), precision="bf16", backend="openvino").to_dict()
               for m in ("quality", "strict")}
        doc["engines"][name] = rep
        doc.update(slates=n, export="SmolLM2-135M + LoRA merged, flavour standard",
                   reference="OpenVINO f32 scores (hllm.verify.reference.save_reference)",
                   machine=describe_machine(shared=True, note="2 cores shared with other jobs"))
        Path(out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:])
