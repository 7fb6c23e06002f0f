"""Commands that run models on slates: rank, parity."""

from __future__ import annotations

import time
from itertools import islice
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

import typer
from rich.table import Table

from hllm.cli.app import app, console, out, progress, quiet_libraries, step
from hllm.cli.io import (check_output_file, data_to_stdout, emit_json, finish_report, iter_input_slates, load_slates,
                         slates_file, slates_source, write_records)
from hllm.cli.options import (MAX_WORKERS, batch_opt, hidden_alias, json_opt, limit_opt, out_opt, pick, slates_opt,
                              threads_opt)
from hllm.errors import HllmError

MODEL_HELP = "Checkpoint dir, export dir / .onnx, or TensorRT .plan."


@app.command("rank")
def rank_cmd(
    model: Path = typer.Argument(..., help=MODEL_HELP),
    slates: Optional[Path] = slates_opt(),
    out_path: Path = out_opt(required=True, help="Rankings JSONL to write (atomic; .gz compresses; '-' = stdout)."),
    batch_size: int = batch_opt(),
    limit: Optional[int] = limit_opt(),
    threads: Optional[int] = threads_opt("Intra-op threads of the engine (with --ray: per actor, default 1)."),
    ray: bool = typer.Option(False, "--ray", help="Rank on Ray Data with one engine per actor (pip install 'hllm[ray]'); same output, same order."),
    workers: int = typer.Option(2, "--workers", min=1, max=100_000, help=f"With --ray: number of actors (engines); on a local Ray at most {MAX_WORKERS} (4 × cores), with RAY_ADDRESS (a cluster) any."),
    cpus_per_worker: float = typer.Option(1.0, "--cpus-per-worker", min=0.0, max=1024.0, help="With --ray: Ray CPUs per actor."),
    gpus_per_worker: float = typer.Option(0.0, "--gpus-per-worker", min=0.0, max=64.0, help="With --ray: Ray GPUs per actor (a TensorRT plan or CUDA export)."),
    engine: str = typer.Option("auto", "--engine", help="Engine for an export: auto (its sidecar's choice, else "
                               "onnxruntime), onnxruntime, or openvino (standard flavour; pip install 'hllm[openvino]')."),
    json_out: bool = json_opt(),
) -> None:
    """Rank slates: one prefill pass per batch, LAPJV decode, JSONL rankings out."""
    from hllm.runtime import Ranker
    from hllm.runtime.artefact import resolve

    quiet_libraries()
    check_output_file(out_path)
    data_to_stdout(json_out, out_path)
    if ray:
        _rank_on_ray(model, slates, out_path, batch_size, limit, threads, workers, json_out, cpus_per_worker, gpus_per_worker)
        return
    art = resolve(model)  # a bad path fails before reading slates
    rows = iter_input_slates(slates, limit)  # streamed: one batch in memory, rankings out as they are made
    ranker = Ranker.from_path(art, batch_size=batch_size, threads=threads, engine=engine)
    t0 = time.perf_counter()
    done = [0]
    with ranker, progress() as bar:
        task = bar.add_task(f"ranking with {ranker.engine.name}", total=limit)

        def advance(n: int) -> None:
            done[0] += n
            bar.advance(task, n)

        write_records(out_path, stream_rankings(ranker, rows, advance))
    seconds = time.perf_counter() - t0
    _rank_summary(json_out, done[0], ranker.engine.name, seconds, out_path, model, batch_size)


def stream_rankings(ranker, rows: Iterable[dict], on_progress: Optional[Callable[[int], None]] = None) -> Iterator[dict]:
    """Rankings (``Ranking.to_dict()`` records) of the slates ``rows``, ``ranker.batch_size`` per engine call,
    each batch's yielded before the next batch is read (:meth:`hllm.runtime.Ranker.rank_batch`): memory
    holds one batch, whatever the input's length; a slate without ``slate_id`` is named by its index in the
    whole input. ``on_progress(n)`` after each call. Raises: as ``rank_batch``; EngineError if the engine
    returns another number of rankings than slates."""
    it = iter(rows)
    first = 0
    while chunk := list(islice(it, ranker.batch_size)):
        res = ranker.rank_batch(chunk, first_index=first)
        if len(res) != len(chunk):
            from hllm.errors import EngineError

            raise EngineError(f"ranker returned {len(res)} rankings for {len(chunk)} slates")
        first += len(chunk)
        if on_progress:
            on_progress(len(chunk))
        yield from (r.to_dict() for r in res)


