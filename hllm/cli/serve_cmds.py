"""Commands that serve rankings: serve (HTTP API), loadtest, triton-repo."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from hllm.cli.app import EXIT_SIGTERM, Terminated, app, console, out, quiet_libraries, signal_exit
from hllm.cli.io import (check_output_dir, check_output_file, data_to_stdout, emit_json, finish_report, load_slates,
                         slates_source)
from hllm.cli.options import (choice_opt, hidden_alias, json_opt, limit_opt, out_opt, overwrite_opt, pick, slates_opt,
                              threads_opt)
from hllm.formats.graph import MAX_BATCH, MAX_ITEMS

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
LOG_FORMATS = ("text", "json")


@app.command("serve")
def serve_cmd(
    model: Path = typer.Argument(..., help="Export dir / .onnx, TensorRT .plan, checkpoint dir, or a versioned model repository (REPO/1, REPO/2, ...: the highest valid version is served; POST /admin/reload or SIGHUP swaps in a newer one)."),
    host: str = typer.Option("127.0.0.1", help="Address to bind (loopback unless told otherwise)."),
    port: int = typer.Option(8000, min=1, max=65535, help="TCP port."),
    batch_size: int = typer.Option(8, "--batch-size", "-b", min=1, max=MAX_BATCH, help="Most slates per engine call (micro-batch size)."),
    max_wait_ms: float = typer.Option(5.0, min=0.0, max=60_000.0, help="Micro-batch window: how long the oldest request waits for others."),
    no_batching: bool = typer.Option(False, "--no-batching", help="One engine call per slate (batch size 1, no wait)."),
    max_queue: int = typer.Option(64, min=1, max=100_000, help="Most requests waiting for the engine; more → 503 + Retry-After."),
    deadline_ms: float = typer.Option(60_000, min=1.0, max=86_400_000.0, help="Default per-request deadline (ms) → 504."),
    max_body_bytes: int = typer.Option(4 * 1024 * 1024, min=1, max=1024**3, help="Larger request bodies → 413."),
    max_slates_per_request: int = typer.Option(32, min=1, max=MAX_BATCH, help="More slates in one request → 413."),
    threads: Optional[int] = threads_opt(),
    graceful_timeout: float = typer.Option(60.0, min=0.0, max=3600.0, help="Seconds to drain in-flight requests on SIGTERM; those still unanswered then get 503 (exit 143)."),
    log_level: str = choice_opt("info", LOG_LEVELS, "--log-level", help="uvicorn log level."),
    log_format: str = choice_opt("text", LOG_FORMATS, "--log-format", help="Log lines as text or one JSON object a line; at --log-level info every request is logged (request id, route, status, latency, slates, documents, model version)."),
    api_key: List[str] = typer.Option([], "--api-key", metavar="KEY", help="Accept 'Authorization: Bearer KEY' (16+ visible ASCII characters). Repeatable. Prefer --api-key-file or $HLLM_API_KEYS: argv is visible to other users."),
    api_key_file: Optional[Path] = typer.Option(None, "--api-key-file", help="File of API keys, one a line ('#' comments), e.g. a mounted secret. Keys in $HLLM_API_KEYS (comma-separated) count too."),
    no_auth: bool = typer.Option(False, "--no-auth", help="Serve a non-loopback --host without API keys (refused otherwise)."),
    public_metrics: bool = typer.Option(False, "--public-metrics", help="GET /metrics answers without a key (keys on: it needs one)."),
    public_docs: bool = typer.Option(False, "--public-docs", help="GET /docs, /redoc and /openapi.json answer without a key."),
    ssl_certfile: Optional[Path] = typer.Option(None, "--ssl-certfile", help="Serve HTTPS with this PEM certificate chain."),
    ssl_keyfile: Optional[Path] = typer.Option(None, "--ssl-keyfile", help="The PEM private key of --ssl-certfile (unless the cert file holds it)."),
    served_model_name: List[str] = typer.Option([], "--served-model-name", metavar="NAME", help="A name the model answers to (rerank 'model', KServe model name, GET /v1/models). Repeatable; default hllm_ranker."),
    admin_api_key: List[str] = typer.Option([], "--admin-api-key", metavar="KEY", help="Accept 'Authorization: Bearer KEY' on POST /admin/reload (separate from the API keys). Repeatable. Prefer --admin-api-key-file or $HLLM_ADMIN_API_KEYS."),
    admin_api_key_file: Optional[Path] = typer.Option(None, "--admin-api-key-file", help="File of admin keys, one a line ('#' comments). Keys in $HLLM_ADMIN_API_KEYS (comma-separated) count too."),
    allow_admin_without_key: bool = typer.Option(False, "--allow-admin-without-key", help="Without an admin key, loopback clients may call POST /admin/reload (loopback --host only)."),
    otlp_endpoint: Optional[str] = typer.Option(None, "--otlp-endpoint", metavar="URL", help="Send a trace per request (tokenize / queue wait / engine / decode spans) to this OTLP/HTTP collector, e.g. http://collector:4318/v1/traces (extra 'otel')."),
    max_batch: Optional[int] = hidden_alias("--max-batch", "--batch-size"),
) -> None:
    """Serve rankings over HTTP(S): POST /v1/rank, Cohere/Jina /v1/rerank and /v2/rerank, KServe v2 /v2/models/NAME/infer; GET /v1/models /healthz /readyz /metrics /docs; API keys, TLS, traces; versioned repositories swapped live (POST /admin/reload, SIGHUP); Ctrl-C or SIGTERM drains."""
    import logging

    from hllm.runtime import Ranker
    from hllm.serve.app import ServeOptions, create_app
    from hllm.serve.batching import BatchOptions
    from hllm.serve.models import ServedModel, model_version
    from hllm.serve.server import bind_socket, run_server
    from hllm.serve.tls import tls_options
    from hllm.serve.tracing import JsonFormatter

    quiet_libraries()
    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.INFO), format="%(levelname)s %(name)s: %(message)s")
    if log_format == "json":
        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonFormatter())
    max_batch = pick(batch_size, max_batch, 8)
    if not 1 <= max_batch <= MAX_BATCH:
        raise typer.BadParameter(f"--batch-size must be within 1..{MAX_BATCH}, got {max_batch}")
    if no_batching:
        max_batch, max_wait_ms = 1, 0.0
    opts = ServeOptions(
        batch=BatchOptions(max_batch_slates=max_batch, max_wait_ms=max_wait_ms, max_queue=max_queue, deadline_ms=deadline_ms),
        max_body_bytes=max_body_bytes,
        max_slates_per_request=max_slates_per_request,
    )
    keys, auth, admin = _access(host, api_key, api_key_file, no_auth, public_metrics, public_docs, admin_api_key,
                                admin_api_key_file, allow_admin_without_key)
    tls = tls_options(ssl_certfile, ssl_keyfile)
    from hllm.runtime.artefact import resolve
    from hllm.serve.repository import VersionManager, is_repository

    names = tuple(served_model_name) or ServedModel().names
    versions = None
    if is_repository(model):  # REPO/1, REPO/2, ...: the highest version that resolves
        versions, ranker, served = VersionManager.open(model, ServedModel(names).names, threads=threads)
    else:
        art = resolve(model)  # a bad path fails before the server starts
        served = ServedModel(names, model_version(art.meta))
    tracer = None
    if otlp_endpoint is not None:
        from hllm.serve.tracing import otlp_tracer

        tracer = otlp_tracer(otlp_endpoint)
    sock = bind_socket(host, port)  # a port in use: `error:` and exit 2, before the engine is opened
    if versions is None:
        ranker = Ranker.from_path(art, threads=threads)
    info = {"model": str(model if versions is None else versions.records[versions.current].path)}
    application = create_app(ranker, opts, info=info, auth=auth, model=served, tracer=tracer, versions=versions,
                             admin=admin)
    console.print(
        f"serving {info['model']} ({', '.join(served.names)}, version {served.version}) on {'https' if tls else 'http'}://{host}:{port} "
        f"(max batch {opts.batch.max_batch_slates}, window {opts.batch.max_wait_ms} ms; "
        f"{f'{len(keys)} API key(s)' if keys else 'no API key'}); "
        "the engine loads in the background — GET /readyz says when it is ready"
    )
    try:
        run_server(application, host=host, port=port, log_level=log_level, graceful_timeout_s=graceful_timeout, sock=sock,
                   tls=tls)
    except (Terminated, KeyboardInterrupt) as e:  # uvicorn drained on the signal, then re-raised it on its way out
        _stopped(application.state.hllm, graceful_timeout, "SIGINT" if isinstance(e, KeyboardInterrupt) else "SIGTERM")


def _access(host, api_key, api_key_file, no_auth, public_metrics, public_docs, admin_api_key, admin_api_key_file,
            allow_admin_without_key):
    """``(keys, auth, admin)`` of ``hllm serve``'s key options (:mod:`hllm.serve.auth`, :mod:`hllm.serve.admin`).

    Raises: typer.BadParameter for keys with --no-auth, a non-loopback --host without a key (unless --no-auth),
        --allow-admin-without-key off loopback; HllmError (exit 2) for a bad key or key file, never echoing a key.
    """
    from hllm.serve.admin import ADMIN_ENV_VAR, AdminOptions, check_admin_keys
    from hllm.serve.auth import AuthOptions, load_api_keys
    from hllm.serve.server import is_loopback

    keys = load_api_keys(api_key, api_key_file)  # a bad key or key file: `error:` and exit 2 (never the key)
    if keys and no_auth:
        raise typer.BadParameter("--no-auth with API keys (--api-key, --api-key-file or $HLLM_API_KEYS): choose one")
    if not keys and not is_loopback(host):
        if not no_auth:
            raise typer.BadParameter(f"--host {host} is reachable from other machines and no API key is set: give "
                                     "--api-key-file / --api-key / $HLLM_API_KEYS, or --no-auth to serve it open")
        console.print(f"[yellow]warning:[/] binding {host} with --no-auth: anyone who reaches it can call the API")
    auth = AuthOptions(keys, public_metrics=public_metrics, public_docs=public_docs) if keys else None
    admin_keys = load_api_keys(admin_api_key, admin_api_key_file, env_var=ADMIN_ENV_VAR, option="--admin-api-key")
    check_admin_keys(admin_keys, keys)
    if allow_admin_without_key and not is_loopback(host):
        raise typer.BadParameter(f"--allow-admin-without-key with --host {host}: allowed on a loopback --host only; "
                                 "give --admin-api-key-file / --admin-api-key / $HLLM_ADMIN_API_KEYS")
    return keys, auth, AdminOptions(admin_keys, allow_admin_without_key)


def _stopped(state, graceful_timeout: float, raised: str = "SIGTERM") -> None:
    """After the server stopped on a signal (``raised``: the one re-raised on the way out; the app state's
    ``stop_signals``: those received, in order), say what happened to the accepted requests and exit:

    * SIGTERM alone: 0 when every accepted request was answered, 143 when the graceful timeout answered some
      503, or 143 with one ``error: terminated (SIGTERM) while starting …`` line when the engine never got ready;
    * any SIGINT: 130 with one ``error: interrupted (SIGINT) …`` line saying the same (drained, how many were
      answered 503, or still starting), or that a second SIGINT cut the graceful shutdown short.
    """
    signals = list(dict.fromkeys(state.stop_signals)) or [raised]
    unanswered = f"{state.shed} in-flight requests were answered 503 (Retry-After) instead of their rankings"
    if "SIGINT" in signals:
        if not state.served:
            signal_exit("interrupted (SIGINT) while starting: the engine was still loading")
        if state.forced:
            signal_exit(f"interrupted (SIGINT) again while draining after {signals[0]}: the graceful shutdown was "
                        f"cut short; {unanswered}")
        if not state.shed:
            signal_exit("interrupted (SIGINT): the server stopped; in-flight requests were drained")
        signal_exit(f"interrupted (SIGINT): the graceful timeout of {graceful_timeout:g} s expired; {unanswered}")
    if not state.served:  # stopped before the engine was ever ready: start-up interrupted
        signal_exit("terminated (SIGTERM) while starting: the engine was still loading", EXIT_SIGTERM)
    if not state.shed:  # every accepted request was answered: a clean stop, exit 0
        console.print("stopped (SIGTERM): in-flight requests were drained")
        return
    console.print(f"stopped (SIGTERM): the graceful timeout of {graceful_timeout:g} s expired; {unanswered}")
    raise typer.Exit(EXIT_SIGTERM) from None


@app.command("loadtest")
def loadtest_cmd(
    model: Optional[Path] = typer.Argument(None, help="Export dir / .onnx / .plan / checkpoint (served in-process, both modes)."),
    slates: Optional[Path] = slates_opt(),
    url: Optional[str] = typer.Option(None, help="Measure an already running server instead (loopback only, one mode)."),
    clients: int = typer.Option(4, min=1, max=256, help="Concurrent clients."),
    requests: int = typer.Option(40, min=1, max=1_000_000, help="Requests per mode (one slate each)."),
    max_seconds: float = typer.Option(300.0, min=0.1, max=86_400.0, help="No request starts after this many seconds (per mode, split over its rounds)."),
    limit: int = limit_opt(40, "Distinct slates to cycle through (the first LIMIT of --slates)."),
    n_items: Optional[int] = typer.Option(None, "--n-items", "-n", min=1, max=MAX_ITEMS, help="Cut every slate to N candidates (hllm.runtime.slates.subslate)."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", "-b", min=1, max=MAX_BATCH, help="Micro-batch size when batching is on (default: clients)."),
    max_wait_ms: float = typer.Option(20.0, min=0.0, max=60_000.0, help="Micro-batch window when batching is on."),
    rounds: int = typer.Option(2, min=1, max=1_000, help="Bursts per mode, alternating on/off/off/on… (fair under changing machine load)."),
    threads: Optional[int] = threads_opt(),
    note: Optional[str] = typer.Option(None, help="Free text stored in the JSON (e.g. that the cores were shared)."),
    route: str = choice_opt("rank", ("rank", "rerank", "both"), "--route",
                            help="Drive POST /v1/rank, /v1/rerank (same slates: documents = titles, history extension), or both in one run."),
    keys_and_tracing: bool = typer.Option(False, "--keys-and-tracing", help="Also measure a batching-on server with an API key (clients send it) and OpenTelemetry traces (spans batched to a discarding exporter; extra 'otel'), interleaved with the others."),
    out_path: Optional[Path] = out_opt(help="JSON report to write (atomic; '-' = stdout)."),
    json_out: bool = json_opt(),
    candidates: Optional[int] = hidden_alias("--candidates", "--n-items"),
    max_batch: Optional[int] = hidden_alias("--max-batch", "--batch-size"),
) -> None:
    """Load-test the server on loopback: throughput, p50/p90/p99, errors — micro-batching on vs off (and /v1/rank vs /v1/rerank) in one run."""
    from hllm.bench.loadtest import loadtest_report
    from hllm.runtime.artefact import resolve

    quiet_libraries()
    n_items, batch_size = pick(n_items, candidates), pick(batch_size, max_batch)
    if (n_items is not None and not 1 <= n_items <= MAX_ITEMS) or (batch_size is not None and not 1 <= batch_size <= MAX_BATCH):
        raise typer.BadParameter(f"--n-items must be within 1..{MAX_ITEMS} and --batch-size within 1..{MAX_BATCH}")
    if (model is None) == (url is None):
        raise typer.BadParameter("give either MODEL (in-process, both modes) or --url (one running server)")
    check_output_file(out_path)
    data_to_stdout(json_out, out_path)
    if model is not None:
        resolve(model)
    data = load_slates(slates, limit=limit)
    report = loadtest_report(model, url, data, clients, requests, max_seconds, n_items, batch_size, max_wait_ms,
                             threads, rounds, note, slates_source(slates), log=lambda m: console.print(m),
                             routes=("rank", "rerank") if route == "both" else (route,), keys_and_tracing=keys_and_tracing)
    finish_report(out_path, report, json_out, show=_print_table)


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
    cost = report["modes"].get("keys_and_tracing")
    if cost:
        mw = cost["middleware_us_per_request"]
        out.print(f"keys + traces: the middleware adds {mw['added_us']} µs per request "
                  f"({mw['plain_us']} → {mw['keys_and_tracing_us']} µs, in-process)")
        for name, r in cost.items():
            if name.endswith("_vs_batching_on") and r["p50_ratio"]:
                p, t = r["p50_ratio"], r["throughput_ratio"]
                out.print(f"{name}: p50 × {p['median']} (95% {p['ci95'][0]}–{p['ci95'][1]}), throughput × "
                          f"{t['median']} (95% {t['ci95'][0]}–{t['ci95'][1]}) over {r['rounds']} paired rounds")


@app.command("triton-repo")
def triton_repo_cmd(
    model: Path = typer.Argument(..., help="Export dir / .onnx (ONNX Runtime backend) or TensorRT .plan."),
    out_dir: Path = typer.Argument(..., help="Repository to write (refused if it exists, unless --overwrite)."),
    batch_size: int = typer.Option(8, "--batch-size", "-b", min=1, max=MAX_BATCH, help="Triton max_batch_size of every model (slates per request)."),
    max_queue_delay_us: int = typer.Option(2000, min=0, max=10_000_000, help="Dynamic batching window of the engine model (µs)."),
    instances: int = typer.Option(1, min=1, max=64, help="Engine model instances."),
    instance_kind: Optional[str] = choice_opt(None, ("gpu", "cpu"), "--instance-kind", help="Engine instance kind (Triton instance_group kind); default cpu for an ort-cpu export, gpu for a standard / FP16 export or a TensorRT plan."),
    preprocess_instances: int = typer.Option(2, min=1, max=64, help="CPU instances of the preprocessing (tokenization) model."),
    decode_instances: int = typer.Option(2, min=1, max=64, help="CPU instances of the LAPJV decode model."),
    seq_bucket: int = typer.Option(64, min=1, max=4096, help="Prompts are right-padded to a multiple of this many tokens (equal shapes batch)."),
    bundle_deps: bool = typer.Option(False, "--bundle-deps", help="Unpack the tokenizers and lap wheels into the repository (pip, needs PyPI or PIP_FIND_LINKS): runs on a stock Triton image."),
    bundle_python: str = typer.Option("3.12", help="Python version of the Triton image's Python backend (for --bundle-deps)."),
    bundle_arch: str = choice_opt("x86_64", ("x86_64", "aarch64"), "--bundle-arch", help="CPU architecture of the Triton image (for --bundle-deps)."),
    overwrite: bool = overwrite_opt("OUT_DIR"),
    json_out: bool = json_opt(),
    max_batch_size: Optional[int] = hidden_alias("--max-batch-size", "--batch-size"),
    kind: Optional[str] = hidden_alias("--kind", "--instance-kind"),
) -> None:
    """Write a Triton model repository: preprocessing + engine (ONNX / TensorRT) + LAPJV decode, as one ensemble (slates in, rankings out)."""
    from hllm.serve.triton.repo import write_repository

    quiet_libraries()
    max_batch_size = pick(batch_size, max_batch_size, 8)
    kind = pick(instance_kind, kind, None)
    if not 1 <= max_batch_size <= MAX_BATCH or kind not in ("gpu", "cpu", None):
        raise typer.BadParameter(f"--batch-size must be within 1..{MAX_BATCH} and --instance-kind gpu or cpu")
    check_output_dir(out_dir, overwrite, "OUT_DIR")
    data_to_stdout(json_out)
    res = write_repository(
        model, out_dir, max_batch_size=max_batch_size, max_queue_delay_us=max_queue_delay_us,
        instances=instances, kind=kind, decode_instances=decode_instances, preprocess_instances=preprocess_instances,
        seq_bucket=seq_bucket, bundle_deps=bundle_deps, bundle_python=bundle_python, bundle_arch=bundle_arch, overwrite=overwrite,
    )
    for name in res["models"]:
        out.print(f"  {out_dir}/models/{name}/config.pbtxt")
    out.print(f"engine instances: KIND_{res['instance_kind'].upper()}")
    for note in res["notes"]:
        console.print(f"[yellow]note:[/] {note}")
    if res["bundled"]:
        out.print(f"shipped for Python {bundle_python} {bundle_arch}: {', '.join(p for v in res['bundled'].values() for p in v)}")
    else:
        console.print("[yellow]note:[/] tokenizers and lap are not shipped: the Triton image needs them, or rerun with --bundle-deps")
    out.print(f"Triton repository → {out_dir} (tritonserver --model-repository {out_dir}/models); client: {out_dir}/client/rank.py; see {out_dir}/README.md")
    if json_out:
        emit_json({"command": "triton-repo", "out_dir": str(out_dir), "max_batch_size": max_batch_size, **res})
