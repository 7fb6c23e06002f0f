"""A bounded load test of ``hllm serve`` on loopback: concurrent clients sending real slates.

:func:`run_load` drives one server URL with ``clients`` concurrent HTTP clients (``httpx.AsyncClient``),
one slate per request, at most ``requests`` requests and ``max_seconds`` seconds (no request starts
after that), and reports throughput, median/p90/p99 latency and errors. :func:`compare_batching`
starts in-process servers on ``127.0.0.1`` (micro-batching on and off, for each route) over ONE
:class:`hllm.runtime.Ranker` and alternates bursts between them, so every mode is measured in one
run on the same engine and slates; it also reports whether the modes gave identical rankings.

Routes (:data:`ROUTES`): ``rank`` sends ``POST /v1/rank {"slates": [slate]}``; ``rerank`` sends the same
slate as ``POST /v1/rerank`` (:mod:`hllm.serve.rerank`): ``documents`` = the candidate titles, the hllm
``history`` extension = the slate's history (so the prompt, and the ranking, are those of ``/v1/rank``),
``query`` = its most recent history item, ``return_documents`` false.

With ``keys_and_tracing`` :func:`compare_batching` adds, per route, the mode ``batching_on_keys_traced``
(``rerank_batching_on_keys_traced``): micro-batching on as ``batching_on``, the app built with an API key
(:mod:`hllm.serve.auth`; the clients send ``Authorization: Bearer``) and an OpenTelemetry tracer whose spans
go through the SDK's ``BatchSpanProcessor`` to an exporter that drops them (:func:`discarding_tracer`:
the server's span work without a collector), so the cost of keys and traces is measured beside the plain mode;
the result's ``keys_and_tracing`` holds the round-by-round ratios and the middleware's own µs per request
(:mod:`hllm.bench.keys_tracing`).
"""

from __future__ import annotations

import asyncio
import os
import platform
import secrets
import time
from typing import Sequence
from urllib.parse import urlsplit

import numpy as np

from hllm.formats.provenance import library_versions
from hllm.formats.report import envelope
from hllm.measure import describe_machine, summarize
from hllm.errors import HllmError
from hllm.runtime import Ranker
from hllm.runtime.slates import subslate
from hllm.serve.batching import BatchOptions

#: The routes the load test can drive.
ROUTES = ("rank", "rerank")


def request_for(route: str, slate: dict) -> tuple[str, dict]:
    """The path and JSON body of one request carrying ``slate`` on ``route`` (module doc)."""
    if route == "rank":
        return "/v1/rank", {"slates": [slate]}
    if route == "rerank":
        history = list(slate.get("history") or [])
        return "/v1/rerank", {"query": history[-1] if history else "", "history": history, "return_documents": False,
                              "documents": [c["title"] for c in slate["candidates"]]}
    raise HllmError(f"unknown route {route!r} (choose from {', '.join(ROUTES)})")


def _order_and_timing(route: str, body: dict) -> tuple[list, dict]:
    """The ranking order and the server timing of a 200 response on ``route``."""
    if route == "rank":
        return body["rankings"][0]["order"], body["timing"]
    return [r["index"] for r in body["results"]], body["timing"]


def check_loopback_url(url: str) -> None:
    """Raise HllmError unless ``url`` points at a loopback host (127.0.0.0/8, ::1, localhost)."""
    from hllm.serve.server import is_loopback

    host = urlsplit(url).hostname or ""
    if not is_loopback(host):
        raise HllmError(f"the load test targets loopback only (127.0.0.1, ::1, localhost), not {host!r}")


def discarding_tracer():
    """An OpenTelemetry tracer (own provider) whose spans are batched (``BatchSpanProcessor``, as
    :func:`hllm.serve.tracing.otlp_tracer`) to an exporter that drops them.

    Raises: MissingExtraError naming the ``otel`` extra when opentelemetry is not installed.
    """
    from hllm.extras import require

    trace_sdk = require("opentelemetry.sdk.trace")
    export = require("opentelemetry.sdk.trace.export")

    class Discard(export.SpanExporter):
        def export(self, spans):
            return export.SpanExportResult.SUCCESS

    provider = trace_sdk.TracerProvider()
    provider.add_span_processor(export.BatchSpanProcessor(Discard()))
    return provider.get_tracer("hllm.loadtest")


