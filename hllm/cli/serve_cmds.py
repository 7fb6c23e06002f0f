"""Commands that serve rankings: serve (HTTP API), loadtest, triton-repo."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from hllm.cli.app import DEFAULT_SLATES, app, console, out, quiet_libraries


@app.command("serve")
def serve_cmd(
    model: Path = typer.Argument(..., help="Export dir / .onnx, TensorRT .plan, or checkpoint dir."),
    host: str = typer.Option("127.0.0.1", help="Address to bind (loopback unless told otherwise)."),
    port: int = typer.Option(8000, help="TCP port."),
    max_batch: int = typer.Option(8, help="Most slates per engine call (micro-batch size)."),
    max_wait_ms: float = typer.Option(5.0, help="Micro-batch window: how long the oldest request waits for others."),
    no_batching: bool = typer.Option(False, "--no-batching", help="One engine call per slate (max-batch 1, no wait)."),
    max_queue: int = typer.Option(64, help="Most requests waiting for the engine; more → 503 + Retry-After."),
    deadline_ms: float = typer.Option(60_000, help="Default per-request deadline (ms) → 504."),
    max_body_bytes: int = typer.Option(4 * 1024 * 1024, help="Larger request bodies → 413."),
    max_slates_per_request: int = typer.Option(32, help="More slates in one request → 413."),
    threads: Optional[int] = typer.Option(None, help="Intra-op threads of the engine."),
    graceful_timeout: float = typer.Option(60.0, help="Seconds to drain in-flight requests on SIGTERM."),
    log_level: str = typer.Option("info", help="uvicorn log level."),
) -> None:
    """Serve rankings over HTTP: POST /v1/rank, GET /healthz /readyz /metrics /docs (Ctrl-C or SIGTERM drains)."""
    import logging

    from hllm.runtime import Ranker
    from hllm.serve.app import ServeOptions, create_app
    from hllm.serve.batching import BatchOptions
    from hllm.serve.server import is_loopback, run_server

    quiet_libraries()
    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.INFO), format="%(levelname)s %(name)s: %(message)s")
    if no_batching:
        max_batch, max_wait_ms = 1, 0.0
    opts = ServeOptions(
        batch=BatchOptions(max_batch_slates=max_batch, max_wait_ms=max_wait_ms, max_queue=max_queue, deadline_ms=deadline_ms),
        max_body_bytes=max_body_bytes,
        max_slates_per_request=max_slates_per_request,
    )
    if not is_loopback(host):
        console.print(f"[yellow]warning:[/] binding {host}: the API is reachable from other machines (it has no auth)")
    ranker = Ranker.from_path(model, threads=threads)
    application = create_app(ranker, opts, info={"model": str(model)})
    console.print(
        f"serving {model} on http://{host}:{port} (max batch {opts.batch.max_batch_slates}, window {opts.batch.max_wait_ms} ms); "
        "the engine loads in the background — GET /readyz says when it is ready"
    )
    run_server(application, host=host, port=port, log_level=log_level, graceful_timeout_s=graceful_timeout)


@app.command("loadtest")
def loadtest_cmd(
    model: Optional[Path] = typer.Argument(None, help="Export dir / .onnx / .plan / checkpoint (served in-process, both modes)."),
    slates: Path = typer.Option(DEFAULT_SLATES, "--slates", "-s", help="Slates, JSONL or JSONL.gz."),
    url: Optional[str] = typer.Option(None, help="Measure an already running server instead (loopback only, one mode)."),
    clients: int = typer.Option(4, help="Concurrent clients."),
    requests: int = typer.Option(40, help="Requests per mode (one slate each)."),
    max_seconds: float = typer.Option(300.0, help="No request starts after this many seconds (per mode, split over its rounds)."),
    limit: int = typer.Option(40, help="Distinct slates to cycle through (the first LIMIT of --slates)."),
    candidates: Optional[int] = typer.Option(None, help="Cut every slate to CANDIDATES candidates (hllm.runtime.slates.subslate)."),
    max_batch: Optional[int] = typer.Option(None, help="Micro-batch size when batching is on (default: clients)."),
    max_wait_ms: float = typer.Option(20.0, help="Micro-batch window when batching is on."),
    rounds: int = typer.Option(2, help="Bursts per mode, alternating on/off/off/on… (fair under changing machine load)."),
    threads: Optional[int] = typer.Option(None, help="Intra-op threads of the engine."),
    note: Optional[str] = typer.Option(None, help="Free text stored in the JSON (e.g. that the cores were shared)."),
    out_path: Optional[Path] = typer.Option(None, "--out", "-o", help="JSON report to write (atomic)."),
) -> None:
    """Load-test the server on loopback: throughput, p50/p90/p99, errors — micro-batching on vs off in one run."""
    from hllm.bench.loadtest import loadtest_report
    from hllm.files import atomic_write_json
    from hllm.runtime import read_slates

    quiet_libraries()
    report = loadtest_report(model, url, read_slates(slates, limit=limit), clients, requests, max_seconds,
                             candidates, max_batch, max_wait_ms, threads, rounds, note, str(slates),
                             log=lambda m: console.print(m))
    if out_path:
        atomic_write_json(out_path, report)
    _print_table(report)
    if out_path:
        out.print(f"report → {out_path}")


def _print_table(report: dict) -> None:
    from rich.table import Table

    t = Table(title="load test (client-side latency)")
    for c in ("mode", "ok/sent", "errors", "req/s", "median ms", "p90 ms", "p99 ms"):
        t.add_column(c, no_wrap=True)
    sizes = []
    for name, m in report["modes"].items():
        if not isinstance(m, dict) or "latency_ms" not in m:
            continue
        lat = m["latency_ms"] or {"median": "-", "p90": "-", "p99": "-"}
        t.add_row(name, f"{m['ok']}/{m['requests']}", str(m["errors"]), str(m["throughput_rps"]),
                  str(lat["median"]), str(lat["p90"]), str(lat["p99"]))
        sizes.append(f"{name}: requests by engine-batch size {json.dumps(m['batch_slates_seen'])}")
    out.print(t)
    for line in sizes:
        out.print(line)
    agree = report["modes"].get("rankings_identical_across_modes")
    if agree:
        out.print(f"rankings identical across modes: {agree['identical']}/{agree['compared']}")


@app.command("triton-repo")
def triton_repo_cmd(
    model: Path = typer.Argument(..., help="Export dir / .onnx (ONNX Runtime backend) or TensorRT .plan."),
    out_dir: Path = typer.Argument(..., help="Repository to write (refused if it exists, unless --overwrite)."),
    max_batch_size: int = typer.Option(8, help="Triton max_batch_size of every model (slates per request)."),
    max_queue_delay_us: int = typer.Option(2000, help="Dynamic batching window of the engine model (µs)."),
    instances: int = typer.Option(1, help="Engine model instances."),
    kind: str = typer.Option("gpu", help="Engine instance kind: gpu or cpu."),
    preprocess_instances: int = typer.Option(2, help="CPU instances of the preprocessing (tokenization) model."),
    decode_instances: int = typer.Option(2, help="CPU instances of the LAPJV decode model."),
    seq_bucket: int = typer.Option(64, help="Prompts are right-padded to a multiple of this many tokens (equal shapes batch)."),
    bundle_deps: bool = typer.Option(False, "--bundle-deps", help="Unpack the tokenizers and lap wheels into the repository (pip, needs PyPI or PIP_FIND_LINKS): runs on a stock Triton image."),
    bundle_python: str = typer.Option("3.12", help="Python version of the Triton image's Python backend (for --bundle-deps)."),
    bundle_arch: str = typer.Option("x86_64", help="CPU architecture of the Triton image: x86_64 or aarch64 (for --bundle-deps)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing repository."),
) -> None:
    """Write a Triton model repository: preprocessing + engine (ONNX / TensorRT) + LAPJV decode, as one ensemble (slates in, rankings out)."""
    from hllm.serve.triton.repo import write_repository

    quiet_libraries()
    res = write_repository(
        model, out_dir, max_batch_size=max_batch_size, max_queue_delay_us=max_queue_delay_us,
        instances=instances, kind=kind, decode_instances=decode_instances, preprocess_instances=preprocess_instances,
        seq_bucket=seq_bucket, bundle_deps=bundle_deps, bundle_python=bundle_python, bundle_arch=bundle_arch, overwrite=overwrite,
    )
    for name in res["models"]:
        out.print(f"  {out_dir}/models/{name}/config.pbtxt")
    if res["bundled"]:
        out.print(f"shipped for Python {bundle_python} {bundle_arch}: {', '.join(p for v in res['bundled'].values() for p in v)}")
    else:
        console.print("[yellow]note:[/] tokenizers and lap are not shipped: the Triton image needs them, or rerun with --bundle-deps")
    out.print(f"Triton repository → {out_dir} (tritonserver --model-repository {out_dir}/models); client: {out_dir}/client/rank.py; see {out_dir}/README.md")
