"""``hllm bench``: per-stage latency, LAP solvers, hLLM vs autoregressive; JSON (+ PNG) out."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from hllm.cli.app import app, console, out, progress, quiet_libraries
from hllm.cli.io import check_output_file, data_to_stdout, emit_json, finish_report, load_slates, slates_source
from hllm.cli.options import hidden_alias, json_opt, limit_opt, pick, slates_opt, threads_opt
from hllm.formats.graph import MAX_BATCH, MAX_ITEMS
from hllm.errors import HllmError

bench_app = typer.Typer(help="Benchmarks: per-stage latency, LAP solvers, hLLM vs autoregressive.", no_args_is_help=True,
                        rich_markup_mode=None)  # plain help text, as the root app
app.add_typer(bench_app, name="bench")

SHARED_OPT = typer.Option(None, "--shared/--quiet-machine", help="State whether other work shared the cores (recorded).")
NOTE_OPT = typer.Option(None, "--note", help="Free text stored with the figures.")


def print_table(t: Table) -> None:
    """Print a wide table on stdout; in a log file (not a terminal) use 160 columns instead of 80."""
    if out.is_terminal:
        out.print(t)
    else:
        from rich.console import Console

        Console(width=160, file=out.file).print(t)  # out.file: stderr when stdout carries data (--json, -o -)


def _ints(text: str, what: str, most: int = MAX_ITEMS) -> list[int]:
    """Comma-separated integers within 1..``most``. Raises HllmError naming the option."""
    from hllm.errors import HllmError

    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise HllmError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1 or max(vals) > most:
        raise HllmError(f"{what} must be integers within 1..{most}, got {text!r}")
    if len(vals) > 64:
        raise HllmError(f"{what}: at most 64 values, got {len(vals)}")
    return vals


@bench_app.command("stages")
def stages_cmd(
    models: List[Path] = typer.Argument(..., help="Checkpoint dirs, export dirs / .onnx, or .plan files (run interleaved)."),
    slates: Optional[Path] = slates_opt(help="Real slates, JSONL or JSONL.gz ('-' = stdin)."),
    n_items: str = typer.Option("10,25,50", "--n-items", "-n", help="Sub-slate sizes N (comma-separated)."),
    batch_sizes: str = typer.Option("1", "--batch-sizes", "-b", help=f"Batch sizes (comma-separated, each ≤ {MAX_BATCH}), each at every N."),
    large_batch: Optional[int] = typer.Option(None, min=1, max=MAX_BATCH, help="Also run this batch size at the largest N only."),
    runs: int = typer.Option(3, min=1, max=100_000, help="Measured calls per model and configuration."),
    warmup: int = typer.Option(1, min=0, max=10_000, help="Warm-up calls per model and configuration (discarded)."),
    threads: Optional[int] = threads_opt(),
    peak_size: int = typer.Option(2048, min=0, max=8192, help="Matrix size of the fp32 GEMM peak measurement (0 = skip)."),
    out_path: Path = typer.Option(Path("results/bench/stages.json"), "--out", "-o", help="JSON to write (atomic; '-' = stdout)."),
    shared: Optional[bool] = SHARED_OPT,
    note: Optional[str] = NOTE_OPT,
    json_out: bool = json_opt(),
) -> None:
    """Per-stage latency (prompt, engine, LAPJV decode, total) on real sub-slates, with the GEMM peak."""
    from hllm.bench.peak import matmul_peak
    from hllm.bench.report import document
    from hllm.bench.stages import bench_stages

    from hllm.runtime.artefact import resolve

    quiet_libraries()
    ns, bs = _ints(n_items, "--n-items"), _ints(batch_sizes, "--batch-sizes", MAX_BATCH)
    configs = [(n, b) for n in ns for b in bs]
    if large_batch:
        configs.append((max(ns), large_batch))
    check_output_file(out_path)
    data_to_stdout(json_out, out_path)
    for m in models:
        resolve(m)
    need = max(b for _, b in configs) * (runs + warmup)
    data = load_slates(slates, limit=need)
    peak = matmul_peak(peak_size) if peak_size else None
    if peak:
        console.print(f"fp32 GEMM peak ({peak_size}³): {peak['peak_gflops']} GFLOP/s")
    total = len(models) * sum(runs + warmup for _ in configs)
    with progress() as bar:
        task = bar.add_task("stage benchmark", total=total)
        recs = bench_stages(models, data, runs=runs, warmup=warmup, threads=threads,
                            peak_gflops=peak["peak_gflops"] if peak else None, configs=configs,
                            on_call=lambda _: bar.advance(task))
    doc = document("stages", recs, shared, note, matmul_peak=peak, slates_file=slates_source(slates))
    print_stages(recs)
    finish_report(out_path, doc, json_out, label="")


def print_stages(recs: list[dict]) -> None:
    """Table of per-stage medians (ms) per record."""
    t = Table(title="hLLM stages (median ms per call)")
    for c in ("backend", "N", "B", "runs", "prompt", "engine", "decode+out", "LAPJV µs/slate", "total", "overhead", "tok/s", "GFLOP/s"):
        t.add_column(c, justify="right")
    for r in recs:
        s = r["stage_ms"]
        t.add_row(r["backend"], str(r["n_items"]), str(r["batch_size"]), str(r["runs"]), f"{s['prompt']:.2f}",
                  f"{s['engine']:.1f}", f"{s['decode_output']:.3f}", f"{r['lapjv_us']['median']:.1f}", f"{s['total']:.1f}",
                  f"{r['overhead_fraction']:.2%}", f"{r['tokens_per_s']:.0f}",
                  "-" if r["gflops"] is None else f"{r['gflops']:.0f}" + ("" if r["peak_fraction"] is None else f" ({r['peak_fraction']:.0%})"))
    print_table(t)


@bench_app.command("lapjv")
def lapjv_cmd(
    n_items: str = typer.Option("10,50,150", "--n-items", "-n", help="Square sizes N (comma-separated)."),
    families: str = typer.Option("gaussian,planted,rank1", help="Score-matrix families (see hllm.bench.lapjv)."),
    matrices: int = typer.Option(200, min=1, max=100_000, help="Measured matrices per (N, family); N ≥ 150 uses a quarter."),
    model: Optional[Path] = typer.Option(None, "--model", help="Also time the real score matrices of this hLLM artefact."),
    limit: int = limit_opt(8, "Real slates scored by --model (the first ones; per N ≤ its K and slate size)."),
    slates: Optional[Path] = slates_opt(help="Real slates for --model ('-' = stdin)."),
    out_path: Path = typer.Option(Path("results/bench/lapjv.json"), "--out", "-o", help="JSON to write (atomic; '-' = stdout)."),
    shared: Optional[bool] = SHARED_OPT,
    note: Optional[str] = NOTE_OPT,
    json_out: bool = json_opt(),
    model_slates: Optional[int] = hidden_alias("--model-slates", "--limit"),
) -> None:
    """Compare LAP solvers (lap.lapjv, scipy, others installed) and the runtime's decode path."""
    from hllm.bench.lapjv import FAMILIES, available_solvers, bench_solvers
    from hllm.bench.report import document
    from hllm.errors import HllmError
    from hllm.runtime.decode import SOLVER

    limit = pick(limit, model_slates, 8)
    if limit < 1:
        raise typer.BadParameter("--limit must be ≥ 1")
    fams = [f.strip() for f in families.split(",") if f.strip()]
    bad = [f for f in fams if f not in FAMILIES]
    if bad or not fams:
        raise HllmError(f"unknown matrix families {bad}; choose from {list(FAMILIES)}")
    ns = _ints(n_items, "--n-items", 1000)
    check_output_file(out_path)
    data_to_stdout(json_out, out_path)
    solvers = available_solvers()
    real: dict[int, list] = {}
    if model is not None:
        from hllm.bench.lapjv import model_score_matrices
        from hllm.runtime.artefact import resolve

        quiet_libraries()
        k = resolve(model).num_positions
        data = load_slates(slates, limit=limit)
        fits = [n for n in ns if n <= k and all(len(s["candidates"]) >= n for s in data)]
        from hllm.cli.app import step

        with step(f"scoring {len(data)} real slates at N={fits} with {model}"):
            real = model_score_matrices(model, data, fits)
    recs = []
    with progress() as bar:
        grid = [(n, f) for n in ns for f in fams] + [(n, "model") for n in real]
        task = bar.add_task("LAP solvers", total=len(grid))
        for n, fam in grid:
            count = matrices if n < 150 else max(10, matrices // 4)
            rec = bench_solvers(n, fam, count, solvers=solvers, matrices=real.get(n) if fam == "model" else None)
            if fam == "model":
                rec["model"], rec["distinct_matrices"] = str(model), len(real[n])
            recs.append(rec)
            bar.advance(task)
    doc = document("lapjv", recs, shared, note, runtime_solver=SOLVER, solvers=[s.name for s in solvers])
    print_lapjv(recs, [s.name for s in solvers])
    finish_report(out_path, doc, json_out, label="")
    if not all(r["correct"] for r in recs):
        console.print("[red]solvers disagree on the optimum[/]")
        raise typer.Exit(1)


def print_lapjv(recs: list[dict], solver_names: list[str]) -> None:
    """Table of LAP solve medians (µs per slate) per (N, family) record of :func:`hllm.bench.lapjv.bench_solvers`."""
    from hllm.bench.lapjv import BATCH

    t = Table(title="LAP solve, median µs per slate (float64 cost | float32 cost)")
    t.add_column("N", justify="right")
    t.add_column("family")
    for s in solver_names:
        t.add_column(s, justify="right")
    t.add_column("runtime decode()", justify="right")
    t.add_column(f"batch of {BATCH}: decode_batch | decode loop | lapjv loop, /slate", justify="right")
    t.add_column("same optimum")
    for r in recs:
        row = [str(r["n_items"]), r["family"]]
        for s in solver_names:
            row.append(f"{r['solvers_us'][s + '/float64']['median']:.1f} | {r['solvers_us'][s + '/float32']['median']:.1f}")
        bu = r["batch_us_per_slate"]
        row += [f"{r['runtime_decode_us']['median']:.1f}",
                f"{bu['decode_batch()']['median']:.1f} | {bu['decode() loop']['median']:.1f} | {bu['lap.lapjv loop']['median']:.1f}",
                "yes" if r["correct"] else "NO"]
        t.add_row(*row)
    print_table(t)


@bench_app.command("scaling")
def scaling_cmd(
    models: List[Path] = typer.Argument(..., help="Checkpoint dir (the reference: put it first), export dirs / .onnx, .plan files."),
    seq_lens: str = typer.Option("400,800,1350,2600", "--seq-lens", help="Prompt lengths S in tokens (comma-separated)."),
    n_items: int = typer.Option(50, "--n-items", "-n", min=1, max=MAX_ITEMS, help="Candidates N per prompt."),
    runs: int = typer.Option(5, min=1, max=100_000, help="Measured interleaved rounds per S."),
    warmup: int = typer.Option(1, min=0, max=10_000, help="Warm-up rounds per S (discarded)."),
    threads: Optional[int] = threads_opt(),
    peak_size: int = typer.Option(2048, min=0, max=8192, help="Matrix size of the fp32 GEMM peak measurement (0 = skip)."),
    out_path: Path = typer.Option(Path("results/bench/scaling.json"), "--out", "-o", help="JSON to write (atomic; '-' = stdout)."),
    shared: Optional[bool] = SHARED_OPT,
    note: Optional[str] = NOTE_OPT,
    json_out: bool = json_opt(),
) -> None:
    """Engine time against prompt length (synthetic prompts of exactly S tokens), contenders interleaved."""
    from hllm.bench.peak import matmul_peak
    from hllm.bench.report import document
    from hllm.bench.scaling import bench_scaling
    from hllm.runtime.artefact import resolve

    quiet_libraries()
    ss = _ints(seq_lens, "--seq-lens", 1 << 16)
    check_output_file(out_path)
    data_to_stdout(json_out, out_path)
    for m in models:
        resolve(m)
    peak = matmul_peak(peak_size) if peak_size else None
    with progress() as bar:
        task = bar.add_task("scaling benchmark", total=len(ss))
        recs = bench_scaling(models, ss, n_items, runs, warmup, threads, peak["peak_gflops"] if peak else None,
                             on_call=lambda _: bar.advance(task))
    doc = document("scaling", recs, shared, note, matmul_peak=peak)
    t = Table(title="engine ms vs prompt length (median; ratio = reference ms / ms)")
    for c in ("S", "model", "precision", "flavour", "ms", "ratio", "GFLOP/s (peak)"):
        t.add_column(c, justify="right")
    for r in recs:
        pf = "" if r["peak_fraction"] is None else f" ({r['peak_fraction']:.0%})"
        t.add_row(str(r["seq_len"]), Path(r["model"]).parent.name or r["model"], r["precision"], str(r["flavour"]),
                  f"{r['engine_ms']['median']:.0f}", f"{r['ratio_to_reference']:.2f}", f"{r['gflops']}{pf}")
    print_table(t)
    finish_report(out_path, doc, json_out, label="")


@bench_app.command("versus-ar")
def versus_ar_cmd(
    models: List[Path] = typer.Argument(..., help="hLLM artefacts (checkpoint / export); the first one gives `speedup`."),
    ar_model: Path = typer.Option(..., "--ar", help="Causal LM dir of the same backbone (AR teacher), e.g. work/smollm2."),
    slates: Optional[Path] = slates_opt(help="Real slates, JSONL or JSONL.gz ('-' = stdin)."),
    limit: int = limit_opt(3, "Measured slates (the first ones; one more is used for warm-up)."),
    n_items: str = typer.Option("50", "--n-items", "-n", help="Slate sizes N (comma-separated)."),
    threads: Optional[int] = threads_opt("Intra-op threads of every engine and of torch."),
    unconstrained: bool = typer.Option(True, help="Also run unconstrained greedy decoding."),
    out_path: Path = typer.Option(Path("results/bench/versus_ar.json"), "--out", "-o", help="JSON to write (atomic; '-' = stdout)."),
    shared: Optional[bool] = SHARED_OPT,
    note: Optional[str] = NOTE_OPT,
    json_out: bool = json_opt(),
    count: Optional[int] = hidden_alias("--count", "--limit"),
) -> None:
    """hLLM single pass vs greedy autoregressive ranking, interleaved per slate (paper Table 2)."""
    from hllm.bench.report import document
    from hllm.bench.versus_ar import bench_versus_ar
    from hllm.errors import HllmError
    from hllm.runtime.artefact import resolve

    quiet_libraries()
    limit = pick(limit, count, 3)
    if limit < 1:
        raise typer.BadParameter("--limit must be ≥ 1")
    ns = _ints(n_items, "--n-items")
    check_output_file(out_path)
    data_to_stdout(json_out, out_path)
    if not ar_model.is_dir():
        raise HllmError(f"--ar {ar_model}: not a model directory")
    for m in models:
        resolve(m)
    data = load_slates(slates, limit=limit + 1)
    recs = []
    calls_per = len(models) + 1 + int(unconstrained)
    with progress() as bar:
        task = bar.add_task("hLLM vs autoregressive", total=len(ns) * calls_per * len(data))
        for n in ns:
            recs.append(bench_versus_ar(models, ar_model, data, n, threads, unconstrained,
                                        on_call=lambda _: bar.advance(task)))
    doc = document("versus_ar", recs, shared, note, slates_file=slates_source(slates))
    t = Table(title="single pass vs autoregressive (median per slate)")
    for c in ("N", "slates", "hLLM ms", "AR ms", "AR passes", "speed-up", "AR free ms", "free passes", "free invalid"):
        t.add_column(c, justify="right")
    for r in recs:
        t.add_row(str(r["n_items"]), str(r["slates"]), f"{r['hllm_ms']:.0f}", f"{r['ar_ms']:.0f}", f"{r['ar_decode_passes']:.0f}",
                  f"{r['speedup']:.1f}×", f"{r.get('ar_unconstrained_ms', float('nan')):.0f}",
                  f"{r.get('ar_unconstrained_decode_passes', float('nan')):.0f}",
                  f"{r.get('ar_unconstrained_invalid_rate', float('nan')):.0%}")
    print_table(t)
    finish_report(out_path, doc, json_out, label="")


@bench_app.command("chart")
def chart_cmd(
    stages: Path = typer.Option(..., help="Stage benchmark JSON (hllm bench stages -o)."),
    versus: Optional[Path] = typer.Option(None, help="hLLM vs AR JSON (hllm bench versus-ar -o)."),
    n_items: int = typer.Option(50, "--n-items", "-n", min=1, max=MAX_ITEMS, help="N of the per-stage panel."),
    scaling: Optional[Path] = typer.Option(None, help="Engine time vs prompt length JSON (hllm bench scaling -o)."),
    out_path: Path = typer.Option(..., "--out", "-o", help="PNG to write (atomic)."),
    json_out: bool = json_opt(),
) -> None:
    """PNG of the per-stage breakdown (+ hLLM vs AR, + engine time vs prompt length) from the JSON results (needs matplotlib)."""
    from hllm.bench.chart import write_chart

    check_output_file(out_path)
    data_to_stdout(json_out)
    st = _load_doc(stages, ("stages",))
    _check_stage_ms(stages, st)  # the check of `bench markdown`: a missing / mistyped figure is named
    vs = None
    if versus is not None:
        recs = _load_doc(versus, ("versus_ar",))["records"]
        vs = ([r for r in recs if r.get("n_items") == n_items] or recs or [None])[0]
    sc = _load_doc(scaling, ("scaling",))["records"] if scaling is not None else None
    try:
        chart = write_chart(st["records"], out_path, vs, n_items=n_items, scaling=sc)
    except _RECORD_ERRORS as e:
        names = ", ".join(str(p) for p in (stages, versus, scaling) if p is not None)
        raise HllmError(f"{names}: a record has a missing or mistyped value ({type(e).__name__}: {e})") from None
    if chart.clipped:
        from hllm.bench.chart import MAX_LABEL

        from rich.markup import escape

        console.print(f"[yellow]warning:[/] {len(chart.clipped)} label(s) longer than {MAX_LABEL} characters were "
                      f"cut (first: {escape(repr(chart.clipped[0][:40]))}…)", highlight=False)
    out.print(f"chart → {out_path}")
    if json_out:
        emit_json({"command": "bench chart", "out": str(out_path), "stages": str(stages), "versus": versus and str(versus),
                   "scaling": scaling and str(scaling), "n_items": n_items})


def _load_doc(p: Path, kinds: tuple[str, ...]) -> dict:
    """A benchmark JSON of one of ``kinds`` with a list of records, read with the size and file-type limits
    of :func:`hllm.reading.read_json` and the envelope checks of :func:`hllm.formats.report.read_envelope`
    (old files with ``benchmark`` instead of ``kind`` included; ``kind`` is set on the returned dict).
    Raises HllmError naming the file (and the field)."""
    from hllm.formats.report import ReportError, read_envelope
    from hllm.reading import read_json

    doc = read_json(p, HllmError)
    try:
        kind = read_envelope(doc)["kind"]
    except ReportError as e:
        raise HllmError(f"{p}: {e}") from None
    if kind not in kinds or not isinstance(doc.get("records"), list):
        raise HllmError(f"{p} is not a benchmark JSON of kind {' or '.join(kinds)} with a list of records "
                        f"(kind {kind!r})")
    return {**doc, "kind": kind}


#: What rendering / charting a record with a missing, null or mistyped value raises.
_RECORD_ERRORS = (TypeError, KeyError, ValueError, AttributeError, IndexError)


def _check_stage_ms(f: Path, doc: dict) -> None:
    """Every record of a ``stages`` document has ``stage_ms``: a JSON object of numbers (ms) with ``total``
    (what both ``bench markdown`` and ``bench chart`` read). Raises HllmError naming the file and record."""
    for i, r in enumerate(doc["records"]):
        s = r.get("stage_ms") if isinstance(r, dict) else None
        bad = None if isinstance(s, dict) else f"is {type(s).__name__ if s is not None else 'null or missing'}"
        if bad is None:
            wrong = [k for k, v in s.items() if isinstance(v, bool) or not isinstance(v, (int, float))]
            bad = (f"has non-numeric {wrong[0]!r}: {s[wrong[0]]!r:.40}" if wrong
                   else "has no 'total'" if "total" not in s else None)
        if bad:
            raise HllmError(f"{f}: records[{i}].stage_ms {bad}; expected an object of numbers (ms per stage) "
                            "with 'total' (a record of this stages benchmark has a missing or non-numeric value)")


def _table(f: Path, doc: dict) -> str:
    """The Markdown table of a benchmark document (``bench markdown``).
    Raises HllmError naming the file when a record has a missing, null or non-numeric value."""
    from hllm.bench.markdown import lapjv_table, scaling_table, stages_table, versus_table

    render = {"stages": stages_table, "versus_ar": versus_table, "lapjv": lapjv_table, "scaling": scaling_table}
    try:
        return render[doc["kind"]](doc)
    except _RECORD_ERRORS as e:
        raise HllmError(f"{f}: a record of this {doc['kind']} benchmark has a missing or non-numeric value "
                        f"({type(e).__name__}: {e})") from None


@bench_app.command("markdown")
def markdown_cmd(
    files: List[Path] = typer.Argument(..., help="Benchmark JSON files (stages, versus_ar, lapjv)."),
    json_out: bool = json_opt(),
) -> None:
    """Print the Markdown tables of benchmark JSON files (the figures docs/benchmarks.md shows)."""
    from hllm.formats.report import read_envelope

    docs = [(f, _load_doc(f, ("stages", "versus_ar", "lapjv", "scaling"))) for f in files]  # all checked first
    for f, doc in docs:
        if doc["kind"] == "stages":
            _check_stage_ms(f, doc)
    tables = [_table(f, doc) for f, doc in docs]  # rendered before any output: a bad record is named
    if json_out:  # the tables as one JSON document: [{"file", "kind", "markdown"}]
        emit_json([{"file": str(f), "kind": doc["kind"], "markdown": t} for (f, doc), t in zip(docs, tables)])
        return
    for (f, doc), table in zip(docs, tables):
        print(f"<!-- from {f} ({read_envelope(doc)['created']}, shared machine: {doc.get('shared')}) -->")
        print(table)
        print()
