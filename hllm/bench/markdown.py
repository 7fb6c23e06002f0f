"""Markdown tables of the benchmark JSON (what docs/benchmarks.md and the README show), torch-free.

Rendering the tables from the committed JSON keeps every figure in the docs traceable to its source.
"""

from __future__ import annotations


def _ms(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}" if v >= 1 else f"{v:.3f}"


def stages_table(doc: dict) -> str:
    """Per-stage medians per backend / N / batch from a ``stages`` document."""
    peak = (doc.get("matmul_peak") or {}).get("peak_gflops")
    lines = [
        "| backend | N | batch | runs | prompt + tokenize ms | engine ms | LAPJV µs/slate | decode + output ms | total ms | non-model overhead | prompt tokens | tokens/s | GFLOP/s (of peak) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["records"]:
        s = r["stage_ms"]
        gf = "–" if r.get("gflops") is None else f"{r['gflops']:.0f}" + (f" ({r['peak_fraction']:.0%})" if r.get("peak_fraction") else "")
        lines.append(
            f"| {r['backend']} | {r['n_items']} | {r['batch_size']} | {r['runs']} | {s['prompt']:.2f} | {_ms(s['engine'])} | "
            f"{r['lapjv_us']['median']:.0f} | {s['decode_output']:.2f} | {_ms(s['total'])} | {r['overhead_fraction']:.2%} | "
            f"{r['prompt_tokens_mean']:.0f} | {r['tokens_per_s']:.0f} | {gf} |"
        )
    if peak:
        lines.append(f"\nfp32 GEMM peak measured in the same run: {peak} GFLOP/s "
                     f"({doc['matmul_peak']['n']}³, best of {doc['matmul_peak']['runs']}).")
    return "\n".join(lines)


def _contender(r: dict) -> str:
    if r["backend"] == "torch":
        return "PyTorch eager (reference)"
    return f"{r['backend']} {r.get('flavour') or ''} {r.get('precision') or ''}".replace("  ", " ").strip()


def scaling_table(doc: dict) -> str:
    """Engine time against prompt length from a ``scaling`` document: one row per contender, one column
    per S with the median ms and the speed ratio to the reference (> 1 = faster), then GFLOP/s at the
    longest S (fraction of the fp32 GEMM peak measured in the same run)."""
    recs = doc["records"]
    seqs = sorted({r["seq_len"] for r in recs})
    order = list(dict.fromkeys(r["model"] for r in recs))
    by = {(r["model"], r["seq_len"]): r for r in recs}
    head = "| contender | " + " | ".join(f"S={s}: ms (× ref)" for s in seqs) + f" | GFLOP/s at S={seqs[-1]} (of peak) |"
    lines = [head, "|---|" + "---|" * (len(seqs) + 1)]
    for m in order:
        first = next(by[(m, s)] for s in seqs if (m, s) in by)
        cells = []
        for s in seqs:
            r = by.get((m, s))
            cells.append("–" if r is None else f"{_ms(r['engine_ms']['median'])} ({r['ratio_to_reference']:.2f}×)")
        last = by.get((m, seqs[-1])) or {}
        gf = "–" if last.get("gflops") is None else f"{last['gflops']:.0f}" + (
            f" ({last['peak_fraction']:.0%})" if last.get("peak_fraction") else "")
        lines.append(f"| {_contender(first)} | " + " | ".join(cells) + f" | {gf} |")
    peak = doc.get("matmul_peak") or {}
    if peak.get("peak_gflops"):
        lines.append(f"\nfp32 GEMM peak measured in the same run: {peak['peak_gflops']} GFLOP/s "
                     f"({peak['n']}³, best of {peak['runs']}).")
    return "\n".join(lines)


def versus_table(doc: dict) -> str:
    """hLLM vs autoregressive per N from a ``versus_ar`` document."""
    lines = [
        "| N | slates | hLLM ms (1 pass) | AR constrained ms | AR decode passes | speed-up | AR unconstrained ms | unconstrained passes | unconstrained invalid | prompt tokens hLLM / AR |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["records"]:
        lines.append(
            f"| {r['n_items']} | {r['slates']} | {_ms(r['hllm_ms'])} | {_ms(r['ar_ms'])} | {r['ar_decode_passes']:.0f} | "
            f"**{r['speedup']:.1f}×** | {_ms(r.get('ar_unconstrained_ms', float('nan')))} | "
            f"{r.get('ar_unconstrained_decode_passes', float('nan')):.0f} | {r.get('ar_unconstrained_invalid_rate', float('nan')):.0%} | "
            f"{r['hllm_prompt_tokens']:.0f} / {r['ar_prefill_tokens']:.0f} |"
        )
    return "\n".join(lines)


def lapjv_table(doc: dict) -> str:
    """Median µs per solve per solver (float64 | float32 costs) and the runtime path, from a ``lapjv`` document."""
    solvers = doc.get("solvers") or []
    head = "| N | family | " + " | ".join(f"{s} f64 / f32" for s in solvers)
    head += " | runtime `decode()` | batch of 8: `decode_batch` / `decode` loop / bare `lap.lapjv` loop | same optimum |"
    lines = [head, "|" + "---|" * (len(solvers) + 5)]
    for r in doc["records"]:
        cells = [f"{r['n_items']}", f"{r['family']}"]
        for s in solvers:
            a, b = r["solvers_us"][f"{s}/float64"]["median"], r["solvers_us"][f"{s}/float32"]["median"]
            cells.append(f"{a:.1f} / {b:.1f}")
        bu = r["batch_us_per_slate"]
        cells.append(f"{r['runtime_decode_us']['median']:.1f}")
        cells.append(f"{bu['decode_batch()']['median']:.1f} / {bu['decode() loop']['median']:.1f} / {bu['lap.lapjv loop']['median']:.1f}")
        cells.append("yes" if r["correct"] else "**no**")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
