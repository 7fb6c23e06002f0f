"""Every engine × precision side by side in ONE interleaved run (``hllm bench frontier``).

For each contender (PyTorch fp32 eager on the checkpoint = the reference, ONNX Runtime on the fused and
the standard export, OpenVINO fp32 / bf16 / INT8 …) the engine call on the same encoded slates (batch 1)
is timed interleaved (:func:`hllm.measure.time_interleaved`: round r runs every engine once, order
rotated), warm-up rounds discarded; the table reports the median seconds per slate, the ratio to PyTorch
fp32 eager and to the ONNX Runtime fp32 contender (the fused graph: the fastest fp32 engine; higher = faster),
and the fraction of the GEMM peak *of its dtype* measured in the same run
(prefill FLOPs of :func:`hllm.measure.prefill_flops` / median time / peak). Contenders this CPU
cannot run (bf16 without AVX512_BF16 / AMX) are listed with the reason instead of a time. Gate figures
(top-1, tau, ΔRecall@10 … on labelled eval slates) are attached from the JSON files that measured them.

Peaks: fp32 ``torch.mm`` / numpy (:func:`hllm.bench.peak.matmul_peak`); int8 ``torch._int_mm``
(int8 × int8 → int32); bf16 ``torch.mm`` in bfloat16, only where the CPU has bf16 instructions.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from hllm.calibration.recipes.recipe import Recipe
from hllm.errors import EngineError, HllmError
from hllm.formats.checkpoint import load_manifest
from hllm.measure import bf16_support
from hllm.runtime.artefact import open_engine, resolve
from hllm.runtime.prompt import PromptBuilder, load_tokenizer
from hllm.runtime.slates import loads_json


#: Gate figures a ``--gates`` entry may hold that the table prints (each a number in [-1, 1] when present).
GATE_FIGURES = ("top1_agreement", "kendall_tau_mean")


def read_gates(path) -> dict[str, dict]:
    """The ``--gates`` file of ``hllm bench frontier``: a JSON object ``{contender name: {figure: value}}``
    (e.g. the ``gate`` record of ``hllm calibrate``: ``top1_agreement``, ``kendall_tau_mean``,
    ``recall@10_delta`` …), read strictly (:func:`hllm.runtime.slates.loads_json`: duplicate keys and
    NaN / Infinity refused).

    Returns: ``{name: figures}``; a null entry is ``{}``.
    Raises: HllmError naming the file and the entry: unreadable, not JSON, not an object of objects, a
        figure of :data:`GATE_FIGURES` that is not a number in [-1, 1].
    """
    try:
        text = open(path, "rb").read()
    except OSError as e:
        raise HllmError(f"--gates: cannot read {path}: {e.strerror or e}") from None
    try:
        doc = loads_json(text, f"--gates {path}")
    except HllmError as e:
        raise HllmError(str(e)) from None
    if not isinstance(doc, dict):
        raise HllmError(f"--gates {path}: expected a JSON object {{contender name: gate figures}}, got "
                        f"{type(doc).__name__ if doc is not None else 'null'}")
    out = {}
    for name, g in doc.items():
        if g is None:
            g = {}
        if not isinstance(g, dict):
            raise HllmError(f"--gates {path}: entry {name!r} must be an object of gate figures, got {type(g).__name__}")
        for k in GATE_FIGURES:
            v = g.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not -1.0 <= v <= 1.0):
                raise HllmError(f"--gates {path}: {name}.{k} must be a number in [-1, 1], got {v!r}")
        out[name] = g
    return out


def gemm_peaks(n: int = 2048, runs: int = 3) -> dict:
    """GEMM peaks of this CPU in G(FL)OP/s per dtype, measured now: ``{fp32, int8, bf16 (None without bf16
    instructions), n}``."""
    import torch

    from hllm.bench.peak import best_gflops, matmul_peak

    def best(fn) -> float:
        return best_gflops(fn, 2.0 * n**3, runs)

    out = {"n": n, "fp32": matmul_peak(n, runs)["peak_gflops"]}
    a8 = torch.randint(-128, 127, (n, n), dtype=torch.int8)
    try:
        out["int8"] = best(lambda: torch._int_mm(a8, a8))
    except RuntimeError:
        out["int8"] = None
    ok, _ = bf16_support()
    ab = torch.randn(n, n, dtype=torch.bfloat16)
    out["bf16"] = best(lambda: torch.mm(ab, ab)) if ok else None
    return out


def _open(c: Recipe, threads: int):
    opts = {"threads": threads}
    if c.engine not in ("auto", "torch"):
        opts["engine"] = c.engine
    if c.inference_precision:
        opts["inference_precision"] = c.inference_precision
    return open_engine(resolve(c.path), **opts)


def frontier(checkpoint: str, contenders: Sequence[Recipe], slates: Sequence[dict], rounds: int = 5,
             warmup: int = 1, threads: int = 2, peak_n: int = 2048, ort_fp32: str | None = None) -> dict:
    """Time ``contenders`` and PyTorch fp32 eager on ``checkpoint`` interleaved (module doc); ``peak_n``: size
    of the square GEMMs that measure the peaks; ``ort_fp32``: the contender every row is also compared with
    (``vs_ort_fp32``; None = the first ONNX Runtime fp32 contender, e.g. the fused graph).

    Returns: ``{rows: [{name, engine, dtype, s_per_slate, vs_torch_fp32, vs_ort_fp32, gemm_peak_fraction, gate,
        refused}], ort_fp32, peaks, flops_per_slate, rounds, warmup, slates, threads, seq_lens, items}``.
    Raises: EngineError / CheckpointError for an artefact that cannot be opened; HllmError for an ``ort_fp32``
        that names no contender.
    """
    from hllm.measure import prefill_flops, summarize, time_interleaved

    art = resolve(checkpoint)
    builder = PromptBuilder(load_tokenizer(art.tokenizer_path), art.prompt, max_items=art.num_positions)
    batches = [builder.encode([s]) for s in slates]
    dims = load_manifest(checkpoint).dims
    flops = float(np.mean([prefill_flops(dims, int(b.lengths[0])) for b in batches]))
    ref = Recipe("PyTorch fp32 eager", "torch", "fp32", path=checkpoint)
    if ort_fp32 is not None and ort_fp32 not in {c.name for c in contenders}:
        raise HllmError(f"--ort-fp32 {ort_fp32!r} names no contender ({', '.join(c.name for c in contenders)})")
    ort_fp32 = ort_fp32 or next((c.name for c in contenders if c.engine == "onnxruntime"
                                 and str(c.precision) == "fp32"), None)
    engines, refused = {}, {}
    for c in [ref, *contenders]:
        try:
            engines[c.name] = _open(c, threads).activate()
        except EngineError as e:
            refused[c.name] = str(e)
    calls = {k: (lambda i, e=e: e.run(*_feeds(batches[i % len(batches)], e))) for k, e in engines.items()}
    try:
        samples = time_interleaved(calls, rounds=rounds, warmup=warmup, unit=1.0)
    finally:
        for e in engines.values():
            e.deactivate()
    peaks = gemm_peaks(peak_n)
    base = summarize(samples[ref.name])["median"]
    second = summarize(samples[ort_fp32])["median"] if ort_fp32 in samples else None
    rows = []
    for c in [ref, *contenders]:
        row = {"name": c.name, "path": c.path, "engine": c.engine, "dtype": str(c.precision), "gate": c.gate or None}
        if c.name in refused:
            rows.append({**row, "refused": refused[c.name]})
            continue
        med = summarize(samples[c.name])["median"]
        peak = peaks.get(str(c.precision))
        rows.append({**row, "s_per_slate": round(med, 3), "samples_s": [round(x, 3) for x in samples[c.name]],
                     "vs_torch_fp32": round(base / med, 3), "engine_name": engines[c.name].name,
                     "vs_ort_fp32": round(second / med, 3) if second else None,
                     "gemm_peak_fraction": round(flops / med / 1e9 / peak, 3) if peak else None})
    return {"rows": rows, "ort_fp32": ort_fp32 if second else None, "peaks_gflops": peaks, "flops_per_slate": flops, "rounds": rounds, "warmup": warmup,
            "slates": len(slates), "threads": threads, "seq_lens": [int(b.lengths[0]) for b in batches],
            "items": [int(b.n_items[0]) for b in batches]}


def _feeds(b, engine) -> tuple:
    return b.input_ids, b.readout_positions, b.item_mask, (b.context_positions if engine.context else None)


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def gate_summary(g: dict | None) -> dict:
    """The figures of a contender's gate record that the frontier table prints, from a
    :meth:`hllm.verify.gate.GateReport.to_dict` or a ``calibrate --backend auto`` recipe's ``gate``:
    ``{gate (mode), passed, strict_passed, top1_agreement, kendall_tau_mean, regret_p95, auc_lb, ndcg10_lb,
    recall10_lb (one-sided lower bounds of the quality differences), max_abs_dM}``; a figure that is
    absent or not a number is None."""
    g = g or {}
    q = g.get("quality") if isinstance(g.get("quality"), dict) else {}
    fid = g.get("fidelity") if isinstance(g.get("fidelity"), dict) else {}
    lb = lambda m: _num((q.get(m) or {}).get("lower_bound")) if isinstance(q.get(m), dict) else None  # noqa: E731
    flag = lambda k: g[k] if isinstance(g.get(k), bool) else None  # noqa: E731
    return {"gate": g.get("gate") if isinstance(g.get("gate"), str) else None, "passed": flag("passed"),
            "strict_passed": flag("strict_passed"), "top1_agreement": _num(g.get("top1_agreement")),
            "kendall_tau_mean": _num(g.get("kendall_tau_mean")),
            "regret_p95": _num(fid.get("regret_p95", g.get("regret_p95"))), "auc_lb": lb("auc"),
            "ndcg10_lb": lb("ndcg@10"), "recall10_lb": lb("recall@10"),
            "max_abs_dM": _num(g.get("max_abs_dM", g.get("max_abs_diff")))}


def markdown_table(doc: dict) -> str:
    """The frontier JSON (:func:`frontier` + machine) as a Markdown table for docs/benchmarks.md: speed, and
    the gate figures (:func:`gate_summary`): the verdict of its mode, the one-sided lower bounds of ΔAUC and
    ΔNDCG@10, mean Kendall tau, p95 assignment regret, and the strict agreement figures (top-1)."""
    lines = ["| engine × precision | s / slate | × PyTorch fp32 eager | × ORT fp32 | GEMM peak of its dtype | gate | "
             "ΔAUC lb | ΔNDCG@10 lb | Kendall tau | regret p95 | top-1 (strict) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    f = lambda v, fmt: "—" if v is None else fmt.format(v)  # noqa: E731
    for r in doc["rows"]:
        g = gate_summary(r.get("gate"))
        verdict = "—" if g["passed"] is None else f"{g['gate'] or ''} {'pass' if g['passed'] else 'FAIL'}".strip()
        strict = "" if g["strict_passed"] is None else (" ✓" if g["strict_passed"] else " ✗")
        gate_cols = (f"{verdict} | {f(g['auc_lb'], '{:+.4f}')} | {f(g['ndcg10_lb'], '{:+.4f}')} | "
                     f"{f(g['kendall_tau_mean'], '{:.3f}')} | {f(g['regret_p95'], '{:.2g}')} | "
                     f"{f(g['top1_agreement'], '{:.2f}')}{strict} |")
        if "refused" in r:
            lines.append(f"| {r['name']} | refused: {r['refused'].split(';')[0]} | | | | {gate_cols}")
            continue
        peak = f"{r['gemm_peak_fraction']:.0%} ({r['dtype']})" if r.get("gemm_peak_fraction") else "—"
        lines.append(f"| {r['name']} | {r['s_per_slate']:.2f} | {r['vs_torch_fp32']:.2f} | "
                     f"{f(r.get('vs_ort_fp32'), '{:.2f}')} | {peak} | {gate_cols}")
    return "\n".join(lines)
