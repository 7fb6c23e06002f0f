"""The ranking HTTP API (FastAPI on Starlette, served by uvicorn) over one :class:`hllm.runtime.Ranker`.

Endpoints:

* ``POST /v1/rank`` — one or more slates (JSON ``{"slates": [...]}``, one slate object, a JSON list,
  or an ``application/x-ndjson`` body of JSONL slates) → ``{"request_id", "rankings": [...],
  "timing": {...}}`` (see :mod:`hllm.serve.schemas`);
* ``POST /v1/rerank``, ``/v2/rerank``, ``/rerank`` — the Cohere / Jina reranking API, one slate per request
  (:mod:`hllm.serve.rerank`);
* ``GET /healthz`` — the process answers (200);
* ``GET /readyz`` — 200 once the engine is loaded and warmed up, 503 while loading, after a load
  failure and while draining;
* ``GET /metrics`` — Prometheus text (:mod:`hllm.serve.metrics`);
* ``GET /openapi.json`` and ``/docs`` — the OpenAPI schema;
* the Open Inference Protocol (KServe v2): ``GET /v2/health/live``, ``/v2/health/ready``,
  ``/v2/models/hllm_ranker[/ready]`` and ``POST /v2/models/hllm_ranker/infer`` with the BYTES
  ``slates`` input of the Triton ensemble (:mod:`hllm.serve.kserve`), errors as ``{"error": message}``.

Every response carries ``X-Request-ID``: the client's own (1..128 printable ASCII characters, no
spaces) or a new id; ``/v1/rank`` returns it as ``request_id``. ``hllm_request_duration_seconds{path}``
in ``/metrics`` is the end-to-end latency of every response inside the server.

Bad input never reaches the engine: the body size is limited, JSON is parsed by the runtime's strict
:func:`hllm.runtime.slates.loads_json` and every slate is checked by the runtime's one validator
:func:`hllm.runtime.slates.validate_slate` (the rules of ``hllm rank``), and each slate is encoded once
by the runtime's :class:`PromptBuilder` at admission (empty slate, more candidates than K, prompt over
``max_seq_len``).

Errors: EVERY error response — bad input, an unknown path (404) or method (405),
a body that does not arrive in time (408), a failed engine batch and an unexpected exception — has the
JSON envelope ``{"error": {"kind", "message", "id"}}`` (:class:`hllm.serve.schemas.ErrorResponse`);
``id`` is set for server-side failures (500) and is in the server log with the traceback. Every
response is counted in ``hllm_requests_total{path, code}`` and every error response in
``hllm_errors_total{kind}``. (Connections refused by uvicorn itself before the app sees a request —
malformed HTTP, over ``max_connections`` — get uvicorn's plain-text 400/503.)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from hllm.errors import HllmError, SlateError
from hllm.runtime.slates import loads_json, validate_slate
from hllm.serve import kserve
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
        body_timeout_s: a request body not fully received within this time → 408 (slow or stalled
            client; the connection is then closed).
        header_timeout_s: a connection that has not sent complete request headers within this time
            (after connecting, or after its previous response) is answered 408 and closed
            (:mod:`hllm.serve.server`).
        keep_alive_s: an idle keep-alive connection is closed after this time (uvicorn
            ``timeout_keep_alive``).
        max_connections: over this many open connections or running requests uvicorn answers 503
            (``limit_concurrency``).
        echo_request_id: set ``X-Request-ID`` on every response (off behind a proxy that sets it
            itself, such as Ray Serve's, which honours the client's header the same way).
    """

    batch: BatchOptions = field(default_factory=BatchOptions)
    max_body_bytes: int = 4 * 1024 * 1024
    max_slates_per_request: int = 32
    warmup: bool = True
    body_timeout_s: float = 30.0
    header_timeout_s: float = 10.0
    keep_alive_s: float = 5.0
    max_connections: int = 512
    echo_request_id: bool = True

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_slates_per_request", "max_connections"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise HllmError(f"{name} must be a positive integer, got {v!r}")
        for name in ("body_timeout_s", "header_timeout_s", "keep_alive_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise HllmError(f"{name} must be a positive number of seconds, got {v!r}")


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

    JSON goes through :func:`hllm.runtime.slates.loads_json` and every slate through
    :func:`hllm.runtime.slates.validate_slate` (the one parser and validator of ``hllm rank``).
    A slate without ``slate_id`` is given its 0-based index in the request as id (so its ranking is
    named the same whichever micro-batch it rides in).
    Raises: ApiError 400 (malformed JSON, NaN/Infinity literals, nesting too deep, not UTF-8), 415
    (content type), 413 (too many slates), 422 (wrong types, no slates, a malformed slate, a
    ``deadline_ms`` that is not a finite positive number — the message names the slate and field).
    """
    ctype = content_type.split(";")[0].strip().lower()
    if ctype not in JSONL_TYPES and ctype not in JSON_TYPES:
        raise ApiError(415, "unsupported_media_type", f"content type {ctype!r} not supported (use application/json or application/x-ndjson)")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, "bad_json", f"body is not UTF-8 ({e.reason} at byte {e.start})") from None
    deadline = None
    try:
        if ctype in JSONL_TYPES:
            # Lines end at "\n" only (JSON Lines; `hllm rank` reads the same way): str.splitlines() would also
            # split at U+2028, U+0085 and other characters that a JSON string may hold unescaped.
            lines = (line.removesuffix("\r") for line in text.split("\n"))
            items = [loads_json(line, f"line {n}") for n, line in enumerate(lines, 1) if line.strip()]
            where = "JSONL slate {}"
        else:
            items, deadline = _json_items(loads_json(text, "body"))
            where = "slates[{}]"
    except SlateError as e:
        raise ApiError(400, "bad_json", str(e)) from None
    if not items:
        raise ApiError(422, "bad_request", "no slates in the request")
    if len(items) > max_slates:
        raise ApiError(413, "too_large", f"{len(items)} slates in one request, over the limit of {max_slates}")
    slates = []
    for i, obj in enumerate(items):
        try:
            slate = validate_slate(obj, where.format(i + 1 if ctype in JSONL_TYPES else i))
        except SlateError as e:
            raise ApiError(422, "bad_slate", str(e)) from None
        slate.setdefault("slate_id", str(i))  # no id: its index in this request (not in the engine batch)
        slates.append(slate)
    return slates, deadline


def _json_items(doc: Any) -> tuple[list, float | None]:
    """The slates and deadline of a JSON body: ``{"slates": [...], "deadline_ms"}``, one slate object or a list."""
    if isinstance(doc, dict) and "slates" in doc:
        items = doc["slates"]
        if not isinstance(items, list):
            raise ApiError(422, "bad_request", f"'slates' must be a list of slate objects, got {type(items).__name__}")
        unknown = set(doc) - {"slates", "deadline_ms"}
        if unknown:
            raise ApiError(422, "bad_request", f"unknown fields {sorted(unknown)} (allowed: slates, deadline_ms)")
        deadline = doc.get("deadline_ms")
        if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, (int, float))
                                     or not math.isfinite(deadline) or deadline <= 0):
            raise ApiError(422, "bad_request", f"'deadline_ms' must be a finite positive number, got {deadline!r}")
        return items, deadline
    if isinstance(doc, dict):
        return [doc], None
    if isinstance(doc, list):
        return doc, None
    raise ApiError(422, "bad_request",
                   f"body must be {{\"slates\": [...]}}, one slate object or a list of slates, got {type(doc).__name__}")


async def read_body(request: Request, limit: int, timeout_s: float | None = None) -> bytes:
    """The request body, refusing (413) one over ``limit`` bytes by Content-Length or while streaming,
    and (408) one not fully received within ``timeout_s`` (a client dribbling its body)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            n = int(declared)
        except ValueError:
            raise ApiError(400, "bad_request", f"bad Content-Length header {declared!r}") from None
        if n > limit:
            raise ApiError(413, "too_large", f"body of {n} bytes is over the limit of {limit} bytes")

    async def _read() -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, "too_large", f"body is over the limit of {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        return await asyncio.wait_for(_read(), timeout_s)
    except asyncio.TimeoutError:
        raise ApiError(408, "timeout", f"request body not received within {timeout_s:g} s",
                       {"Connection": "close"}) from None


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


#: ``error.kind`` of the HTTP errors raised by routing.
HTTP_KINDS = {404: "not_found", 405: "method_not_allowed"}


def _error_response(e: ApiError) -> JSONResponse:
    return JSONResponse({"error": {"kind": e.kind, "message": e.message, "id": e.error_id}}, status_code=e.status, headers=e.headers)


_ERRORS = {
    400: {"model": ErrorResponse, "description": "Malformed JSON (NaN, nesting too deep) or body not UTF-8."},
    408: {"model": ErrorResponse, "description": "The body was not received within the server's body timeout."},
    413: {"model": ErrorResponse, "description": "Body or slate count over the server's limits."},
    415: {"model": ErrorResponse, "description": "Content type is neither JSON nor JSONL."},
    422: {"model": ErrorResponse, "description": "Wrong types, empty slate, more candidates than K, prompt over max_seq_len."},
    500: {"model": ErrorResponse, "description": "The engine batch failed or an unexpected error; `error.id` is in the server log."},
    503: {"model": ErrorResponse, "description": "Not ready, draining, or queue full (with Retry-After)."},
    504: {"model": ErrorResponse, "description": "The request's deadline passed."},
}


_REQUEST_ID = re.compile(r"[!-~]{1,128}")  # printable ASCII, no spaces


def request_id(header: str | None) -> str:
    """The request's id: the client's ``X-Request-ID`` when it is 1..128 printable ASCII characters
    without spaces, else a new 12-hex-digit id."""
    return header if header is not None and _REQUEST_ID.fullmatch(header) else uuid.uuid4().hex[:12]


#: Paths counted and timed under their own label (others: ``/v2/...`` routes by kind, the rest ``other``).
METRIC_PATHS = ("/v1/rank", "/v1/rerank", "/v2/rerank", "/rerank", "/healthz", "/readyz", "/metrics")


def metric_path(path: str) -> str:
    """The ``path`` label of a request path: a known path, ``/v2/infer``, ``/v2/health``, ``/v2/models`` or ``other``."""
    if path in METRIC_PATHS:
        return path
    if path.startswith("/v2/"):
        return "/v2/infer" if path.endswith("/infer") else "/v2/health" if path.startswith("/v2/health") else "/v2/models"
    return "other"


def add_kserve_routes(app: FastAPI, service: "RankService") -> None:
    """Register the Open Inference Protocol (KServe v2) endpoints of :mod:`hllm.serve.kserve` on ``app``."""
    app.add_exception_handler(kserve.KServeError, service.kserve_error)
    tags = ["Open Inference Protocol (KServe v2)"]
    app.get("/v2/health/live", tags=tags, summary="The server is alive")(service.v2_live)
    app.get("/v2/health/ready", tags=tags, summary="The model is ready")(service.v2_ready)
    app.get("/v2", tags=tags, summary="Server metadata")(service.v2_server)
    for base in ("/v2/models/{model_name}", "/v2/models/{model_name}/versions/{model_version}"):
        app.get(base, tags=tags, summary="Model metadata")(service.v2_model)
        app.get(base + "/ready", tags=tags, summary="The model is ready")(service.v2_model_ready)
        app.get(base + "/config", tags=tags, summary="Model configuration (Triton extension)")(service.v2_model_config)
        app.post(base + "/infer", tags=tags, summary="Rank slates (BYTES input 'slates' [B, 1])")(service.v2_infer)


class KServeEndpoints:
    """The Open Inference Protocol endpoints (mixed into :class:`RankService`; see :mod:`hllm.serve.kserve`)."""

    async def kserve_error(self, request: Request, e: "kserve.KServeError"):
        self.metrics.error(e.kind)
        return JSONResponse({"error": e.message}, status_code=e.status)

    def _v2_check_ready(self) -> None:
        if not self.state.ready or self.state.draining or self.batcher.closing:
            raise kserve.KServeError(503, "model hllm_ranker is not ready", "not_ready")

    async def v2_live(self):
        return Response(status_code=200)

    async def v2_ready(self):
        self._v2_check_ready()
        return Response(status_code=200)

    async def v2_server(self):
        import hllm

        return {"name": "hllm", "version": hllm.__version__, "extensions": ["binary_tensor_data"]}

    async def v2_model(self, model_name: str, model_version: str | None = None):
        kserve.check_model(model_name, model_version)
        return kserve.model_metadata(self.ranker.engine.num_positions, self.ranker.engine.name)

    async def v2_model_config(self, model_name: str, model_version: str | None = None):
        kserve.check_model(model_name, model_version)
        return kserve.model_config(self.ranker.engine.num_positions, self.options.max_slates_per_request)

    async def v2_model_ready(self, model_name: str, model_version: str | None = None):
        kserve.check_model(model_name, model_version)
        self._v2_check_ready()
        return Response(status_code=200)

    async def v2_infer(self, request: Request, model_name: str, model_version: str | None = None):
        """``POST /v2/models/{name}/infer``: the slates of the BYTES input → ranking, scores, truncated."""
        t0 = time.perf_counter()
        kserve.check_model(model_name, model_version)
        self._v2_check_ready()
        try:
            body = await read_body(request, self.options.max_body_bytes, self.options.body_timeout_s)
        except ApiError as e:
            raise kserve.KServeError(e.status, e.message, e.kind) from None
        doc, blob = kserve.split_request(body, request.headers.get(kserve.HEADER_LENGTH.lower()))
        slates = kserve.request_slates(doc, blob, self.options.max_slates_per_request)
        try:
            res, _ = await self.submit(slates, None, t0)
        except ApiError as e:
            raise kserve.KServeError(400 if e.status == 422 else e.status, e.message, e.kind) from None
        outputs = kserve.output_arrays(res.rankings, res.scores, self.ranker.engine.num_positions)
        rid = doc.get("id") if isinstance(doc.get("id"), str) else request.state.request_id
        body, headers = kserve.response_body(doc, outputs, rid)
        return Response(body, headers=headers)


def create_app(ranker: Any, options: ServeOptions | None = None, info: dict | None = None,
               batcher_factory: Any = None) -> FastAPI:
    """The FastAPI app serving ``ranker`` (a :class:`hllm.runtime.Ranker`).

    The engine is activated and warmed up on the engine thread after startup (``/readyz`` says when);
    shutdown drains the queue, then deactivates the engine. The handlers are the methods of one
    :class:`RankService` over the app's :class:`ServerState` (``app.state.hllm``).
    ``batcher_factory(ranker, batch_options, metrics)`` replaces the :class:`MicroBatcher` (same
    interface; the Ray Serve deployment passes one built on ``@serve.batch``).
    """
    options = options or ServeOptions()
    metrics = ServeMetrics()
    batcher = (batcher_factory or MicroBatcher)(ranker, options.batch, metrics)
    state = ServerState(ranker, batcher, metrics, options, info=dict(info or {}))
    service = RankService(state)
    app = FastAPI(
        title="hllm ranking server",
        version="1",
        description="Generative reranking in one prefill pass (hLLM): slates in, rankings out.",
        lifespan=service.lifespan,
    )
    app.state.hllm = state
    app.add_exception_handler(ApiError, service.api_error)
    app.add_exception_handler(StarletteHTTPException, service.http_error)
    app.add_exception_handler(RequestValidationError, service.validation_error)
    app.middleware("http")(service.count)
    app.get("/healthz", summary="The process is alive")(service.healthz)
    app.get("/readyz", summary="The engine is loaded and warmed up", responses={503: {"model": ErrorResponse}})(service.readyz)
    app.get("/metrics", summary="Prometheus metrics", response_class=PlainTextResponse)(service.prometheus_metrics)
    app.post("/v1/rank", summary="Rank one or more slates", response_model=RankResponse, responses=_ERRORS)(service.rank)
    add_kserve_routes(app, service)
    from hllm.serve.rerank import add_rerank_routes  # imports this module

    add_rerank_routes(app, service)
    app.openapi = functools.partial(rank_openapi, app)
    return app


class RankService(KServeEndpoints):
    """The lifespan, middleware, error handlers and endpoints of the app over one :class:`ServerState`
    (wired up by :func:`create_app`; the endpoints are documented in this module's docstring)."""

    def __init__(self, state: ServerState):
        self.state = state
        self.ranker, self.batcher, self.metrics, self.options = state.ranker, state.batcher, state.metrics, state.options

    # --- engine life cycle -------------------------------------------------------------------------

    def _activate_and_warm(self) -> None:
        self.ranker.engine.activate()
        if self.options.warmup:
            self.ranker.rank_batch([warmup_slate(self.ranker.engine.num_positions)])

    async def _load(self) -> None:
        try:
            await self.batcher.run_in_engine_thread(self._activate_and_warm)
        except Exception as e:  # noqa: BLE001 — reported by /readyz, the server stays up
            self.state.load_error = f"{type(e).__name__}: {e}"
            log.error("engine failed to load: %s", self.state.load_error)
            return
        self.state.ready = True
        self.metrics.ready.set(1)
        log.info("engine %s ready", self.ranker.engine.name)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: FastAPI):
        """Start the batcher and load the engine in the background; on shutdown drain, then deactivate."""
        state = self.state
        await self.batcher.start()
        state.loader = asyncio.get_running_loop().create_task(self._load())
        try:
            yield
        finally:
            state.draining = True
            state.ready = False
            self.metrics.ready.set(0)
            await self.batcher.close()
            if not state.loader.done():
                state.loader.cancel()
            self.ranker.engine.deactivate()

    # --- errors and counting -----------------------------------------------------------------------

    async def api_error(self, request: Request, e: ApiError):
        self.metrics.error(e.kind)
        return _error_response(e)

    async def http_error(self, request: Request, e: StarletteHTTPException):
        kind = HTTP_KINDS.get(e.status_code, "bad_request" if e.status_code < 500 else "internal")
        message = f"no route {request.url.path}" if e.status_code == 404 else str(e.detail)
        self.metrics.error(kind)
        return _error_response(ApiError(e.status_code, kind, message, dict(e.headers or {})))

    async def validation_error(self, request: Request, e: RequestValidationError):
        self.metrics.error("bad_request")
        return _error_response(ApiError(422, "bad_request", str(e.errors())[:2000]))

    async def count(self, request: Request, call_next):
        """Middleware: the request id (``X-Request-ID``, echoed), count and time every response by path and
        code; an unexpected exception → JSON 500 with an id."""
        t0 = time.perf_counter()
        request.state.request_id = request_id(request.headers.get("x-request-id"))
        try:
            response = await call_next(request)
        except Exception as e:  # noqa: BLE001 — a bug: answered as JSON 500 with an id, logged, counted
            error_id = uuid.uuid4().hex[:12]
            log.exception("internal error %s on %s %s", error_id, request.method, request.url.path)
            self.metrics.error("internal")
            response = _error_response(ApiError(500, "internal", f"internal error ({type(e).__name__}); "
                                                "the server log has its traceback under this id", error_id=error_id))
        path = metric_path(request.url.path)
        self.metrics.requests.labels(path, str(response.status_code)).inc()
        self.metrics.latency.labels(path).observe(time.perf_counter() - t0)
        if self.options.echo_request_id:
            response.headers["X-Request-ID"] = request.state.request_id
        return response

    # --- endpoints ---------------------------------------------------------------------------------

    async def healthz(self) -> dict:
        return {"status": "ok"}

    async def readyz(self):
        state, engine = self.state, self.ranker.engine
        if state.ready and not state.draining:
            return {"status": "ready", "engine": engine.name, "num_positions": engine.num_positions, **state.info}
        if state.draining:
            kind, msg = "draining", "server is shutting down"
        elif state.load_error:
            kind, msg = "load_failed", f"engine failed to load: {state.load_error}"
        else:
            kind, msg = "not_ready", "engine is loading / warming up"
        return _error_response(ApiError(503, kind, msg))

    async def prometheus_metrics(self):
        return Response(self.metrics.render(), media_type=self.metrics.content_type)

    async def rank(self, request: Request):
        t0 = time.perf_counter()
        self._check_ready()
        body = await read_body(request, self.options.max_body_bytes, self.options.body_timeout_s)
        slates, deadline = parse_rank_body(body, request.headers.get("content-type", ""),
                                           self.options.max_slates_per_request)
        res, timing = await self.submit(slates, deadline, t0)
        return JSONResponse({"request_id": request.state.request_id, "rankings": [r.to_dict() for r in res.rankings],
                             "timing": timing})

    async def submit(self, slates: list[dict], deadline: float | None, t0: float, encoded: list | None = None):
        """Encode validated slates at admission (unless ``encoded`` holds their rows already) and rank them in
        the batcher → (JobResult, timing in ms).

        Raises: ApiError 422 (a slate the prompt builder refuses), 503 (queue full, shutting down),
        504 (deadline), 500 (the engine batch failed).
        """
        if encoded is None:
            encoded = await run_in_threadpool(_encode, self.ranker.builder, slates)
        t1 = time.perf_counter()
        self.metrics.stage.labels("validate").observe(t1 - t0)
        try:
            res = await self.batcher.submit(slates, deadline, encoded)
        except QueueFull as e:
            raise ApiError(503, "queue_full", str(e), {"Retry-After": str(e.retry_after_s)}) from None
        except ShuttingDown as e:
            raise ApiError(503, "not_ready", str(e), {"Retry-After": "1"}) from None
        except DeadlineExceeded as e:
            raise ApiError(504, "deadline", str(e)) from None
        except BatchFailed as e:
            raise ApiError(500, e.kind, str(e), error_id=e.error_id) from None
        t2 = time.perf_counter()
        self.metrics.stage.labels("request").observe(t2 - t0)
        return res, {"validate_ms": round((t1 - t0) * 1e3, 3), **res.timing, "total_ms": round((t2 - t0) * 1e3, 3)}

    def _check_ready(self) -> None:
        """Raises: ApiError 503 (Retry-After: 1) while draining, loading or after a load failure."""
        if self.state.draining or self.batcher.closing:
            raise ApiError(503, "not_ready", "server is shutting down", {"Retry-After": "1"})
        if not self.state.ready:
            load_error = self.state.load_error
            why = f"engine failed to load: {load_error}" if load_error else "engine is loading / warming up"
            raise ApiError(503, "not_ready", why, {"Retry-After": "1"})


def rank_openapi(app: FastAPI) -> dict:
    """The app's OpenAPI schema (cached on ``app.openapi_schema``), with the ``/v1/rank`` request body
    documented as :class:`RankRequest` JSON or JSONL (the endpoint reads the raw body itself)."""
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
