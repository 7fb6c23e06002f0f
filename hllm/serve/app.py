"""The ranking HTTP API (FastAPI on Starlette, served by uvicorn) over one :class:`hllm.runtime.Ranker`.

Endpoints:

* ``POST /v1/rank`` — one or more slates (JSON ``{"slates": [...]}``, one slate object, a JSON list,
  or an ``application/x-ndjson`` body of JSONL slates) → ``{"request_id", "rankings": [...],
  "timing": {...}}`` (see :mod:`hllm.serve.schemas`);
* ``GET /healthz`` — the process answers (200);
* ``GET /readyz`` — 200 once the engine is loaded and warmed up, 503 while loading, after a load
  failure and while draining;
* ``GET /metrics`` — Prometheus text (:mod:`hllm.serve.metrics`);
* ``GET /openapi.json`` and ``/docs`` — the OpenAPI schema.

Bad input never reaches the engine: the body size is limited, JSON and slate types are checked with
the runtime's :func:`hllm.runtime.slates.validate_slate`, and each slate is encoded once by the
runtime's :class:`PromptBuilder` at admission (empty slate, more candidates than K, prompt over
``max_seq_len``) — all answered 4xx with ``{"error": {"kind", "message"}}`` naming the problem.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool

from hllm.errors import SlateError
from hllm.runtime.slates import validate_slate
from hllm.serve.batching import BatchFailed, BatchOptions, DeadlineExceeded, MicroBatcher, QueueFull, ShuttingDown
from hllm.serve.metrics import ServeMetrics
from hllm.serve.schemas import ErrorResponse, RankRequest, RankResponse

log = logging.getLogger("hllm.serve")

JSONL_TYPES = ("application/x-ndjson", "application/jsonl", "application/x-jsonlines", "application/jsonlines")
JSON_TYPES = ("application/json", "")


@dataclass(frozen=True)
class ServeOptions:
    """Server options.

    Attributes:
        batch: micro-batching options (:class:`BatchOptions`).
        max_body_bytes: larger request bodies are refused with 413.
        max_slates_per_request: more slates in one request → 413.
        warmup: run one synthetic slate through the engine before reporting ready.
    """

    batch: BatchOptions = field(default_factory=BatchOptions)
    max_body_bytes: int = 4 * 1024 * 1024
    max_slates_per_request: int = 32
    warmup: bool = True


class ApiError(Exception):
    """An error answered as ``{"error": {"kind", "message", "id"}}`` with an HTTP status."""

    def __init__(self, status: int, kind: str, message: str, headers: dict | None = None, error_id: str | None = None):
        super().__init__(message)
        self.status, self.kind, self.message, self.headers, self.error_id = status, kind, message, headers, error_id


@dataclass
class ServerState:
    """What the app knows about its engine: ready after warm-up, draining after SIGTERM."""

    ranker: Any
    batcher: MicroBatcher
    metrics: ServeMetrics
    options: ServeOptions
    ready: bool = False
    draining: bool = False
    load_error: str | None = None
    loader: asyncio.Task | None = None
    info: dict = field(default_factory=dict)


def warmup_slate(k: int) -> dict:
    """A synthetic slate of ``min(k, 8)`` candidates used once to warm the engine up."""
    n = max(1, min(int(k), 8))
    return {
        "slate_id": "warmup",
        "history": ["a warm-up item"],
        "candidates": [{"item_id": f"w{i}", "title": f"warm-up candidate {i}"} for i in range(n)],
    }


def parse_rank_body(body: bytes, content_type: str, max_slates: int) -> tuple[list[dict], float | None]:
    """Parse and check a ``POST /v1/rank`` body → (slates, deadline_ms or None).

    Raises: ApiError 400 (malformed JSON / not UTF-8), 415 (content type), 413 (too many slates),
    422 (wrong types, no slates, a malformed slate — the message names the slate and field).
    """
    ctype = content_type.split(";")[0].strip().lower()
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, "bad_json", f"body is not UTF-8 ({e.reason} at byte {e.start})") from None
    deadline = None
    if ctype in JSONL_TYPES:
        items = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                items.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ApiError(400, "bad_json", f"line {lineno}: malformed JSON ({e.msg} at column {e.colno})") from None
        where = "JSONL slate {}"
    elif ctype in JSON_TYPES:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise ApiError(400, "bad_json", f"malformed JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
        if isinstance(doc, dict) and "slates" in doc:
            items = doc["slates"]
            if not isinstance(items, list):
                raise ApiError(422, "bad_request", f"'slates' must be a list of slate objects, got {type(items).__name__}")
            unknown = set(doc) - {"slates", "deadline_ms"}
            if unknown:
                raise ApiError(422, "bad_request", f"unknown fields {sorted(unknown)} (allowed: slates, deadline_ms)")
            deadline = doc.get("deadline_ms")
            if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or deadline <= 0):
                raise ApiError(422, "bad_request", f"'deadline_ms' must be a positive number, got {deadline!r}")
        elif isinstance(doc, dict):
            items = [doc]
        elif isinstance(doc, list):
            items = doc
        else:
            raise ApiError(
                422, "bad_request",
                f"body must be {{\"slates\": [...]}}, one slate object or a list of slates, got {type(doc).__name__}",
            )
        where = "slates[{}]"
    else:
        raise ApiError(415, "unsupported_media_type", f"content type {ctype!r} not supported (use application/json or application/x-ndjson)")
    if not items:
        raise ApiError(422, "bad_request", "no slates in the request")
    if len(items) > max_slates:
        raise ApiError(413, "too_large", f"{len(items)} slates in one request, over the limit of {max_slates}")
    slates = []
    for i, obj in enumerate(items):
        w = where.format(i + 1 if ctype in JSONL_TYPES else i)
        try:
            slates.append(validate_slate(obj, w))
        except SlateError as e:
            raise ApiError(422, "bad_slate", str(e)) from None
    return slates, deadline


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing (413) one over ``limit`` bytes by Content-Length or while streaming."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise ApiError(413, "too_large", f"body of {int(declared)} bytes is over the limit of {limit} bytes")
        except ValueError:
            raise ApiError(400, "bad_request", f"bad Content-Length header {declared!r}") from None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, "too_large", f"body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _encode(builder, slates: list[dict]) -> list:
    """Encode each slate once with the runtime's PromptBuilder (empty, > K, over max_seq_len → 422);
    the rows go to the batcher, so no slate is tokenized twice."""
    rows = []
    for i, s in enumerate(slates):
        try:
            rows.append(builder.encode_one(s))
        except SlateError as e:
            raise ApiError(422, "bad_slate", f"slates[{i}]: {e}") from None
    return rows


def _error_response(e: ApiError) -> JSONResponse:
    return JSONResponse({"error": {"kind": e.kind, "message": e.message, "id": e.error_id}}, status_code=e.status, headers=e.headers)


_ERRORS = {
    400: {"model": ErrorResponse, "description": "Malformed JSON or body not UTF-8."},
    413: {"model": ErrorResponse, "description": "Body or slate count over the server's limits."},
    415: {"model": ErrorResponse, "description": "Content type is neither JSON nor JSONL."},
    422: {"model": ErrorResponse, "description": "Wrong types, empty slate, more candidates than K, prompt over max_seq_len."},
    500: {"model": ErrorResponse, "description": "The engine batch failed; `error.id` is in the server log."},
    503: {"model": ErrorResponse, "description": "Not ready, draining, or queue full (with Retry-After)."},
    504: {"model": ErrorResponse, "description": "The request's deadline passed."},
}


def create_app(ranker: Any, options: ServeOptions | None = None, info: dict | None = None) -> FastAPI:
    """The FastAPI app serving ``ranker`` (a :class:`hllm.runtime.Ranker`).

    The engine is activated and warmed up on the engine thread after startup (``/readyz`` says when);
    shutdown drains the queue, then deactivates the engine.
    """
    options = options or ServeOptions()
    metrics = ServeMetrics()
    batcher = MicroBatcher(ranker, options.batch, metrics)
    state = ServerState(ranker, batcher, metrics, options, info=dict(info or {}))

    def _activate_and_warm() -> None:
        ranker.engine.activate()
        if options.warmup:
            ranker.rank_batch([warmup_slate(ranker.engine.num_positions)])

    async def _load() -> None:
        try:
            await batcher.run_in_engine_thread(_activate_and_warm)
        except Exception as e:  # noqa: BLE001 — reported by /readyz, the server stays up
            state.load_error = f"{type(e).__name__}: {e}"
            log.error("engine failed to load: %s", state.load_error)
            return
        state.ready = True
        metrics.ready.set(1)
        log.info("engine %s ready", ranker.engine.name)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await batcher.start()
        state.loader = asyncio.get_running_loop().create_task(_load())
        try:
            yield
        finally:
            state.draining = True
            state.ready = False
            metrics.ready.set(0)
            await batcher.close()
            if not state.loader.done():
                state.loader.cancel()
            ranker.engine.deactivate()

    app = FastAPI(
        title="hllm ranking server",
        version="1",
        description="Generative reranking in one prefill pass (hLLM): slates in, rankings out.",
        lifespan=lifespan,
    )
    app.state.hllm = state

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError):
        metrics.error(e.kind)
        return _error_response(e)

    @app.middleware("http")
    async def _count(request: Request, call_next):
        response = await call_next(request)
        path = request.url.path
        known = path in ("/v1/rank", "/healthz", "/readyz", "/metrics")
        metrics.requests.labels(path if known else "other", str(response.status_code)).inc()
        return response

    @app.get("/healthz", summary="The process is alive")
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.get("/readyz", summary="The engine is loaded and warmed up", responses={503: {"model": ErrorResponse}})
    async def readyz():
        if state.ready and not state.draining:
            return {"status": "ready", "engine": ranker.engine.name, "num_positions": ranker.engine.num_positions, **state.info}
        if state.draining:
            kind, msg = "draining", "server is shutting down"
        elif state.load_error:
            kind, msg = "load_failed", f"engine failed to load: {state.load_error}"
        else:
            kind, msg = "not_ready", "engine is loading / warming up"
        return _error_response(ApiError(503, kind, msg))

    @app.get("/metrics", summary="Prometheus metrics", response_class=PlainTextResponse)
    async def prometheus_metrics():
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.post(
        "/v1/rank",
        summary="Rank one or more slates",
        response_model=RankResponse,
        responses=_ERRORS,
    )
    async def rank(request: Request):
        t0 = time.perf_counter()
        if state.draining or batcher.closing:
            raise ApiError(503, "not_ready", "server is shutting down", {"Retry-After": "1"})
        if not state.ready:
            why = f"engine failed to load: {state.load_error}" if state.load_error else "engine is loading / warming up"
            raise ApiError(503, "not_ready", why, {"Retry-After": "1"})
        body = await read_body(request, options.max_body_bytes)
        slates, deadline = parse_rank_body(body, request.headers.get("content-type", ""), options.max_slates_per_request)
        encoded = await run_in_threadpool(_encode, ranker.builder, slates)
        t1 = time.perf_counter()
        metrics.stage.labels("validate").observe(t1 - t0)
        try:
            res = await batcher.submit(slates, deadline, encoded)
        except QueueFull as e:
            raise ApiError(503, "queue_full", str(e), {"Retry-After": str(e.retry_after_s)}) from None
        except ShuttingDown as e:
            raise ApiError(503, "not_ready", str(e), {"Retry-After": "1"}) from None
        except DeadlineExceeded as e:
            raise ApiError(504, "deadline", str(e)) from None
        except BatchFailed as e:
            metrics.error(e.kind)
            return _error_response(ApiError(500, e.kind, str(e), error_id=e.error_id))
        t2 = time.perf_counter()
        metrics.stage.labels("request").observe(t2 - t0)
        timing = {"validate_ms": round((t1 - t0) * 1e3, 3), **res.timing, "total_ms": round((t2 - t0) * 1e3, 3)}
        return JSONResponse(
            {"request_id": uuid.uuid4().hex[:12], "rankings": [r.to_dict() for r in res.rankings], "timing": timing}
        )

    def _openapi() -> dict:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        req = RankRequest.model_json_schema(ref_template="#/components/schemas/{model}")
        comps = schema.setdefault("components", {}).setdefault("schemas", {})
        comps.update(req.pop("$defs", {}))
        comps["RankRequest"] = req
        schema["paths"]["/v1/rank"]["post"]["requestBody"] = {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/RankRequest"}},
                "application/x-ndjson": {"schema": {"type": "string", "description": "One slate JSON object per line."}},
            },
        }
        app.openapi_schema = schema
        return schema

    app.openapi = _openapi
    return app
