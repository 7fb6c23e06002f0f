"""``hllm bench frontier``: every engine × precision side by side in one interleaved run (:mod:`hllm.bench.frontier`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from hllm.cli.app import out, quiet_libraries
from hllm.cli.io import check_output_file, data_to_stdout, finish_report, load_slates
from hllm.cli.options import json_opt, limit_opt, slates_opt, threads_opt
from hllm.cli.bench_cmds import NOTE_OPT, SHARED_OPT, print_table, bench_app


def parse_contender(text: str):
    """``NAME|PATH|ENGINE|DTYPE[|INFERENCE_PRECISION]`` → the :class:`hllm.calibration.recipes.recipe.Recipe` of an
    artefact built before (no scheme: ``bench frontier`` times it, never builds it).

    Raises: HllmError naming the malformed value (engine one of auto/onnxruntime/openvino, dtype fp32/int8/bf16)."""
    from hllm.calibration.recipes.recipe import Recipe
    from hllm.errors import HllmError
    from hllm.formats.vocabulary import ARTEFACT_ENGINES, RECIPE_PRECISIONS

    parts = text.split("|")
    if len(parts) not in (4, 5) or not all(parts[:4]):
        raise HllmError(f"--contender must be NAME|PATH|ENGINE|DTYPE[|INFERENCE_PRECISION], got {text!r}")
    engines, dtypes = ARTEFACT_ENGINES, [p.value for p in RECIPE_PRECISIONS]
    if parts[2] not in engines or parts[3] not in dtypes:
        raise HllmError(f"--contender {text!r}: engine {'/'.join(engines)}, dtype {'/'.join(dtypes)}")
    return Recipe(parts[0], parts[2], parts[3], path=parts[1],
                  inference_precision=parts[4] if len(parts) == 5 else None)


@bench_app.command("frontier")
def frontier_cmd(
    checkpoint: Path = typer.Argument(..., help="The checkpoint (PyTorch fp32 eager reference; its prompt spec encodes the slates)."),
    contender: List[str] = typer.Option(..., "--contender", "-c", help="NAME|PATH|ENGINE|DTYPE[|INFERENCE_PRECISION]; repeatable."),
    gates: Optional[Path] = typer.Option(None, help="JSON {contender name: gate report} measured on labelled eval slates (a `hllm calibrate` gate record: its verdict, ΔAUC lower bound, tau, regret p95 and top-1 are shown)."),
    slates: Optional[Path] = slates_opt(),
    limit: Optional[int] = limit_opt(1, "Slates cycled through (batch 1)."),
    rounds: int = typer.Option(5, min=1, max=1000, help="Measured interleaved rounds."),
    warmup: int = typer.Option(1, min=0, max=100, help="Discarded warm-up rounds."),
    threads: Optional[int] = threads_opt("Threads of every engine (default 2)."),
    out_path: Optional[Path] = typer.Option(None, "--out", "-o", help="JSON to write (e.g. results/bench/frontier.json)."),
    shared: Optional[bool] = SHARED_OPT,
    note: Optional[str] = NOTE_OPT,
    ort_fp32: Optional[str] = typer.Option(None, "--ort-fp32", help="Contender NAME every row is also compared with (default: the first onnxruntime fp32 contender, e.g. the fused graph)."),
    json_out: bool = json_opt(),
) -> None:
    """s/slate, ratio to PyTorch fp32 eager and to ONNX Runtime fp32, fraction of the GEMM peak of each dtype, gate figures, CPU flags.

    Exit 1 when every contender was refused (the report still lists why).
    """
    from hllm.bench.frontier import frontier
    from hllm.formats.report import envelope

    quiet_libraries()
    cs = [parse_contender(c) for c in contender]
    check_output_file(out_path, "--out", inputs=[c.path for c in cs])  # a contender's export is an input too
    data_to_stdout(json_out, out_path)
    if gates is not None:
        from hllm.bench.frontier import read_gates

        g = read_gates(gates)
        cs = [dataclasses.replace(c, gate=g.get(c.name) or {}) for c in cs]
    data = load_slates(slates, limit=limit)
    res = frontier(str(checkpoint), cs, data, rounds=rounds, warmup=warmup, threads=threads or 2, ort_fp32=ort_fp32)
    doc = envelope("frontier", res, shared=shared, note=note)
    from hllm.bench.frontier import gate_summary

    t = Table(title="engine × precision frontier (median of interleaved rounds, batch 1)")
    for col in ("contender", "s/slate", "× PyTorch fp32", "× ORT fp32", "GEMM peak", "gate", "ΔAUC lb", "tau", "regret p95", "top-1"):
        t.add_column(col)
    for r in res["rows"]:
        g = gate_summary(r.get("gate"))
        f = lambda v, fmt: "-" if v is None else fmt.format(v)  # noqa: E731
        verdict = "-" if g["passed"] is None else f"{g['gate'] or ''} {'pass' if g['passed'] else 'FAIL'}".strip()
        t.add_row(r["name"], f"{r['s_per_slate']:.3f}" if "s_per_slate" in r else f"refused: {r['refused'][:60]}",
                  f"{r.get('vs_torch_fp32', 0):.2f}", f(r.get("vs_ort_fp32"), "{:.2f}"), f"{r['gemm_peak_fraction']:.0%}" if r.get("gemm_peak_fraction") else "-",
                  verdict, f(g["auc_lb"], "{:+.4f}"), f(g["kendall_tau_mean"], "{:.3f}"), f(g["regret_p95"], "{:.2g}"),
                  f(g["top1_agreement"], "{:.3f}"))
    print_table(t)
    finish_report(out_path, doc, json_out)
    if all("refused" in r for r in res["rows"][1:]):  # rows[0]: the PyTorch reference; nothing was compared
        from hllm.cli.app import console

        console.print(f"[red]every contender was refused[/] ({len(res['rows']) - 1}): no frontier to compare")
        raise typer.Exit(1)
