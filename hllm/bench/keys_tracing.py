"""What API keys and traces cost a request: the loaded servers side by side, and the middleware alone.

Two measures of the same cost (``hllm loadtest --keys-and-tracing``):

* :func:`paired_ratios` — the keyed + traced server against the plain one under load, round by round.
  The modes' bursts alternate (:func:`hllm.bench.loadtest.compare_batching`), so each round's pair ran
  under the same conditions; the ratio of their medians (p50 latency) and throughputs per round, the median of
  those ratios and its bootstrap 95 % interval over rounds separate the cost from the drift of a shared machine.
* :func:`middleware_cost` — the ASGI stack alone (:class:`hllm.serve.auth.ApiKeyMiddleware` +
  :class:`hllm.serve.tracing.TelemetryMiddleware` with spans) around an endpoint that answers at once, timed
  in-process with and without key and tracer: the microseconds added per request, free of the engine's and the
  batcher's noise (warm-up calls first, the median of ``repeats`` timed batches).

Sources: OpenTelemetry Python SDK (``BatchSpanProcessor``); ASGI specification (asgi.readthedocs.io).
"""

from __future__ import annotations

import asyncio
import time
from typing import Sequence

import numpy as np


def _round_figures(burst: dict) -> tuple[float, float] | None:
    """(median latency ms, throughput req/s) of one burst (:func:`hllm.bench.loadtest._send_all`'s), None if empty."""
    if not burst["lat"] or burst["wall"] <= 0:
        return None
    return float(np.median(burst["lat"])), len(burst["lat"]) / burst["wall"]


def paired_ratios(plain: Sequence[dict], secured: Sequence[dict], seed: int = 0, draws: int = 2000) -> dict:
    """Per-round ratios secured / plain of p50 latency and of throughput.

    Args:
        plain / secured: the two modes' bursts, one per round, in round order (the same rounds).
        seed / draws: the bootstrap over rounds (resampled with replacement).
    Returns: ``{"rounds", "p50_ratio": {"median", "ci95", "per_round"}, "throughput_ratio": {…}}``; a ratio of
        1.02 means 2 % more (slower p50, or more requests per second). Rounds where either mode had no
        successful request are left out (``rounds`` counts those kept).
    """
    pairs = [(a, b) for a, b in ((_round_figures(p), _round_figures(s)) for p, s in zip(plain, secured)) if a and b]
    rng = np.random.default_rng(seed)
    out: dict = {"rounds": len(pairs)}
    for key, i in (("p50_ratio", 0), ("throughput_ratio", 1)):
        r = np.array([b[i] / a[i] for a, b in pairs])
        if not len(r):
            out[key] = None
            continue
        boot = np.median(r[rng.integers(0, len(r), size=(draws, len(r)))], axis=1)
        out[key] = {"median": round(float(np.median(r)), 4),
                    "ci95": [round(float(np.quantile(boot, 0.025)), 4), round(float(np.quantile(boot, 0.975)), 4)],
                    "per_round": [round(float(x), 4) for x in r]}
    return out


async def _answer(scope, receive, send) -> None:
    """An endpoint that ranked one 8-document slate in no time (what the middleware sees of a real one)."""
    from hllm.serve.tracing import observe_request

    observe_request([{"candidates": [None] * 8}], {"validate_ms": 0.3, "queue_ms": 0.5, "prompt_ms": 1.0,
                                                  "engine_ms": 8.0, "decode_ms": 0.5, "total_ms": 10.3,
                                                  "batch_id": 1, "batch_slates": 1}, model_version="1")
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b"{}"})


def middleware_cost(key: bytes, tracer, calls: int = 2000, repeats: int = 5, warmup: int = 500) -> dict:
    """Microseconds per request of the serving middleware, plain and with ``key`` required and ``tracer``'s spans.

    Args:
        key: the API key the requests carry. tracer: an OpenTelemetry tracer (e.g. ``discarding_tracer()``).
        calls: requests per timed batch. repeats: timed batches (the median is reported). warmup: untimed calls.
    Returns: ``{"plain_us", "keys_and_tracing_us", "added_us", "calls", "repeats"}`` (µs per request).
    """
    from hllm.serve.auth import ApiKeyMiddleware, AuthOptions
    from hllm.serve.tracing import TelemetryMiddleware

    plain = TelemetryMiddleware(_answer, tracer=None, model_version="1", access=False)
    secured = ApiKeyMiddleware(TelemetryMiddleware(_answer, tracer=tracer, model_version="1", access=False),
                               auth=AuthOptions((key,)))
    scope = {"type": "http", "path": "/v1/rank", "method": "POST", "state": {"request_id": "r"},
             "headers": [(b"authorization", b"Bearer " + key), (b"content-type", b"application/json")]}

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(_message):
        return None

    async def per_call_us(app, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            await app(dict(scope), receive, send)
        return (time.perf_counter() - t0) / n * 1e6

    async def run() -> tuple[float, float]:
        await per_call_us(plain, warmup)
        await per_call_us(secured, warmup)
        a, b = [], []
        for _ in range(repeats):  # interleaved, so drift hits both
            a.append(await per_call_us(plain, calls))
            b.append(await per_call_us(secured, calls))
        return float(np.median(a)), float(np.median(b))

    p, s = asyncio.run(run())
    return {"plain_us": round(p, 1), "keys_and_tracing_us": round(s, 1), "added_us": round(s - p, 1),
            "calls": calls, "repeats": repeats}