def _send_all(url: str, slates: Sequence[dict], clients: int, requests: int, max_seconds: float, timeout_s: float, offset: int = 0,
              route: str = "rank", headers: dict | None = None) -> dict:
    """Raw samples of one bounded burst: latencies (ms), errors, orders, server timings, wall time.
    ``headers``: sent with every request (``Authorization``)."""
    import httpx

    lat, errors, orders, timings = [], {}, {}, []
    sent = 0

    async def client(http: httpx.AsyncClient, t_end: float) -> None:
        nonlocal sent
        while sent < requests and time.perf_counter() < t_end:
            i = offset + sent
            sent += 1
            path, body = request_for(route, slates[i % len(slates)])
            t0 = time.perf_counter()
            try:
                r = await http.post(f"{url}{path}", json=body)
            except httpx.HTTPError as e:
                errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
                continue
            dt = (time.perf_counter() - t0) * 1e3
            if r.status_code != 200:
                errors[str(r.status_code)] = errors.get(str(r.status_code), 0) + 1
                continue
            try:
                order, timing = _order_and_timing(route, r.json())
            except (ValueError, KeyError, IndexError, TypeError):
                raise HllmError(f"{url}{path} answered {r.status_code} with a body that is not an hllm ranking "
                                f"response ({r.headers.get('content-type', 'no content type')}): is it an hllm server?") from None
            lat.append(dt)
            orders[i] = order
            timings.append(timing)

    async def main() -> float:
        limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
        async with httpx.AsyncClient(timeout=timeout_s, limits=limits, headers=headers) as http:
            t0 = time.perf_counter()
            await asyncio.gather(*(client(http, t0 + max_seconds) for _ in range(clients)))
            return time.perf_counter() - t0

    wall = asyncio.run(main())
    return {"sent": sent, "lat": lat, "errors": errors, "orders": orders, "timings": timings, "wall": wall}


def _summary(samples: Sequence[dict]) -> dict:
    """Merge raw bursts into the reported figures (throughput over the bursts' summed wall time)."""
    lat = [x for s in samples for x in s["lat"]]
    timings = [t for s in samples for t in s["timings"]]
    errors: dict = {}
    for s in samples:
        for k, v in s["errors"].items():
            errors[k] = errors.get(k, 0) + v
    wall = sum(s["wall"] for s in samples)
    mean = lambda k: round(float(np.mean([t[k] for t in timings])), 1) if timings else None  # noqa: E731
    sizes = [t["batch_slates"] for t in timings]
    u, c = np.unique(sizes, return_counts=True) if sizes else ([], [])
    orders = {}
    for s in samples:
        orders.update(s["orders"])
    return {
        "requests": sum(s["sent"] for s in samples),
        "ok": len(lat),
        "errors": sum(errors.values()),
        "errors_by_kind": errors,
        "wall_s": round(wall, 2),
        "throughput_rps": round(len(lat) / wall, 3) if wall > 0 else None,
        "latency_ms": summarize(lat, digits=1) if lat else None,
        "server_mean_ms": {k: mean(k) for k in ("queue_ms", "prompt_ms", "engine_ms", "decode_ms", "total_ms")},
        "batch_slates_seen": {str(int(a)): int(b) for a, b in zip(u, c)},
        "orders": orders,
    }


