"""Commands that run models on slates: rank, parity."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from hllm.cli.app import DEFAULT_SLATES, app, console, out, progress, quiet_libraries


@app.command("rank")
def rank_cmd(
    model: Path = typer.Argument(..., help="Checkpoint dir, export dir / .onnx, or TensorRT .plan."),
    slates: Path = typer.Option(DEFAULT_SLATES, "--slates", "-s", help="Slates, JSONL or JSONL.gz."),
    out_path: Path = typer.Option(..., "--out", "-o", help="Rankings JSONL to write (atomic)."),
    batch_size: int = typer.Option(1, help="Slates per engine call."),
    limit: Optional[int] = typer.Option(None, help="Rank only the first LIMIT slates."),
    threads: Optional[int] = typer.Option(None, help="Intra-op threads of the engine (with --ray: per actor, default 1)."),
    ray: bool = typer.Option(False, "--ray", help="Rank on Ray Data with one engine per actor (pip install 'hllm[ray]'); same output, same order."),
    workers: int = typer.Option(2, help="With --ray: number of actors (engines)."),
) -> None:
    """Rank slates: one prefill pass per batch, LAPJV decode, JSONL rankings out."""
    from hllm.runtime import Ranker, read_slates, write_jsonl

    quiet_libraries()
    if ray:
        _rank_on_ray(model, slates, out_path, batch_size, limit, threads, workers)
        return
    data = read_slates(slates, limit=limit)
    ranker = Ranker.from_path(model, batch_size=batch_size, threads=threads)
    t0 = time.perf_counter()
    with ranker, progress() as bar:
        task = bar.add_task(f"ranking with {ranker.engine.name}", total=len(data))
        res = ranker.rank(data, on_progress=lambda n: bar.advance(task, n))
    write_jsonl(out_path, (r.to_dict() for r in res))
    out.print(f"ranked {len(res)} slates with {ranker.engine.name} in {time.perf_counter() - t0:.1f} s → {out_path}")


def _rank_on_ray(model: Path, slates: Path, out_path: Path, batch_size: int, limit: Optional[int], threads: Optional[int], workers: int) -> None:
    """``hllm rank --ray``: :func:`hllm.runtime.ray_data.rank_file` (a local Ray instance unless RAY_ADDRESS is set)."""
    from hllm.runtime.artefact import resolve
    from hllm.runtime.ray_data import rank_file

    if workers < 1 or batch_size < 1:
        raise typer.BadParameter("--workers and --batch-size must be ≥ 1")
    resolve(model)  # fail on a bad path before starting Ray
    t0 = time.perf_counter()
    with progress() as bar:
        task = bar.add_task(f"ranking on Ray ({workers} actors)", total=None)
        n = rank_file(model, slates, out_path, workers=workers, batch_size=batch_size, threads=threads or 1, limit=limit,
                      on_progress=lambda k: bar.advance(task, k))
    out.print(f"ranked {n} slates on Ray with {workers} actors in {time.perf_counter() - t0:.1f} s → {out_path}")


@app.command("parity")
def parity_cmd(
    reference: Path = typer.Argument(..., help="Reference checkpoint (PyTorch)."),
    test: Path = typer.Argument(..., help="Backend under test: export dir / .onnx, .plan, or checkpoint."),
    slates: Path = typer.Option(DEFAULT_SLATES, "--slates", "-s", help="Slates, JSONL or JSONL.gz."),
    limit: Optional[int] = typer.Option(None, help="Use only the first LIMIT slates."),
    batch_size: int = typer.Option(1, help="Slates per engine call."),
    report: Optional[Path] = typer.Option(None, "--report", "-o", help="JSON report to write (atomic)."),
    atol: float = typer.Option(1e-4, help="Max allowed max|ΔM|."),
    min_perm_match: float = typer.Option(1.0, help="Min fraction of identical rankings."),
    min_top1: float = typer.Option(1.0, help="Min top-1 agreement."),
    min_tau: float = typer.Option(1.0, help="Min mean Kendall tau."),
    per_slate: bool = typer.Option(False, help="Include per-slate records in the report."),
) -> None:
    """Compare a backend with the PyTorch reference on real slates; exit 1 if the thresholds fail."""
    from hllm.files import atomic_write_json
    from hllm.verify.parity import Thresholds, run_parity
    from hllm.runtime import read_slates

    from hllm.runtime.artefact import resolve

    quiet_libraries()
    data = read_slates(slates, limit=limit)
    resolve(reference), resolve(test)  # fail on a bad path before any progress output
    th = Thresholds(atol=atol, min_perm_match=min_perm_match, min_top1=min_top1, min_tau=min_tau)
    t0 = time.perf_counter()
    with progress() as bar:
        task = bar.add_task("parity (reference + test per slate)", total=len(data))
        rep = run_parity(reference, test, data, th, batch_size, on_progress=lambda n: bar.advance(task, n))
    d = rep.to_dict(per_slate=per_slate)
    d["slates_file"] = str(slates)
    d["seconds"] = round(time.perf_counter() - t0, 1)
    if report:
        atomic_write_json(report, d)
    print_parity(d)
    if report:
        out.print(f"report → {report}")
    if not rep.passed:
        console.print(f"[red]parity FAILED:[/] {d['failures']}")
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
