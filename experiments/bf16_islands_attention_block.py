"""[experiment] last run at commit 447d709; output: results/precision/bf16-islands-fidelity-smollm2-beauty-eval200.json. Kept for provenance, not maintained (experiments/README.md).
A typed bf16-GEMM export with the given fp32 islands (hllm.calibration.precision_search.bf16_islands.build_bf16_export), its
OpenVINO scores on the first N eval slates, and its quality / strict gate reports against the cached fp32
reference, added to the fidelity JSON under ``islands:ISL1+ISL2…`` (per-slate scores cached in WORKDIR).
Usage: python experiments/bf16_islands_attention_block.py STD N REF.npz WORKDIR OUT.json ISL1,ISL2,...
(run with head,attention,q_proj,k_proj,v_proj,o_proj: 1,810 s for 200 slates at load average 7-13 on 2 cores)."""
import json
import os
import sys
import time
from pathlib import Path

import numpy as np


def main(std, n, ref_path, work, out, islands):
    from hllm.calibration.precision_search.bf16_islands import build_bf16_export
    from hllm.measure import describe_machine
    from hllm.runtime.artefact import resolve
    from hllm.runtime.ranker import Ranker
    from hllm.runtime.slates import read_slates
    from hllm.verify.gate import GateThresholds, gate_scores
    from hllm.verify.reference import load_reference, ranker_scores, reference_key

    isl = islands.split(",")
    slates = read_slates(os.environ.get("HLLM_EVAL_SLATES", "data/amazon-beauty/eval.jsonl.gz"))[:n]
    ref = load_reference(ref_path, reference_key(resolve(std), slates))
    work = Path(work)
    dst, raw = work / f"exp-{'-'.join(isl)}", work / f"scores-{'-'.join(isl)}.npz"
    if not (dst / "export.json").exists():
        build_bf16_export(std, dst, isl)
    if raw.exists():
        d = np.load(raw)
        got = [d[f"s{i}"] for i in range(n)]
    else:
        t0 = time.time()
        got = ranker_scores(Ranker.from_path(resolve(dst), threads=2), slates)
        print(f"{n} slates {time.time() - t0:.0f} s", flush=True)
        np.savez(raw, **{f"s{i}": g for i, g in enumerate(got)})
    doc = json.loads(Path(out).read_text()) if Path(out).exists() else {"engines": {}}
    name = "islands:" + "+".join(isl)
    doc["engines"][name] = {m: gate_scores(ref, got, slates, GateThresholds(mode=m), precision="bf16",
                                           backend="openvino").to_dict() for m in ("quality", "strict")}
    doc["engines"][name]["quality"]["mean_abs_dM"] = float(np.mean([np.abs(a - b).mean() for a, b in zip(ref, got)]))
    doc["machine_" + name] = describe_machine(shared=True, note="2 cores shared with other jobs")
    Path(out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6])