def run_load(url: str, slates: Sequence[dict], clients: int, requests: int, max_seconds: float, timeout_s: float = 600.0,
             route: str = "rank") -> dict:
    """Send ``requests`` single-slate requests from ``clients`` concurrent clients to ``{url}/v1/rank`` (or, with
    ``route="rerank"``, ``{url}/v1/rerank``; module doc).

    Request i carries ``slates[i % len(slates)]``; no request starts after ``max_seconds``. Latency is
    client-side wall time per request (ms). Returns: requests, ok, errors (by HTTP status or transport
    error), wall_s, throughput_rps, latency_ms (:func:`hllm.measure.summarize` of successful requests: median/p90/p99/mean/min/max), the
    server's mean stage times, the batch sizes the server reported, and ``orders`` (request index →
    ranking order) for comparisons.
    Raises: HllmError for a non-loopback URL or bad bounds.
    """
    check_loopback_url(url)
    if clients < 1 or requests < 1 or max_seconds <= 0:
        raise HllmError("clients and requests must be ≥ 1 and max_seconds > 0")
    if not slates:
        raise HllmError("no slates to send")
    request_for(route, {"candidates": []})  # an unknown route fails before any request
    return _summary([_send_all(url, slates, clients, requests, max_seconds, timeout_s, route=route)])


