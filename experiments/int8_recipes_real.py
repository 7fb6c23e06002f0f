"""[experiment] last run at commit 87369a0; output: results/calibration/int8-recipes-tiny.json. Kept for provenance, not maintained (experiments/README.md).
Do the mixed INT8 recipes keep the ranking on a real export: ``openvino-int8-mlp`` (INT8 MLP products with dynamic
activation quantization, fp32 attention and head, bf16 elsewhere) and ``openvino-int8-search`` (the most sensitive
layers' MLPs kept in float by a bounded search on validation slates), each built from a ``standard`` FP32 export,
timed beside it and gated on eval slates by the project's gate, as ``hllm calibrate --backend auto`` does.

Usage: python experiments/int8_recipes_real.py STD_EXPORT OUT_JSON [--slates FILE] [--limit N] [--validation N]
           [--recipes a,b] [--keep PART ...] [--threads T] [--rounds R] [--work DIR]
STD_EXPORT: an FP32 export of flavour ``standard``. The first ``--limit`` slates of ``--slates`` are the gate's,
the next ``--validation`` the search's (never gate slates: ``check_validation``). ``--recipes``: table names
(default: the two recipes, their ``-fp32`` twins on a CPU without AVX512_BF16 / AMX); add e.g.
``openvino-bf16-islands`` to compare. ``--keep``: parts of the MLP recipe kept out of INT8. OUT_JSON is written
after every recipe: per recipe its refusal or build error, the ``quantization`` record (what was quantized, the
effective dynamic-quantization group, the search's order / kept groups / validation figures), build seconds,
the full gate report (``hllm.verify.sequential.run_gate``, default thresholds) and, at the end, the median engine
ms per slate of each beside the FP32 export (``compare_speed``), with the machine description.
Exit 2 on bad input (a part or island that matches nothing, a wrong flavour), as the CLI.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

# The Amazon Beauty eval split (examples/README.md says where it comes from); override with the environment.
EVAL = os.environ.get("HLLM_EVAL_SLATES", "data/amazon-beauty/eval.jsonl.gz")
RECIPES = ("openvino-int8-mlp", "openvino-int8-search")


def _write(path: Path, doc: dict) -> None:
    from hllm.files import atomic_write_json

    atomic_write_json(path, doc)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("export", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--slates", type=Path, default=Path(EVAL))
    ap.add_argument("--limit", type=int, default=200)
    ap.add_argument("--validation", type=int, default=24)
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--keep", nargs="*", default=[])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--work", type=Path, default=None, help="keep the built exports here (default: a temp dir)")
    a = ap.parse_args(argv)

    from hllm.errors import HllmError

    try:
        return run(a)
    except HllmError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def run(a) -> int:
    from hllm.calibration.recipes.recipe import RecipeInputs
    from hllm.calibration.recipes.table import RECIPES as TABLE, check_validation
    from hllm.calibration.selection.pipeline import CalibrateRequest, fp32_reference
    from hllm.calibration.selection.speed import compare_speed
    from hllm.cli.io import load_slates
    from hllm.errors import EngineError
    from hllm.extras import optional
    from hllm.formats.export import read_export
    from hllm.measure import cpu_flags, describe_machine
    from hllm.verify.gate import GateThresholds
    from hllm.verify.sequential import run_gate

    by_name = {r.name: r for r in TABLE}
    meta = read_export(a.export)
    features = cpu_flags()
    names = []
    for n in a.recipes.split(","):
        if n not in by_name:
            raise EngineError(f"unknown recipe {n!r}; one of {sorted(by_name)}")
        twin = f"{n}-fp32"
        use_twin = twin in by_name and by_name[n].refusal(meta.flavour, features, False, True) and \
            by_name[twin].refusal(meta.flavour, features, False, True) is None
        names.append(twin if use_twin else n)
    loaded = load_slates(a.slates, limit=a.limit + a.validation)
    evals, validation = loaded[: a.limit], loaded[a.limit:]
    check_validation(validation, evals)
    thresholds = GateThresholds()
    for n in names:  # a bad --keep is refused before any work
        if a.keep and by_name[n].scheme == "openvino-mixed-int8-mlp":
            from hllm.calibration.recipes.openvino_mixed import int8_matmuls
            from hllm.exporter.onnx_io import load_onnx

            int8_matmuls(load_onnx(meta.onnx_path), keep=a.keep)
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    info: dict = {}
    ref, ref_s = fp32_reference(CalibrateRequest(a.export, a.out, None, thresholds, evals, str(a.slates),
                                                 threads=a.threads), info=info, say=say)
    doc = {"export": str(a.export), "onnx_sha256": meta.raw.get("onnx_sha256"), "slates": str(a.slates),
           "eval_slates": len(evals), "validation_slates": len(validation), "thresholds": thresholds.to_dict(),
           "reference": {**info, "seconds": round(ref_s, 1)}, "keep": a.keep, "recipes": {},
           "machine": describe_machine()}
    work = Path(a.work or tempfile.mkdtemp(prefix="hllm-int8-recipes-"))
    built = {}
    for n in names:
        r, rec = by_name[n], doc["recipes"].setdefault(n, {})
        why = r.refusal(meta.flavour, features, False, optional("openvino") is not None)
        if why or (r.scheme == "openvino-int8-sensitivity" and not validation):
            rec["refused"] = why or "no validation slates (--validation 0)"
            say(f"{n}: refused — {rec['refused']}")
            continue
        t0 = time.perf_counter()
        try:
            m = r.build(a.export, work / n, RecipeInputs(validation=validation, thresholds=thresholds,
                                                         keep_float=tuple(a.keep)))
        except HllmError as e:
            rec["error"] = f"{type(e).__name__}: {e}"
            say(f"{n}: failed — {rec['error']}")
            _write(a.out, doc)
            continue
        rec["build_s"] = round(time.perf_counter() - t0, 1)
        rec["quantization"] = m.raw.get("quantization")
        built[n] = work / n
        rep = run_gate(ref, work / n, evals, thresholds, threads=a.threads)
        rec["gate"], rec["passed"] = rep.to_dict(), bool(rep.passed)
        g = rec["gate"]
        say(f"{n}: built in {rec['build_s']} s; gate {'PASS' if rep.passed else 'FAIL'} "
            f"(tau {g.get('kendall_tau_mean')}, top-1 {g.get('top1_agreement')})")
        _write(a.out, doc)
    if built and a.rounds:
        sp = compare_speed({"fp32": a.export, **built}, evals[: max(1, min(len(evals), a.rounds))], rounds=a.rounds,
                           warmup=1, threads=a.threads, baseline="fp32")
        doc["timing"] = sp
        for n in built:
            doc["recipes"][n]["engine_ms_median"] = round(sp["engine_ms"][n]["median"], 3)
            doc["recipes"][n]["speedup_vs_fp32"] = sp["speedup_vs_fp32"][n]
    _write(a.out, doc)
    say(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
