"""``hllm calibrate``: quantize an FP32 export (INT8 / FP8) from real slates, behind a ranking-fidelity gate."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from hllm.cli.app import DEFAULT_SLATES, app, console, out, progress, quiet_libraries


@app.command("calibrate")
def calibrate_cmd(
    export_dir: Path = typer.Argument(..., help="FP32 export directory (from `hllm export`)."),
    out_dir: Path = typer.Option(..., "--out", "-o", help="Quantized export directory to write (only if it passes the gate)."),
    backend: str = typer.Option("ort-static", help="ort-static (CPU, calibrated), ort-dynamic (CPU), ort-weight-only (CPU, 8-bit weights, float activations) or modelopt (TensorRT Q/DQ)."),
    precision: str = typer.Option("int8", help="int8, or fp8 (modelopt, Ada/Hopper targets only)."),
    target: str = typer.Option("cpu", help="cpu, a GPU name (a100, l4, h100 …) or compute capability (8.0)."),
    calib_slates: Optional[Path] = typer.Option(None, help="Slates to draw calibration data from (e.g. the train split)."),
    calibration: Optional[Path] = typer.Option(None, help="A saved calibration set (.npz/.json) to reuse instead."),
    calib_count: int = typer.Option(32, help="Calibration slates to draw."),
    calib_seed: int = typer.Option(0, help="Seed of the calibration draw."),
    calib_batch_size: int = typer.Option(1, help="Slates per calibration batch."),
    eval_slates: Path = typer.Option(DEFAULT_SLATES, help="Held-out slates for the gate (never calibration slates)."),
    eval_limit: Optional[int] = typer.Option(100, help="Gate on the first LIMIT eval slates."),
    exclude: List[str] = typer.Option([], "--exclude", "-x", help="Part kept in float: head, norms, attention, mlp, first, last, block:I, or a module path. Repeatable."),
    exclude_node: List[str] = typer.Option([], help="Node name kept in float. Repeatable."),
    auto: bool = typer.Option(False, help="Exclude the most sensitive parts one at a time until the gate passes."),
    max_tries: int = typer.Option(6, help="Most quantize+gate attempts in --auto mode."),
    per_channel: bool = typer.Option(True, help="Per-channel weight scales."),
    reduce_range: bool = typer.Option(True, help="7-bit weights (ORT on AVX2 without VNNI)."),
    activation_type: str = typer.Option("uint8", help="ORT static activation type: uint8 or int8."),
    calibrate_method: str = typer.Option("minmax", help="minmax, entropy or percentile."),
    weight_matmuls_only: bool = typer.Option(True, help="Keep activation×activation MatMuls (attention) in float."),
    op_type: List[str] = typer.Option(["MatMul", "Gemm"], "--op-type", help="Op types to quantize. Repeatable."),
    block_size: int = typer.Option(32, help="ort-weight-only: weights per scale along the reduction axis."),
    accuracy_level: int = typer.Option(0, help="ort-weight-only: MatMulNBits compute, 0 float … 4 INT8 activations per block."),
    min_top1: float = typer.Option(0.97, help="Gate: min top-1 agreement with FP32."),
    max_recall10_delta: float = typer.Option(0.01, help="Gate: max |ΔRecall@10| (slates with labels)."),
    min_tau: Optional[float] = typer.Option(None, help="Gate: min mean Kendall tau (off by default)."),
    bench_rounds: int = typer.Option(0, help="Also time INT8 vs FP32 engines interleaved for this many rounds (0 = skip)."),
    bench_warmup: int = typer.Option(2, help="Warm-up rounds of the speed comparison (discarded)."),
    threads: Optional[int] = typer.Option(None, help="Intra-op threads of the ORT engines."),
    reference_scores_path: Optional[Path] = typer.Option(
        None, "--reference-scores", help="Cache of the FP32 scores on the eval slates (.npz): read if present, else written."),
    report: Optional[Path] = typer.Option(None, "--report", help="Also write the JSON report here."),
    overwrite: bool = typer.Option(False, help="Replace --out if it exists."),
) -> None:
    """Quantize an export, gate it on held-out real slates, write it only if it passes (else exit 1)."""
    from hllm.build.calibration_data import build_calibration_set, check_disjoint, load_calibration_set
    from hllm.verify.gate import (
        GateThresholds, load_reference, open_ranker, reference_scores, run_gate, save_reference,
    )
    from hllm.build.quantize import (
        NothingToQuantize, QuantOptions, auto_exclude, calibration_ranges, quantize_export, sensitivity_ladder,
    )
    from hllm.errors import SlateError
    from hllm.files import atomic_write_json, promote_dir
    from hllm.runtime import read_slates
    from hllm.runtime.artefact import resolve
    from hllm.runtime.prompt import PromptBuilder, load_tokenizer

    quiet_libraries()
    opts = QuantOptions(backend=backend, precision=precision, target=target, per_channel=per_channel,
                        reduce_range=reduce_range, activation_type=activation_type, exclude=tuple(exclude),
                        exclude_nodes=tuple(exclude_node), calibrate_method=calibrate_method,
                        weight_matmuls_only=weight_matmuls_only, op_types=tuple(op_type),
                        block_size=block_size, accuracy_level=accuracy_level)
    opts.validate()  # refuses fp8 for an A100 before any work
    try:
        th = GateThresholds(min_top1=min_top1, max_recall10_delta=max_recall10_delta, min_tau=min_tau)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"{out_dir} already exists (pass --overwrite to replace it)")
    art = resolve(export_dir)
    if art.kind != "onnx":
        raise SlateError(f"{export_dir} is a {art.kind}, not an ONNX export (run `hllm export` first)")
    export_dir = art.path.parent
    builder = PromptBuilder(load_tokenizer(art.tokenizer_path), art.prompt, max_items=art.num_positions)
    evals = read_slates(eval_slates, limit=eval_limit)
    eval_ids = [str(s.get("slate_id", "")) for s in evals]

    calib = None
    if calibration is not None:
        calib = load_calibration_set(calibration)
        if calib.meta.get("prompt") != art.prompt.to_dict():
            raise SlateError(f"calibration set {calibration} was encoded with another prompt spec than {export_dir}")
    elif calib_slates is not None and backend in ("ort-dynamic", "ort-weight-only"):
        console.print(f"[yellow]![/] --backend {backend} uses no calibration data: --calib-slates ignored")
    elif calib_slates is not None:
        with console.status("[bold]building calibration set…"):
            pool = read_slates(calib_slates)
            calib = build_calibration_set(pool, builder, calib_count, calib_seed, calib_batch_size,
                                          exclude_ids=eval_ids, source=calib_slates, tokenizer_path=art.tokenizer_path)
        console.print(f"[green]✓[/] calibration set: {len(calib.slate_ids)} slates from {calib_slates} (seed {calib_seed})")
    elif backend not in ("ort-dynamic", "ort-weight-only"):
        raise SlateError(f"--backend {backend} needs calibration data: pass --calib-slates (e.g. the train split) "
                         "or --calibration")
    cal_ids = calib.slate_ids if calib is not None else []
    check_disjoint(cal_ids, evals)

    engine_opts = {"threads": threads}

    t0 = time.perf_counter()
    if reference_scores_path is not None and reference_scores_path.is_file():
        ref = load_reference(reference_scores_path, evals, art.meta.get("onnx_sha256"))
        console.print(f"[green]✓[/] FP32 reference scores from {reference_scores_path}")
    else:
        with progress() as bar:
            task = bar.add_task("FP32 reference on eval slates", total=len(evals))
            ref = reference_scores(open_ranker(export_dir, threads=threads), evals,
                                   on_batch=lambda n: bar.advance(task, n))
        if reference_scores_path is not None:
            save_reference(reference_scores_path, ref, evals, art.meta.get("onnx_sha256"))
    ref_seconds = time.perf_counter() - t0

    staging = out_dir.parent / f".{out_dir.name}.candidate"
    cache = out_dir.parent / f".{out_dir.name}.calib-cache.json"
    if cache.exists():
        cache.unlink()  # ranges are recomputed from this run's calibration data
    reports: dict[tuple, dict] = {}

    def attempt(parts: tuple[str, ...]) -> tuple[bool, dict]:
        o = QuantOptions(**{**opts.__dict__, "exclude": tuple(parts)})
        try:
            with console.status(f"[bold]quantizing ({backend} {precision}, excluded: {', '.join(parts) or 'nothing'})…"):
                res = quantize_export(export_dir, staging, o, calib,
                                      cache_path=cache if backend == "ort-static" else None)
        except NothingToQuantize as e:
            if not auto:
                raise
            console.print(f"[yellow]![/] excluding {', '.join(parts) or 'nothing'} leaves nothing to quantize: stopping")
            return False, {"error": str(e), "stop": True}
        console.print(f"[green]✓[/] quantized {res.summary['quantized_nodes']} nodes, "
                      f"{len(res.excluded_nodes)} kept in float ({res.seconds:.0f} s)")
        with progress() as bar:
            task = bar.add_task(f"gate ({precision}) on eval slates", total=len(evals))
            rep = run_gate(ref, staging, evals, th, cal_ids, on_batch=lambda n: bar.advance(task, n), **engine_opts)
        d = rep.to_dict()
        d["quantized_nodes"] = res.summary["quantized_nodes"]
        d["kept_float_nodes"] = len(res.excluded_nodes)
        reports[parts] = d
        console.print(f"  top-1 {d['top1_agreement']:.3f}  tau {d['kendall_tau_mean']:.3f}  "
                      f"ΔR@10 {d['recall@10_delta'] if d['recall@10_delta'] is not None else 'n/a'}  "
                      f"→ {'[green]pass' if rep.passed else '[red]FAIL'}")
        return rep.passed, {k: d[k] for k in ("top1_agreement", "kendall_tau_mean", "recall@10_delta",
                                                "quantized_nodes", "kept_float_nodes", "failures")}

    try:
        if auto:
            ladder = []
            import onnx

            m = onnx.load(str(art.path), load_external_data=False)
            first_ok, first_rec = attempt(tuple(exclude))
            tries = [{"excluded": list(exclude), "passed": first_ok, **first_rec}]
            passed, parts = first_ok, tuple(exclude)
            if not first_ok and max_tries > 1 and not first_rec.get("stop"):
                ranges = calibration_ranges(cache) if cache.is_file() else None
                ladder = sensitivity_ladder(m, ranges)
                nxt = next((p for p in ladder if p not in exclude), None)
                if nxt is not None:
                    passed, parts, more = auto_exclude(attempt, ladder, start=tuple(exclude) + (nxt,),
                                                       max_tries=max_tries - 1)
                    tries += more
            del m
        else:
            passed, _ = attempt(tuple(exclude))
            parts, tries, ladder = tuple(exclude), [], []
        if parts not in reports:  # every try stopped before a graph existed
            raise NothingToQuantize(tries[-1].get("error") or "no quantized graph was produced")
        final = reports[parts]

        result = {
            "precision": precision,
            "backend": backend,
            "target": target,
            "passed": passed,
            "top1_agreement": final["top1_agreement"],
            "kendall_tau_mean": final["kendall_tau_mean"],
            "recall@10_delta": final["recall@10_delta"],
            "excluded_parts": list(parts),
            "gate": final,
            "eval_slates": {"file": str(eval_slates), "count": len(evals), "first_id": eval_ids[0], "last_id": eval_ids[-1]},
            "calibration": None if calib is None else {k: calib.meta.get(k) for k in
                                                        ("source", "source_sha256", "seed", "count", "batch_size", "data_sha256")},
            "options": QuantOptions(**{**opts.__dict__, "exclude": parts}).to_dict(),
            "reference": str(export_dir),
            "reference_seconds": round(ref_seconds, 1),
        }
        if auto:
            result["auto"] = {"ladder": ladder, "tries": tries}

        if bench_rounds > 0:
            from hllm.bench.machine import describe_machine
            from hllm.bench.speed import compare_speed

            with console.status(f"[bold]timing {precision} vs fp32 interleaved ({bench_rounds} rounds)…"):
                sp = compare_speed({"fp32": export_dir, precision: staging}, evals[: max(1, min(len(evals), bench_rounds))],
                                   rounds=bench_rounds, warmup=bench_warmup, threads=threads)
            result["speed"] = sp
            result["speedup_vs_fp32"] = sp["speedup_vs_fp32"][precision]
            result["machine"] = describe_machine(shared=True, note="CPU cores shared with other processes during the run")

        dest = out_dir if passed else out_dir.with_name(out_dir.name + ".FAILED")
        if calib is not None and calibration is None:
            calib.save(staging / "calibration")
        atomic_write_json(staging / "calibration_report.json", result)
        promote_dir(staging, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if cache.exists():
            cache.unlink()
    if report:
        atomic_write_json(report, result)
    _print(result)
    if passed:
        out.print(f"quantized export → {dest}")
    else:
        console.print(f"[red]gate FAILED:[/] {final['failures']}; the graph was written only as {dest}")
        raise typer.Exit(1)


def _print(r: dict) -> None:
    t = Table(title=f"calibrate: {r['backend']} {r['precision']} vs fp32")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for k in ("top1_agreement", "kendall_tau_mean", "recall@10_delta", "speedup_vs_fp32", "passed"):
        v = r.get(k)
        if v is None and k == "speedup_vs_fp32":
            continue
        t.add_row(k, f"{v:.4f}" if isinstance(v, float) else str(v))
    t.add_row("excluded parts", ", ".join(r["excluded_parts"]) or "—")
    out.print(t)
