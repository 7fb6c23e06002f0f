"""``hllm calibrate``: quantize an FP32 export (INT8 / FP8) from real slates, behind a ranking-fidelity gate."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import List, Optional

import typer
from rich.table import Table

from hllm.cli.app import app, console, out, progress, quiet_libraries
from hllm.cli.io import (check_output_dir, check_output_file, data_to_stdout, finish_report, load_slates, slates_file,
                         slates_source)
from hllm.cli.options import (choice_opt, deprecated, hidden_alias, json_opt, limit_opt, overwrite_opt, pick,
                              slates_opt, threads_opt)
from hllm.formats.graph import MAX_BATCH
from hllm.calibration.recipes.options import BACKENDS
from hllm.formats.vocabulary import QUANT_PRECISIONS
from hllm.errors import EngineError, OutputError, SlateError
from hllm.runtime.slates import slate_ids


@app.command("calibrate")
def calibrate_cmd(
    export_dir: Path = typer.Argument(..., help="FP32 export directory (from `hllm export`)."),
    out_dir: Optional[Path] = typer.Argument(None, show_default=False, help="Quantized export directory to write (only if it passes the gate)."),
    backend: str = choice_opt("ort-static", BACKENDS + ("auto",), "--backend", help="ort-static (CPU, calibrated), ort-dynamic (CPU), ort-weight-only (CPU, 8-bit weights, float activations), modelopt (TensorRT Q/DQ), or auto: build every engine × precision this CPU runs (ONNX Runtime / OpenVINO, fp32 / bf16 / int8), gate each, write the fastest that passes."),
    precision: str = choice_opt("int8", tuple(str(p) for p in QUANT_PRECISIONS) + ("bf16",), "--precision", help="int8, fp8 (modelopt, Ada/Hopper targets only), or bf16 (checked against the CPU: AVX512_BF16 / AMX; refused with the reason)."),
    target: str = typer.Option("cpu", help="cpu, a GPU name (a100, l4, h100 …) or compute capability (8.0)."),
    calib_slates: Optional[Path] = typer.Option(None, help="Slates to draw calibration data from (e.g. the train split)."),
    calibration: Optional[Path] = typer.Option(None, help="A saved calibration set (.npz/.json) to reuse instead."),
    calib_count: int = typer.Option(32, min=1, max=100_000, help="Calibration slates to draw."),
    calib_seed: int = typer.Option(0, min=0, max=2**32 - 1, help="Seed of the calibration draw."),
    calib_batch_size: int = typer.Option(1, min=1, max=MAX_BATCH, help="Slates per calibration batch."),
    slates: Optional[Path] = slates_opt(help="Held-out slates for the gate (never calibration slates; '-' = stdin)."),
    limit: Optional[int] = limit_opt(100, "Gate on the first LIMIT slates of --slates (--backend auto: the next 24 validate NNCF's accuracy control)."),
    exclude: List[str] = typer.Option([], "--exclude", "-x", help="Part kept in float: head, norms, attention, mlp, first, last, block:I, or a module path. Repeatable."),
    exclude_node: List[str] = typer.Option([], help="Node name kept in float. Repeatable."),
    auto: bool = typer.Option(False, help="Exclude the most sensitive parts one at a time until the gate passes."),
    max_tries: int = typer.Option(6, min=1, max=100, help="Most quantize+gate attempts in --auto mode."),
    per_channel: bool = typer.Option(True, help="Per-channel weight scales."),
    reduce_range: bool = typer.Option(True, help="7-bit weights (ORT on AVX2 without VNNI)."),
    activation_type: str = choice_opt("uint8", ("uint8", "int8"), "--activation-type", help="ORT static activation type."),
    calibrate_method: str = choice_opt("minmax", ("minmax", "max", "entropy", "percentile"), "--calibrate-method",
                                       help="Range estimation: minmax (ORT) / max (ModelOpt), entropy or percentile."),
    weight_matmuls_only: bool = typer.Option(True, help="Keep activation×activation MatMuls (attention) in float."),
    op_type: List[str] = typer.Option(["MatMul", "Gemm"], "--op-type", help="Op types to quantize. Repeatable."),
    block_size: int = typer.Option(32, min=16, max=256, help="ort-weight-only: weights per scale along the reduction axis (16, 32, 64, 128 or 256)."),
    accuracy_level: int = typer.Option(0, min=0, max=4, help="ort-weight-only: MatMulNBits compute, 0 float … 4 INT8 activations per block."),
    gate: str = choice_opt("quality", ("quality", "strict"), "--gate", help="quality: the one-sided 95% bootstrap lower bounds of ΔAUC, ΔNDCG@10, ΔRecall@10 within their margins, and the fidelity floor (mean tau, p95 assignment regret, finite scores); strict: top-1 agreement and point |ΔRecall@10|, |ΔAUC| limits."),
    auc_margin: float = typer.Option(0.005, min=0.0, max=1.0, help="Quality gate: the lower bound of ΔAUC must be ≥ −margin."),
    ndcg10_margin: float = typer.Option(0.01, min=0.0, max=1.0, help="Quality gate: the lower bound of ΔNDCG@10 must be ≥ −margin."),
    recall10_margin: float = typer.Option(0.01, min=0.0, max=1.0, help="Quality gate: the lower bound of ΔRecall@10 must be ≥ −margin."),
    min_tau: Optional[float] = typer.Option(0.9, min=-1.0, max=1.0, help="Quality gate (fidelity floor): min mean Kendall tau with FP32."),
    max_regret_p95: float = typer.Option(1e-3, min=0.0, max=1.0, help="Quality gate (fidelity floor): max 95th percentile of the per-slate assignment regret (docs/calibration.md)."),
    min_top1: float = typer.Option(0.97, min=0.0, max=1.0, help="Strict gate: min top-1 agreement with FP32."),
    max_recall10_delta: float = typer.Option(0.01, min=0.0, max=1.0, help="Strict gate: max |ΔRecall@10| (slates with labels)."),
    max_auc_delta: float = typer.Option(0.005, min=0.0, max=1.0, help="Strict gate: max |ΔAUC| (slates with labels)."),
    recipe: List[str] = typer.Option([], "--recipe", help="With --backend auto: consider only these recipes (onnxruntime-fp32 always). Repeatable."),
    bf16_islands: Optional[Path] = typer.Option(None, "--bf16-islands", help="With --backend auto: the islands file of `hllm debug precision --precision bf16` that the openvino-bf16-islands recipe keeps in fp32 (default: every attention matrix product, q/k/v/o projections and scores, and the head; the MLP runs bf16)."),
    time_budget: Optional[float] = typer.Option(None, "--time-budget", min=60.0, max=7 * 86400.0, show_default=False, help="With --backend auto: seconds the run plans for (default 1200, what 200 slates take on 2 cores); NNCF's accuracy control runs last on what is left of it and is refused when that is under 10 min. The other steps are not cut short."),
    bench_runs: int = typer.Option(0, min=0, max=10_000, help="Also time INT8 vs FP32 engines interleaved for this many runs (0 = skip; --backend auto: default 5)."),
    bench_warmup: int = typer.Option(2, min=0, max=1_000, help="Warm-up runs of the speed comparison (discarded)."),
    threads: Optional[int] = threads_opt("Intra-op threads of the ORT engines."),
    reference_scores_path: Optional[Path] = typer.Option(
        None, "--reference-scores", help="Cache of the FP32 scores on the eval slates (.npz): read if present, else written."),
    report: Optional[Path] = typer.Option(None, "--report", help="Also write the JSON report here ('-' = stdout)."),
    overwrite: bool = overwrite_opt("OUT_DIR"),
    json_out: bool = json_opt(),
    out_alias: Optional[Path] = typer.Option(None, "--out", "-o", hidden=True),
    eval_slates: Optional[Path] = hidden_alias("--eval-slates", "--slates"),
    eval_limit: Optional[int] = hidden_alias("--eval-limit", "--limit"),
    bench_rounds: Optional[int] = hidden_alias("--bench-rounds", "--bench-runs"),
    candidate: Optional[List[str]] = hidden_alias("--candidate", "--recipe"),
) -> None:
    """Quantize an export, gate it on held-out real slates, write it only if it passes (else exit 1)."""
    run_calibrate(SimpleNamespace(**locals()))


def run_calibrate(a: SimpleNamespace) -> None:
    """The run of ``hllm calibrate`` from its parsed options ``a``: the checks every run makes, then the one
    loop (:func:`hllm.calibration.selection.loop.run_loop`) over the recipe of ``--backend B`` or, with
    ``--backend auto``, over the table of recipes (:func:`_calibrate`).
    Raises: typer.BadParameter / HllmError (exit 2)."""
    quiet_libraries()
    if a.out_alias is not None:
        deprecated("calibrate --out/-o DIR", "the positional OUT_DIR")
    out_dir = a.out_dir if a.out_dir is not None else a.out_alias
    if out_dir is None:
        raise typer.BadParameter("give OUT_DIR, the quantized export directory to write")
    slates, limit = pick(a.slates, a.eval_slates), pick(a.limit, a.eval_limit, 100)
    bench_runs, recipes = pick(a.bench_runs, a.bench_rounds, 0), tuple(pick(a.recipe, a.candidate, []))
    if (limit is not None and limit < 1) or not 0 <= bench_runs <= 10_000:
        raise typer.BadParameter("--limit must be ≥ 1 and --bench-runs within 0..10000")
    th_kw = dict(mode=a.gate, auc_margin=a.auc_margin, ndcg10_margin=a.ndcg10_margin, recall10_margin=a.recall10_margin,
                 min_tau=a.min_tau, max_regret_p95=a.max_regret_p95, min_top1=a.min_top1,
                 max_recall10_delta=a.max_recall10_delta, max_auc_delta=a.max_auc_delta)
    if a.backend == "auto":
        _refuse_ignored_by_auto()
    for given, option in ((a.time_budget is not None, "--time-budget"), (bool(recipes), "--recipe"),
                          (a.bf16_islands is not None, "--bf16-islands")):
        if given and a.backend != "auto":
            raise typer.BadParameter(f"{option} applies to --backend auto only")
    _calibrate(a, out_dir, th_kw, slates, limit, recipes, bench_runs or (5 if a.backend == "auto" else 0))


def _calibrate(a: SimpleNamespace, out_dir: Path, th_kw: dict, slates, limit, recipes: tuple, rounds: int) -> None:
    """The checks before any work, the slates and the calibration data, then the one loop over the recipe of
    ``--backend B`` (:func:`hllm.calibration.selection.select.calibrate`: writes OUT_DIR only if it passes, else
    exit 1) or over the recipe table (``--backend auto``, :func:`hllm.calibration.selection.select.select`: the
    fastest recipe that passes; always one, the FP32 baseline passes its own check)."""
    from hllm.calibration.recipes.accuracy_control import ACCURACY_CONTROL_SETTINGS
    from hllm.calibration.recipes.options import QuantOptions
    from hllm.calibration.recipes.table import check_start
    from hllm.calibration.selection.loop import TIME_BUDGET_S, LoopRequest
    from hllm.calibration.selection.pipeline import prepare_calibration
    from hllm.calibration.selection.select import CalibrateRequest, calibrate, select
    from hllm.formats.export import read_export

    t_start, auto = time.perf_counter(), a.backend == "auto"  # the budget counts the steps before the loop
    opts = None if auto else QuantOptions(
        backend=a.backend, precision=a.precision, target=a.target, per_channel=a.per_channel,
        reduce_range=a.reduce_range, activation_type=a.activation_type, exclude=tuple(a.exclude),
        exclude_nodes=tuple(a.exclude_node), calibrate_method=a.calibrate_method,
        weight_matmuls_only=a.weight_matmuls_only, op_types=tuple(a.op_type), block_size=a.block_size,
        accuracy_level=a.accuracy_level)
    if opts is not None:
        opts.validate()  # refuses fp8 for an A100 before any work
    th, calib_slates = _check_run(th_kw, a.json_out, a.report, out_dir, a.overwrite, a.reference_scores_path,
                                  a.calib_slates)
    art, builder = _onnx_export(a.export_dir, a.backend)
    if auto:
        check_start(read_export(art.path.parent), recipes)
    if a.bf16_islands is not None:  # a bad islands file is refused before any work
        from hllm.calibration.precision_search.bf16_islands import read_islands

        read_islands(a.bf16_islands, art.path.parent)
    # --backend auto: the slates after the gate's --limit validate NNCF's accuracy control, never the gate's own
    loaded = load_slates(slates, limit=limit + (ACCURACY_CONTROL_SETTINGS["validation_slates"] if auto else 0))
    evals, validation = loaded[:limit], loaded[limit:]
    warn_unlabelled(evals)
    say = lambda m: console.print(f"[green]✓[/] {m}")  # noqa: E731
    cal = None
    if not auto or a.calibration is not None or calib_slates is not None:
        with console.status("[bold]preparing calibration data…"):
            cal = prepare_calibration(art, builder, "ort-static" if auto else a.backend, a.calibration, calib_slates,
                                      a.calib_count, a.calib_seed, a.calib_batch_size, slate_ids(evals), say)
    req = LoopRequest(art.path.parent, out_dir, th, evals, cal, recipes, rounds, a.bench_warmup, a.threads,
                      a.reference_scores_path, a.overwrite, a.bf16_islands, validation,
                      TIME_BUDGET_S if a.time_budget is None else a.time_budget, time.perf_counter() - t_start,
                      artefact=art)
    if auto:
        result, dest = _with_progress(select, req)
        finish_report(a.report, result.to_report(), a.json_out, show=_print_selection)
        return out.print(f"selected {result.selected} → {dest}")
    result, dest = _with_progress(calibrate, CalibrateRequest(
        req, opts, slates_source(slates, str(slates_file(None))), calibration_saved=a.calibration is not None,
        auto=a.auto, max_tries=a.max_tries))
    finish_report(a.report, result.to_report(), a.json_out, show=_print)
    if result.passed:
        out.print(f"quantized export → {dest}")
    else:
        console.print(f"[red]gate FAILED:[/] {result.gate['failures']}; the graph was written only as {dest}")
        raise typer.Exit(1)


#: Options of one quantization recipe, which ``--backend auto`` does not use (it builds every engine ×
#: precision recipe itself): given with it, they are refused instead of being silently ignored.
IGNORED_BY_AUTO = ("precision", "target", "exclude", "exclude_node", "auto", "max_tries", "per_channel", "reduce_range",
                   "activation_type", "calibrate_method", "weight_matmuls_only", "op_type", "block_size",
                   "accuracy_level")


def _refuse_ignored_by_auto() -> None:
    """Refuse (typer.BadParameter: exit 2) any of :data:`IGNORED_BY_AUTO` given on the command line or in
    the environment together with ``--backend auto``, naming the options (click's ``ParameterSource``)."""
    from typer._click.core import ParameterSource
    from typer._click.globals import get_current_context

    ctx = get_current_context()
    given = [p for p in ctx.command.params if p.name in IGNORED_BY_AUTO
             and ctx.get_parameter_source(p.name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)]
    if given:
        names = ", ".join(p.opts[0] for p in given)
        raise typer.BadParameter(f"--backend auto builds and gates every engine × precision recipe itself and "
                                 f"does not use {names}; drop {'it' if len(given) == 1 else 'them'}, or pick one "
                                 "backend (e.g. --backend ort-static) to quantize with these settings")


def warn_unlabelled(slates: list[dict]) -> None:
    """Warn on stderr when no gate slate has a positive label: the gate's quality criteria (ΔRecall@10,
    ΔAUC against the labels, :mod:`hllm.verify.gate`) cannot be checked, only the agreement with FP32."""
    if not any(s.get("labels") and any(s["labels"]) for s in slates):
        console.print(f"[yellow]warning:[/] none of the {len(slates)} gate slates has a positive label: the quality "
                      "criteria (ΔRecall@10, ΔAUC) cannot be checked; the gate judges agreement with FP32 only "
                      "(give labelled --slates to check them)", highlight=False)


def _check_run(th_kw: dict, json_out: bool, report, out_dir: Path, overwrite: bool, reference_cache, calib_slates):
    """The checks every calibrate run makes before any work: the gate's thresholds, stdout for one JSON
    document, the outputs (OUT_DIR, --report, --reference-scores) and the calibration slates file.
    Returns ``(GateThresholds, calib_slates path or None)``. Raises: typer.BadParameter / OutputError / SlateError."""
    from hllm.verify.gate import GateThresholds

    try:
        th = GateThresholds(**th_kw)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    data_to_stdout(json_out, report)
    check_output_dir(out_dir, overwrite, "OUT_DIR")
    check_output_file(report, "--report")
    _check_reference_cache(reference_cache, out_dir)
    return th, (slates_file(calib_slates, "--calib-slates") if calib_slates is not None else None)


def _check_reference_cache(cache: Optional[Path], out_dir: Path) -> None:
    """Refuse, before any work, a ``--reference-scores`` cache that would be written (it does not exist
    yet; an existing one is only read) inside OUT_DIR — replaced at the end, so the final rename would
    fail — or inside an input of the command such as the export (:func:`check_output_file`).

    Raises: OutputError naming the option.
    """
    if cache is None or cache.is_file():
        return
    here, dest = Path(os.path.realpath(cache)), Path(os.path.realpath(out_dir))
    if here == dest or dest in here.parents:
        raise OutputError(f"--reference-scores: {cache} is inside OUT_DIR {out_dir}, which is written as a whole "
                          "at the end; keep the cache elsewhere")
    check_output_file(cache, "--reference-scores")


def _print_selection(r: dict) -> None:
    from hllm.calibration.selection.select import SelectionResult

    t = Table(title=f"calibrate --backend auto: selected {r['selected']}")
    for col in ("recipe", "check", "ΔAUC lb", "ΔNDCG@10 lb", "tau", "regret p95", "top-1", "verdict", "ms/slate", "× fp32"):
        t.add_column(col)
    for c in SelectionResult.from_dict(r).recipes:
        g = c.get("gate") or {}
        q, fid = g.get("quality") or {}, g.get("fidelity") or {}
        f = lambda v, fmt="{:.3f}": "-" if v is None else fmt.format(v)  # noqa: E731
        lb = lambda m: f((q.get(m) or {}).get("lower_bound"), "{:+.4f}")  # noqa: E731
        status = next((f"{k}: {c[k]}" for k in ("refused", "error", "skipped") if c.get(k)), None) or \
            ("pass" if c.get("passed") else "FAIL")
        if c.get("passed") is False and g.get("failures"):
            status += ": " + ", ".join(x["criterion"] for x in g["failures"])
        check = c.get("check", "-")
        if check == "parity":
            check = f"parity max|ΔM| {c['parity']['max_abs_diff']:.1g}"
        t.add_row(c["name"], check, lb("auc"), lb("ndcg@10"), f(g.get("kendall_tau_mean")), f(fid.get("regret_p95"), "{:.2g}"),
                  f(g.get("top1_agreement")), status[:160], str(c.get("engine_ms_median", "-")),
                  str(c.get("speedup_vs_fp32", "-")))
    out.print(t, width=None if out.is_terminal else 200)  # a log file: wide enough for the reasons


def _onnx_export(export_dir: Path, backend: str):
    """The resolved ONNX export at ``export_dir`` and a PromptBuilder over its tokenizer and prompt spec.

    Raises: SlateError if it is another kind of artefact; EngineError for ``modelopt`` on a flavour
        other than ``standard`` (refused before the FP32 reference run); HllmError from resolving it.
    """
    from hllm.runtime.artefact import resolve
    from hllm.runtime.prompt import PromptBuilder, load_tokenizer

    art = resolve(export_dir)
    if art.kind != "onnx":
        raise SlateError(f"{export_dir} is a {art.kind}, not an ONNX export (run `hllm export` first)")
    if backend == "modelopt" and art.flavour != "standard":
        raise EngineError(f"{export_dir} is the {art.flavour} flavour: ModelOpt Q/DQ for TensorRT needs "
                          "`hllm export --flavour standard` (TensorRT cannot parse ONNX Runtime contrib ops)")
    return art, PromptBuilder(load_tokenizer(art.tokenizer_path), art.prompt, max_items=art.num_positions)


def _with_progress(run, req):
    """``run(req, say, progress)`` — :func:`hllm.calibration.selection.select.calibrate` or ``select`` — with
    its steps and progress shown on the console."""
    with progress_lines(progress()) as bar:
        return run(req, say=lambda m: bar.console.print(f"  {m}", highlight=False, markup=False), progress=bar.bar_for)


class progress_lines:
    """A rich progress bar (:func:`hllm.cli.app.progress`) that also leaves a trace in a log: when stderr is
    not a terminal (the bar is off), each task prints a line ``description: done/total (elapsed, ETA)``
    at most every ``every_s`` seconds and when it completes. ``bar_for(description, total)`` → ``advance(n)``
    is the :data:`hllm.calibration.selection.pipeline.Progress` callable the loop takes."""

    def __init__(self, bar, every_s: float = 30.0):
        self.bar, self.every_s, self.console = bar, every_s, bar.console

    def __enter__(self) -> "progress_lines":
        self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)

    def bar_for(self, desc: str, total: int):
        import time

        task = self.bar.add_task(desc, total=total)
        if self.console.is_terminal:
            return lambda n: self.bar.advance(task, n)
        state = {"done": 0, "t0": time.monotonic(), "last": time.monotonic()}

        def advance(n: int) -> None:
            self.bar.advance(task, n)
            state["done"] += n
            now = time.monotonic()
            if state["done"] >= total or now - state["last"] >= self.every_s:
                state["last"] = now
                el = now - state["t0"]
                eta = el / state["done"] * (total - state["done"]) if state["done"] else 0.0
                self.console.print(f"  {desc}: {state['done']}/{total} ({el:.0f} s, ETA {eta:.0f} s)", highlight=False)
        return advance


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
    g = r.get("gate") or {}
    for c in g.get("criteria") or []:
        if c["passed"] is None:
            continue
        mark = ("pass" if c["passed"] else "FAIL") + ("" if c["required"] else " (reported)")
        tested = "-" if c["tested"] is None else f"{c['tested']:.4g}"
        t.add_row(f"{g.get('gate', '')} gate: {c['name']}", f"{tested} {c['op']} {c['limit']:g} {mark}")
    out.print(t)
