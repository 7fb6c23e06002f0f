"""The Ranker as a Ray Serve deployment: replicas, ``@serve.batch`` micro-batching, the API of ``hllm serve``.

    import ray
    from ray import serve
    from hllm.serve.ray_serve import ranker_app

    serve.run(ranker_app("export/", num_replicas=2), route_prefix="/")
    # POST http://127.0.0.1:8000/v1/rank  {"slates": [...]}  → {"request_id", "rankings", "timing"}

Each replica holds ONE engine (:class:`hllm.runtime.Ranker`, activated and warmed up in the
constructor). ``POST /v1/rank`` takes the bodies of ``hllm serve`` (``{"slates": [...], "deadline_ms"?}``,
one slate object, a JSON list, or ``application/x-ndjson``), parsed and checked by the same
:func:`hllm.serve.app.parse_rank_body` and encoded once at admission, and answers the same
``{"request_id", "rankings": [Ranking.to_dict()], "timing": {...}}`` body (:mod:`hllm.serve.schemas`)
and the same ``{"error": {"kind", "message", "id"}}`` errors (413, 415, 400, 422). ``GET /healthz`` and
``GET /readyz`` answer 200 once the replica is up. Requests that reach a replica within
``batch_wait_timeout_s`` are merged by ``@serve.batch`` (at most ``max_batch_requests`` requests) and
ranked in engine calls of at most ``max_batch_slates`` slates, off the event loop. Ray Serve routes
requests across ``num_replicas`` replicas. ``deadline_ms`` is accepted and not enforced (Ray Serve's
own ``request_timeout_s`` in its HTTP options bounds a request).

Needs ``pip install 'hllm[ray]'``; imports neither torch nor transformers.
Ray Serve: https://docs.ray.io/en/latest/serve/advanced-guides/dyn-req-batch.html
"""

from __future__ import annotations

import asyncio
import time
import uuid

from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse

from hllm.runtime.ranker import Ranker, StageTimes
from hllm.serve.app import ApiError, _encode, _error_response, parse_rank_body, warmup_slate


class RankerDeployment:
    """One replica: an engine behind ``POST /v1/rank`` (see module doc). Deploy with :func:`ranker_app`."""

    def __init__(self, model: str, threads: int | None = None, max_batch_slates: int = 8,
                 max_slates_per_request: int = 32, max_body_bytes: int = 4 * 1024 * 1024):
        self.ranker = Ranker.from_path(model, threads=threads)
        self.ranker.engine.activate()
        self.ranker.rank_batch([warmup_slate(self.ranker.engine.num_positions)])
        self.max_batch_slates = max_batch_slates
        self.max_slates_per_request = max_slates_per_request
        self.max_body_bytes = max_body_bytes
        self.batches = 0

    def _rank(self, slates: list[dict], encoded: list) -> tuple[list, StageTimes]:
        """Rank in engine calls of at most ``max_batch_slates`` slates; summed stage times."""
        res = self.ranker.rank(slates, encoded=encoded, batch_size=self.max_batch_slates)
        return res.rankings, res.times

    async def rank_requests(self, requests: list[tuple[list[dict], list, float]]) -> list[tuple[list[dict], dict]]:
        """Micro-batch (wrapped by ``@serve.batch`` in :func:`ranker_app`): rank every request's slates together."""
        start = time.perf_counter()
        self.batches += 1
        batch_id = self.batches
        slates = [s for req, _, _ in requests for s in req]
        encoded = [e for _, enc, _ in requests for e in enc]
        rankings, times = await asyncio.to_thread(self._rank, slates, encoded)
        out, i = [], 0
        for req, _, enqueued in requests:
            mine = rankings[i : i + len(req)]
            i += len(req)
            out.append(([r.to_dict() for r in mine], {
                "queue_ms": round((start - enqueued) * 1e3, 3),
                "prompt_ms": round(times.prompt_ms, 3),
                "engine_ms": round(times.engine_ms, 3),
                "decode_ms": round(times.decode_ms, 3),
                "batch_id": batch_id,
                "batch_slates": len(slates),
                "batch_requests": len(requests),
            }))
        return out

    async def __call__(self, request: Request):
        path = request.url.path.rstrip("/")
        if request.method == "GET" and path in ("/healthz", "/readyz"):
            return JSONResponse({"status": "ready", "engine": self.ranker.engine.name, "num_positions": self.ranker.engine.num_positions})
        if request.method != "POST" or path != "/v1/rank":
            return _error_response(ApiError(404, "not_found", f"{request.method} {path or '/'}: use POST /v1/rank"))
        t0 = time.perf_counter()
        try:
            body = await request.body()
            if len(body) > self.max_body_bytes:
                raise ApiError(413, "too_large", f"body of {len(body)} bytes is over the limit of {self.max_body_bytes} bytes")
            slates, _deadline = parse_rank_body(body, request.headers.get("content-type", ""), self.max_slates_per_request)
            encoded = await asyncio.to_thread(_encode, self.ranker.builder, slates)
        except ApiError as e:
            return _error_response(e)
        t1 = time.perf_counter()
        rankings, timing = await self.batched(slates, encoded, t1)
        t2 = time.perf_counter()
        timing = {"validate_ms": round((t1 - t0) * 1e3, 3), **timing, "total_ms": round((t2 - t0) * 1e3, 3)}
        return JSONResponse({"request_id": uuid.uuid4().hex[:12], "rankings": rankings, "timing": timing})


def ranker_app(model: str, num_replicas: int = 1, max_batch_requests: int = 8, batch_wait_timeout_s: float = 0.005,
               threads: int | None = 1, max_batch_slates: int = 8, max_slates_per_request: int = 32,
               ray_actor_options: dict | None = None):
    """A bound Ray Serve application of ``num_replicas`` :class:`RankerDeployment` replicas for ``model``.

    ``max_batch_requests`` / ``batch_wait_timeout_s`` configure ``@serve.batch``; ``threads`` is each
    replica's engine intra-op threads; ``ray_actor_options`` defaults to one CPU per replica.
    """
    micro_batch = serve.batch(max_batch_size=max_batch_requests, batch_wait_timeout_s=batch_wait_timeout_s)

    class Replica(RankerDeployment):
        @micro_batch
        async def batched(self, slates: list[dict], encoded: list, enqueued: float):
            return await self.rank_requests(list(zip(slates, encoded, enqueued)))

    Replica.__name__ = Replica.__qualname__ = "HllmRanker"
    deployment = serve.deployment(name="HllmRanker", num_replicas=num_replicas,
                                  ray_actor_options=ray_actor_options or {"num_cpus": 1})(Replica)
    return deployment.bind(model, threads=threads, max_batch_slates=max_batch_slates, max_slates_per_request=max_slates_per_request)