def compare_batching(
    model: str | os.PathLike,
    slates: Sequence[dict],
    clients: int = 4,
    requests: int = 40,
    max_seconds: float = 600.0,
    max_batch: int | None = None,
    max_wait_ms: float = 20.0,
    threads: int | None = None,
    rounds: int = 2,
    ranker=None,
    log=print,
    routes: Sequence[str] = ("rank",),
    keys_and_tracing: bool = False,
) -> dict:
    """Measure the same load with micro-batching on and off (for each of ``routes``) in one run, interleaved.

    One in-process server per mode on ``127.0.0.1``, all over ONE :class:`hllm.runtime.Ranker` (one engine);
    the ``requests`` of each mode are sent in ``rounds`` bursts that alternate between the modes
    (on, off, off, on, …) so that a change of machine load during the run hits every mode alike.
    Only one mode has traffic at a time. Modes: ``batching_on`` / ``batching_off`` for route ``rank``,
    ``rerank_batching_on`` / ``rerank_batching_off`` for ``rerank`` (module doc).

    Args:
        model: export dir / ``.onnx`` / ``.plan`` / checkpoint, opened once with :meth:`Ranker.from_path`.
        slates: the slates to send (one per request); both modes send the same slates in the same order.
        clients, requests, max_seconds: per mode; ``max_seconds`` is split evenly over its bursts.
        max_batch: slates per engine batch when batching is on (default ``clients``).
        max_wait_ms: micro-batch window when batching is on.
        threads: engine intra-op threads.
        rounds: bursts per mode.
        ranker: an existing Ranker (tests); overrides ``model``.
        routes: the routes to drive (:data:`ROUTES`), each in both batching modes.
        keys_and_tracing: add the ``batching_on_keys_traced`` mode per route (module doc; needs the ``otel`` extra).
    Returns: a JSON-ready dict with one entry per mode and the agreement of their rankings (every mode's
    against the first mode's, request by request).
    Raises: HllmError for bad rounds or an unknown route.
    """
    import contextlib

    from hllm.serve.app import ServeOptions, create_app
    from hllm.serve.auth import AuthOptions
    from hllm.serve.server import BackgroundServer, wait_ready

    if rounds < 1 or requests < rounds:
        raise HllmError(f"need 1 ≤ rounds ≤ requests, got rounds={rounds}, requests={requests}")
    if not routes or any(r not in ROUTES for r in routes):
        raise HllmError(f"routes must be some of {', '.join(ROUTES)}, got {list(routes)}")
    ranker = ranker or Ranker.from_path(model, threads=threads)
    max_batch = max_batch or clients
    q = max(64, clients * 2)
    dl = max_seconds * 1e3
    batching = {
        "batching_on": BatchOptions(max_batch_slates=max_batch, max_wait_ms=max_wait_ms, max_queue=q, deadline_ms=dl),
        "batching_off": BatchOptions(max_batch_slates=1, max_wait_ms=0.0, max_queue=q, deadline_ms=dl),
    }
    if keys_and_tracing:
        batching["batching_on_keys_traced"] = batching["batching_on"]
    modes, route_of = {}, {}
    for route in routes:
        for name, o in batching.items():
            full = ("" if route == "rank" else f"{route}_") + name
            modes[full], route_of[full] = o, route
    key = f"hk-loadtest-{secrets.token_hex(16)}"  # this run's only key: never printed or stored
    secured = {name for name in modes if name.endswith("_keys_traced")}
    tracer = discarding_tracer() if secured else None
    apps = {name: create_app(ranker, ServeOptions(batch=o), auth=AuthOptions((key.encode(),)) if name in secured else None,
                             tracer=tracer if name in secured else None) for name, o in modes.items()}
    headers = {name: {"Authorization": f"Bearer {key}"} if name in secured else None for name in modes}
    samples: dict = {name: [] for name in modes}
    load_s: dict = {}
    with contextlib.ExitStack() as stack:
        servers = {}
        for name, app in apps.items():
            srv = servers[name] = stack.enter_context(BackgroundServer(app))
            t0 = time.perf_counter()
            wait_ready(srv.url, timeout_s=900)
            load_s[name] = round(time.perf_counter() - t0, 1)
            log(f"{name}: ready on {srv.url} in {load_s[name]} s (max_batch={modes[name].max_batch_slates}, max_wait_ms={modes[name].max_wait_ms})")
        per = [requests // rounds + (1 if r < requests % rounds else 0) for r in range(rounds)]
        names = list(modes)
        offset = 0
        for r in range(rounds):
            order = names if r % 2 == 0 else names[::-1]
            for name in order:
                s = _send_all(servers[name].url, slates, clients, per[r], max_seconds / rounds, 600.0, offset, route_of[name],
                              headers[name])
                samples[name].append(s)
                log(f"round {r + 1}/{rounds} {name}: {len(s['lat'])}/{s['sent']} ok in {s['wall']:.1f} s")
            offset += per[r]
    out = _mode_results(modes, samples, apps, load_s, ranker, rounds, log, route_of)
    if secured:
        out["keys_and_tracing"] = _keys_and_tracing_cost(samples, secured, key, tracer, log)
    return out


def _keys_and_tracing_cost(samples: dict, secured: set, key: str, tracer, log) -> dict:
    """Per route, the keyed + traced mode against ``batching_on`` round by round
    (:func:`hllm.bench.keys_tracing.paired_ratios`), and the middleware's own cost per request
    (:func:`hllm.bench.keys_tracing.middleware_cost`)."""
    from hllm.bench.keys_tracing import middleware_cost, paired_ratios

    cost: dict = {"middleware_us_per_request": middleware_cost(key.encode(), tracer)}
    for name in sorted(secured):
        plain = name.removesuffix("_keys_traced")
        cost[f"{name}_vs_{plain}"] = r = paired_ratios(samples[plain], samples[name])
        fmt = lambda d: "-" if d is None else f"{d['median']:.3f} [{d['ci95'][0]:.3f}, {d['ci95'][1]:.3f}]"  # noqa: E731
        log(f"{name} / {plain} over {r['rounds']} rounds: p50 × {fmt(r['p50_ratio'])}, "
            f"throughput × {fmt(r['throughput_ratio'])}")
    m = cost["middleware_us_per_request"]
    log(f"middleware per request: {m['plain_us']} µs plain, {m['keys_and_tracing_us']} µs with key + spans")
    return cost


def _mode_results(modes: dict, samples: dict, apps: dict, load_s: dict, ranker, rounds: int, log, route_of: dict) -> dict:
    """Per mode: the load summary, its route, options and engine batches; plus whether the modes ranked alike."""
    out: dict = {}
    for name in modes:
        res = _summary(samples[name])
        o = modes[name]
        res["route"] = {"rank": "/v1/rank", "rerank": "/v1/rerank"}[route_of[name]]
        res["options"] = {"max_batch_slates": o.max_batch_slates, "max_wait_ms": o.max_wait_ms, "max_queue": o.max_queue,
                          "api_key": name.endswith("_keys_traced"), "tracing": name.endswith("_keys_traced")}
        res["load_and_warmup_s"] = load_s[name]
        res["engine_batches"] = apps[name].state.hllm.batcher.stats.batches  # the warm-up is not counted
        res["engine"] = ranker.engine.name
        res["rounds"] = rounds
        out[name] = res
        log(f"{name}: {res['ok']}/{res['requests']} ok, {res['throughput_rps']} req/s, median {(res['latency_ms'] or {}).get('median')} ms")
    names = list(modes)
    orders = {name: out[name].pop("orders") for name in names}
    first = orders[names[0]]
    compared = identical = 0
    for name in names[1:]:
        common = sorted(set(first) & set(orders[name]))
        compared += len(common)
        identical += sum(first[i] == orders[name][i] for i in common)
    out["rankings_identical_across_modes"] = {"compared": compared, "identical": identical}
    return out


def environment() -> dict:
    """Hardware (CPU model and flags, cores, memory, load: :func:`hllm.measure.describe_machine`) and library
    versions for the result JSON."""
    host = {k: v for k, v in describe_machine().items() if k not in ("shared", "note")}
    return {**host, "cpu_count": os.cpu_count(), "arch": platform.machine(), "versions": library_versions()}


def loadtest_report(model, url: str | None, slates: Sequence[dict], clients: int, requests: int, max_seconds: float,
                    candidates: int | None = None, max_batch: int | None = None, max_wait_ms: float = 20.0,
                    threads: int | None = None, rounds: int = 2, note: str | None = None, slates_file: str = "",
                    log=print, routes: Sequence[str] = ("rank",), keys_and_tracing: bool = False) -> dict:
    """The ``hllm loadtest`` report: ``model`` served in-process in both modes (:func:`compare_batching`),
    or one running server at ``url`` (:func:`run_load`). ``candidates`` cuts every slate to a sub-slate
    (:func:`hllm.runtime.slates.subslate`, labels dropped). ``routes``: :data:`ROUTES` to drive (module doc);
    against ``url`` each route is one mode (``as_running``, ``rerank_as_running``). ``keys_and_tracing``:
    in-process only, :func:`compare_batching`'s.

    Raises: HllmError (both or neither of model/url, candidates < 1, a non-loopback url, an unknown route).
    """
    if (model is None) == (url is None):
        raise HllmError("give either MODEL (in-process, both modes) or --url (one running server)")
    if keys_and_tracing and url is not None:
        raise HllmError("--keys-and-tracing builds the servers in-process: give MODEL, not --url")
    if candidates is not None:
        if candidates < 1:
            raise HllmError("--candidates must be ≥ 1")
        slates = [{k: v for k, v in subslate(s, min(candidates, len(s["candidates"]))).items() if k != "labels"}
                  for s in slates]
    report: dict = envelope("loadtest", {
        "slates_file": slates_file,
        "distinct_slates": len(slates), "candidates_per_slate": sorted({len(s["candidates"]) for s in slates}),
        "clients": clients, "requests_per_mode": requests, "max_seconds_per_mode": max_seconds,
        "latency": "client-side wall time per request over loopback HTTP, ms", "environment": environment(),
        "note": note,
    }, note=note)
    t0 = time.perf_counter()
    if url is not None:
        modes = {}
        for route in routes:
            res = run_load(url.rstrip("/"), slates, clients, requests, max_seconds, route=route)
            res.pop("orders")
            modes[("" if route == "rank" else f"{route}_") + "as_running"] = res
        report.update(url=url, modes=modes)
    else:
        report["model"] = str(model)
        report["modes"] = compare_batching(model, slates, clients, requests, max_seconds, max_batch, max_wait_ms,
                                           threads, rounds=rounds, log=log, routes=routes, keys_and_tracing=keys_and_tracing)
    report["seconds"] = round(time.perf_counter() - t0, 1)
    return report
