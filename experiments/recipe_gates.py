"""[experiment] last run at commit c0c872e; output: results/calibration/recipe-gates-smollm2-beauty-eval200.json. Kept for provenance, not maintained (experiments/README.md).
Build EVERY recipe of the `--backend auto` table from one standard FP32 export and gate each one on the same
labelled eval slates (the sequential gate, against one cached FP32 reference), so the frontier can show every
recipe with its verdict — `calibrate --backend auto` gates from the fastest down and skips the slower ones.

    python experiments/recipe_gates.py EXPORT_STD WORK_DIR OUT.json --eval EVAL.jsonl.gz --limit 200 \
        --train TRAIN.jsonl.gz [--recipe NAME ...]

Resumable: a recipe already built under WORK_DIR/NAME is reused, a recipe already in OUT.json is not gated again.
Prints the `hllm bench frontier` contender options of what was built (the gate JSON goes to `--gates`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("export", type=Path)
    ap.add_argument("work", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--eval", type=Path, required=True)
    ap.add_argument("--train", type=Path, required=True)
    ap.add_argument("--limit", type=int, default=200)
    ap.add_argument("--validation", type=int, default=24, help="slates after --limit that NNCF's searches validate on")
    ap.add_argument("--recipe", action="append", default=[])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--search-budget", type=float, default=None, help="seconds of the INT8 sensitivity search (default its own)")
    ap.add_argument("--reference", type=Path, default=None, help="FP32 reference cache (.npz; default WORK/reference-evalLIMIT.npz)")
    a = ap.parse_args()

    from hllm.calibration.recipes.recipe import RecipeInputs
    from hllm.calibration.recipes.table import RECIPES
    from hllm.measure import cpu_flags, describe_machine
    from hllm.runtime.artefact import resolve
    from hllm.runtime.slates import read_slates, slate_ids
    from hllm.verify.gate import GateThresholds
    from hllm.verify.reference import cpu_ranker, load_reference, reference_key, reference_scores, save_reference
    from hllm.verify.sequential import run_gate

    art = resolve(a.export)
    slates = read_slates(a.eval, limit=a.limit + a.validation)
    evals, validation = slates[:a.limit], slates[a.limit:]
    th = GateThresholds()
    ref_path = a.reference or a.work / f"reference-eval{a.limit}.npz"
    key = reference_key(art, evals)
    a.work.mkdir(parents=True, exist_ok=True)
    if ref_path.is_file():
        ref = load_reference(ref_path, key)
    else:
        t0 = time.perf_counter()
        ref = reference_scores(cpu_ranker(art.path.parent, a.threads), evals)
        save_reference(ref_path, ref, key)
        print(f"reference on {len(evals)} slates in {time.perf_counter() - t0:.0f} s", flush=True)
    calib = _calibration(art, a.train, slate_ids(evals))
    before = json.loads(a.out.read_text()) if a.out.is_file() else {}
    done = before.get("gates", {})
    flags = cpu_flags()
    report = {"export": str(a.export), "eval_slates": str(a.eval), "limit": a.limit, "thresholds": th.to_dict(),
              "machine": describe_machine(), "gates": done, "built": before.get("built", {}),
              "refused": before.get("refused", {})}
    for r in RECIPES:
        if r.scheme == "export" or (a.recipe and r.name not in a.recipe):
            continue
        why = r.refusal(art.flavour, flags, calib is not None, True)
        if why:
            report["refused"][r.name] = why
            continue
        dst = a.work / r.name
        t0 = time.perf_counter()
        if not (dst / "export.json").is_file():
            try:
                st = {"budget_s": a.search_budget} if a.search_budget and r.scheme == "openvino-int8-sensitivity" else None
                r.build(a.export, dst, RecipeInputs(calib, validation=validation, thresholds=th, ac_settings=st))
            except Exception as e:  # noqa: BLE001 — one recipe's failure is a record
                report["refused"][r.name] = f"build failed: {type(e).__name__}: {e}"
                print(f"{r.name}: build failed: {e}", flush=True)
                continue
        report["built"][r.name] = {"path": str(dst), "engine": r.engine, "precision": str(r.precision),
                                   "inference_precision": r.inference_precision,
                                   "build_s": round(time.perf_counter() - t0, 1)}
        if r.name not in done:
            t0 = time.perf_counter()
            rep = run_gate(ref, dst, evals, th, threads=a.threads, fail_fast=True, chunk=10, sequential=True)
            done[r.name] = {**rep.to_dict(), "gate_s": round(time.perf_counter() - t0, 1)}
            print(f"{r.name}: {'pass' if rep.passed else 'FAIL'} after {len(rep.records)} slates "
                  f"(tau {done[r.name].get('kendall_tau_mean')}) in {done[r.name]['gate_s']} s", flush=True)
        a.out.write_text(json.dumps(report, indent=1, default=str))
    for name, b in report["built"].items():
        hint = f"|{b['inference_precision']}" if b["inference_precision"] else ""
        print(f'-c "{name}|{b["path"]}|{b["engine"]}|{b["precision"]}{hint}"')
    a.out.write_text(json.dumps(report, indent=1, default=str))


def _calibration(art, train: Path, eval_ids):
    """32 calibration slates drawn from the train split (the ort-static / NNCF recipes need them)."""
    from hllm.calibration.selection.pipeline import prepare_calibration
    from hllm.runtime.prompt import PromptBuilder, load_tokenizer

    builder = PromptBuilder(load_tokenizer(art.tokenizer_path), art.prompt, max_items=art.num_positions)
    return prepare_calibration(art, builder, "ort-static", None, train, 32, 0, 1, eval_ids)


if __name__ == "__main__":
    sys.exit(main())