def _rank_summary(json_out: bool, n: int, engine: str, seconds: float, out_path: Path, model: Path, batch_size: int,
                  workers: Optional[int] = None) -> None:
    where = f"on Ray with {workers} actors" if workers else f"with {engine}"
    out.print(f"ranked {n} slate{'' if n == 1 else 's'} {where} in {seconds:.1f} s → {out_path}")
    if json_out:
        emit_json({"command": "rank", "slates": n, "engine": engine, "model": str(model), "out": str(out_path),
                   "batch_size": batch_size, "workers": workers, "seconds": round(seconds, 3)})


def _rank_on_ray(model: Path, slates: Optional[Path], out_path: Path, batch_size: int, limit: Optional[int],
                 threads: Optional[int], workers: int, json_out: bool, cpus: float = 1.0, gpus: float = 0.0) -> None:
    """``hllm rank --ray``: :func:`hllm.runtime.ray_data.rank_file` (a local Ray instance unless RAY_ADDRESS is set)."""
    import os

    from hllm.runtime.artefact import resolve
    from hllm.runtime.ray_data import rank_file

    if str(out_path) == "-":
        raise typer.BadParameter("--ray writes its rankings to a file: give --out a file name")
    if workers > MAX_WORKERS and not os.environ.get("RAY_ADDRESS"):
        raise typer.BadParameter(f"--workers {workers} on a local Ray: at most {MAX_WORKERS} (4 × cores); "
                                 "set RAY_ADDRESS to rank on a cluster")
    path = slates_file(slates)
    resolve(model)  # fail on a bad path before starting Ray
    t0 = time.perf_counter()
    with progress() as bar:
        task = bar.add_task(f"ranking on Ray ({workers} actors)", total=None)
        n = rank_file(model, path, out_path, workers=workers, batch_size=batch_size, threads=threads or 1, limit=limit,
                      on_progress=lambda k: bar.advance(task, k), num_cpus=cpus, num_gpus=gpus)
    _rank_summary(json_out, n, "ray", time.perf_counter() - t0, out_path, model, batch_size, workers)


@app.command("parity")
def parity_cmd(
    reference: Path = typer.Argument(..., help="Reference checkpoint (PyTorch); with --expected, the artefact checked against the trainer's numbers."),
    test: Optional[Path] = typer.Argument(None, help="Backend under test: export dir / .onnx, .plan, or checkpoint (not with --expected)."),
    slates: Optional[Path] = slates_opt(),
    limit: Optional[int] = limit_opt(),
    batch_size: int = batch_opt(),
    out_path: Optional[Path] = out_opt(help="JSON report to write (atomic; '-' = stdout)."),
    atol: float = typer.Option(1e-4, "--atol", min=0.0, max=1e6, help="Max allowed max|ΔM|."),
    min_perm_match: float = typer.Option(1.0, min=0.0, max=1.0, help="Min fraction of identical rankings."),
    min_top1: float = typer.Option(1.0, min=0.0, max=1.0, help="Min top-1 agreement."),
    min_tau: float = typer.Option(1.0, min=-1.0, max=1.0, help="Min mean Kendall tau."),
    per_slate: bool = typer.Option(False, help="Include per-slate records in the report."),
    threads: Optional[int] = threads_opt("Intra-op threads of both engines."),
    json_out: bool = json_opt(),
    allow_non_torch_reference: bool = typer.Option(
        False, "--allow-non-torch-reference",
        help="Accept an export or plan as REFERENCE (engine vs engine; refused by default, since parity is against PyTorch)."),
    expected: Optional[Path] = typer.Option(
        None, "--expected",
        help="The trainer's own numbers for these slates: .npz (slate_ids + scores [S, N, K]) or JSONL rankings "
             "({slate_id, ranking}); REFERENCE is compared with them and a mismatch is explained (docs/bring-your-own.md)."),
    report: Optional[Path] = hidden_alias("--report", "--out"),
) -> None:
    """Compare a backend with the PyTorch reference on real slates; exit 1 if the thresholds fail.

    REFERENCE must be a checkpoint (run by PyTorch); an export or a plan is refused (exit 2) unless
    --allow-non-torch-reference is given, so `hllm parity EXPORT EXPORT` cannot pass a CI gate by comparing
    an engine with itself. With --expected (and no TEST), REFERENCE's rankings and scores are compared
    with the trainer's; when they differ, the common convention mismatches are tried and the one that
    explains the trainer's numbers is named.
    """
    from hllm.runtime import Ranker
    from hllm.runtime.artefact import resolve
    from hllm.verify.parity import Thresholds, run_parity

    quiet_libraries()
    out_path = pick(out_path, report)
    check_output_file(out_path)
    data_to_stdout(json_out, out_path)
    if (expected is None) == (test is None):
        raise HllmError("give TEST (a backend vs the PyTorch reference) or --expected FILE (the trainer's numbers), "
                        "not both or neither")
    if expected is not None:
        return _parity_expected(reference, expected, slates, limit, atol, threads, out_path, json_out)
    ref_art, test_art = resolve(reference), resolve(test)  # bad path: before any output
    if ref_art.kind != "checkpoint" and not allow_non_torch_reference:
        raise HllmError(f"REFERENCE {reference} is a {ref_art.kind} artefact, not a PyTorch checkpoint: parity compares a "
                        "backend with the PyTorch reference (pass --allow-non-torch-reference to compare two engines)")
    options = {"threads": threads} if threads else {}
    ref_ranker, test_ranker = (Ranker.from_path(a, **options) for a in (ref_art, test_art))
    data = load_slates(slates, limit=limit)
    th = Thresholds(atol=atol, min_perm_match=min_perm_match, min_top1=min_top1, min_tau=min_tau)
    t0 = time.perf_counter()
    with progress() as bar:
        task = bar.add_task("parity (reference + test per slate)", total=len(data))
        rep = run_parity(ref_ranker, test_ranker, data, th, batch_size, on_progress=lambda n: bar.advance(task, n))
    from hllm.formats.report import envelope

    d = envelope("parity", rep.to_dict(per_slate=per_slate))
    d["slates_file"] = slates_source(slates, str(slates_file(None)))
    d["seconds"] = round(time.perf_counter() - t0, 1)
    finish_report(out_path, d, json_out, show=print_parity)
    if not rep.passed:
        console.print(f"[red]parity FAILED:[/] {d['failures']}")
        raise typer.Exit(1)


def _parity_expected(model: Path, expected: Path, slates, limit, atol, threads, out_path, json_out) -> None:
    """``parity MODEL --expected FILE``: agreement with the trainer's numbers, the mismatch named."""
    from hllm.formats.report import envelope
    from hllm.runtime import Ranker
    from hllm.runtime.artefact import resolve
    from hllm.verify.expected import ExpectedReport, compare_expected, diagnose, read_expected, rescorer
    from hllm.verify.scoring import score_slates

    want = read_expected(expected)
    ranker = Ranker.from_path(resolve(model), **({"threads": threads} if threads else {}))
    data = load_slates(slates, limit=limit)
    with ranker, step(f"scoring {len(data)} slates and comparing with {expected.name}"):
        (ours,) = score_slates([ranker.engine], ranker.builder, data)
        rep = ExpectedReport(want.kind, compare_expected(want, data, ours, atol), atol)
        if not rep.passed:
            rep.convention, rep.convention_agreement = diagnose(
                want, data, ours, rescorer(ranker.engine, ranker.builder, data), atol)
    d = envelope("parity", rep.to_dict())
    finish_report(out_path, d, json_out, show=lambda r: out.print(
        f"{r['slates']} slates: {r['agreement']:.0%} agree with {expected.name}"
        + (f", max|ΔM| {r['max_abs_diff']:.3g}" if r["max_abs_diff"] is not None else "")))
    if not rep.passed:
        why = (f"the trainer's numbers match hllm's under the convention '{rep.convention}' (docs/bring-your-own.md)"
               if rep.convention else f"no known convention explains it ({rep.convention_agreement})")
        console.print(f"[red]parity with {expected.name} FAILED:[/] {why}")
        raise typer.Exit(1)


def print_parity(d: dict) -> None:
    """Print a parity summary dict as a table."""
    t = Table(title=f"parity: {d['backend']} ({d['precision']}) vs {d['reference']}")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for key in ("slates", "perm_match_rate", "top1_agreement", "top10_agreement", "kendall_tau_mean",
                "max_abs_diff", "mean_abs_diff", "nonfinite", "passed"):
        v = d.get(key)
        t.add_row(key, f"{v:.3g}" if isinstance(v, float) and key.endswith("diff") else str(round(v, 4) if isinstance(v, float) else v))
    out.print(t)
