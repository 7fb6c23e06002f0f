"""The ranking HTTP API (FastAPI on Starlette, served by uvicorn) over one :class:`hllm.runtime.Ranker`.

Endpoints:

* ``POST /v1/rank`` — one or more slates (JSON ``{"slates": [...]}``, one slate object, a JSON list,
  or an ``application/x-ndjson`` body of JSONL slates) → ``{"request_id", "rankings": [...],
  "timing": {...}}`` (see :mod:`hllm.serve.schemas`);
* ``POST /v1/rerank``, ``/v2/rerank``, ``/rerank`` — the Cohere / Jina reranking API, one slate per request
  (:mod:`hllm.serve.rerank`);
* ``GET /healthz`` — the process answers (200);
* ``GET /readyz`` — 200 once the engine is loaded and warmed up (``{"status": "ready", "served_model_names",
  "model_version"}``:
  the served model's name and version only, never its path or engine), 503 while loading, after a load
  failure and while draining;
* ``GET /metrics`` — Prometheus text (:mod:`hllm.serve.metrics`);
* ``GET /openapi.json`` and ``/docs`` — the OpenAPI schema;
* ``GET /v1/models`` — the served names and version (and, serving a versioned repository, its ``versions``);
* ``POST /admin/reload`` — load, check and swap in the newest model version (:mod:`hllm.serve.admin`,
  :mod:`hllm.serve.repository`);
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
import collections
import contextlib
import functools
import logging
import math
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

from hllm.errors import HllmError
from hllm.serve import kserve
from hllm.serve.admin import add_admin_routes
from hllm.serve.batching import BatchFailed, BatchOptions, DeadlineExceeded, MicroBatcher, QueueFull, ShuttingDown
from hllm.serve.auth import ApiKeyMiddleware, AuthOptions
from hllm.serve.metrics import ServeMetrics
from hllm.serve.models import ServedModel
from hllm.serve.protocol import (ERROR_RESPONSES, HTTP_KINDS, ApiError, assignment_blocks, encode_slates,
                                 error_response, metric_path, parse_rank_body, read_body, request_id)
from hllm.serve.repository import watch_sighup
from hllm.serve.rerank import add_rerank_routes
from hllm.serve.schemas import ErrorResponse, RankRequest, RankResponse
from hllm.serve.tracing import TelemetryMiddleware, observe_request

log = logging.getLogger("hllm.serve")

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
        max_connections_per_client: most open connections of one client address; past it a new one is
            answered 503 and closed at once (:mod:`hllm.serve.server`). None: half of ``max_connections``
            (at least 1), so one address never holds every slot (raise it behind a proxy).
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
    max_connections_per_client: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_slates_per_request", "max_connections", "max_connections_per_client"):
            v = getattr(self, name)
            if v is None and name == "max_connections_per_client":
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise HllmError(f"{name} must be a positive integer, got {v!r}")
        for name in ("body_timeout_s", "header_timeout_s", "keep_alive_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise HllmError(f"{name} must be a positive number of seconds, got {v!r}")

    @property
    def per_client_cap(self) -> int:
        """The connections one client address may hold: ``max_connections_per_client``, or half of
        ``max_connections`` (at least 1)."""
        return self.max_connections_per_client or max(1, self.max_connections // 2)


@dataclass
class ServerState:
    """What the app knows about its engine: ready after warm-up, draining after SIGTERM; ``shed``: the
    in-flight requests answered 503 because the graceful timeout ended or a second SIGINT cut it short
    (``forced``); ``stop_signals``: the names of the signals that stopped the server, in order
    (:mod:`hllm.serve.server`)."""

    ranker: Any
    batcher: MicroBatcher
    metrics: ServeMetrics
    options: ServeOptions
    ready: bool = False
    draining: bool = False
    load_error: str | None = None
    loader: asyncio.Task | None = None
    info: dict = field(default_factory=dict)
    model: ServedModel = field(default_factory=ServedModel)
    versions: Any = None  # hllm.serve.repository.VersionManager when serving a versioned repository
    inflight: collections.Counter = field(default_factory=collections.Counter)  # id(ranker) → requests holding it
    shed: int = 0
    forced: bool = False
    stop_signals: list = field(default_factory=list)
    served: bool = False  # the engine was ready once (a stop before that is an interrupted start-up)


def warmup_slate(k: int) -> dict:
    """A synthetic slate of ``min(k, 8)`` candidates used once to warm the engine up."""
    n = max(1, min(int(k), 8))
    return {
        "slate_id": "warmup",
        "history": ["a warm-up item"],
        "candidates": [{"item_id": f"w{i}", "title": f"warm-up candidate {i}"} for i in range(n)],
    }


def create_app(ranker: Any, options: ServeOptions | None = None, info: dict | None = None,
               batcher_factory: Any = None, *, auth: AuthOptions | None = None, model: ServedModel | None = None,
               tracer: Any = None, access_log: bool = True, versions: Any = None, admin: Any = None) -> FastAPI:
    """The FastAPI app serving ``ranker`` (a :class:`hllm.runtime.Ranker`).

    The engine is activated and warmed up on the engine thread after startup (``/readyz`` says when);
    shutdown drains the queue, then deactivates the engine. The handlers are the methods of one
    :class:`RankService` over the app's :class:`ServerState` (``app.state.hllm``).
    ``batcher_factory(ranker, batch_options, metrics)`` replaces the :class:`MicroBatcher` (same
    interface; the Ray Serve deployment passes one built on ``@serve.batch``).
    ``auth``: API keys (:mod:`hllm.serve.auth`; None: no key needed). ``model``: the served names and version
    (:mod:`hllm.serve.models`). ``tracer``: an OpenTelemetry tracer for request spans, ``access_log``: one
    ``hllm.access`` record per request (:mod:`hllm.serve.tracing`). ``versions``: the
    :class:`hllm.serve.repository.VersionManager` of a versioned repository (``ranker`` and ``model`` are its
    served version's); ``admin``: who may call ``/admin/reload`` (:class:`hllm.serve.admin.AdminOptions`;
    None: nobody).
    """
    options = options or ServeOptions()
    metrics = ServeMetrics()
    batcher = (batcher_factory or MicroBatcher)(ranker, options.batch, metrics)
    model = model or ServedModel()
    info = {**(info or {}), "served_model_names": list(model.names), "model_version": model.version}
    state = ServerState(ranker, batcher, metrics, options, info=info, model=model, versions=versions)
    if versions is not None:
        versions.attach(state)
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
    if auth is not None:
        app.add_middleware(ApiKeyMiddleware, auth=auth, on_reject=functools.partial(metrics.error, "unauthorized"))
    app.add_middleware(TelemetryMiddleware, tracer=tracer, model_version=lambda: state.model.version, access=access_log)
    app.middleware("http")(service.count)
    app.get("/healthz", summary="The process is alive")(service.healthz)
    app.get("/readyz", summary="The engine is loaded and warmed up", responses={503: {"model": ErrorResponse}})(service.readyz)
    app.get("/metrics", summary="Prometheus metrics", response_class=PlainTextResponse)(service.prometheus_metrics)
    app.post("/v1/rank", summary="Rank one or more slates", response_model=RankResponse, responses=ERROR_RESPONSES)(service.rank)
    app.get("/v1/models", summary="The served model's names and version (OpenAI list shape)")(service.models)
    kserve.add_kserve_routes(app, service)
    add_rerank_routes(app, service)
    add_admin_routes(app, service, admin)
    app.openapi = functools.partial(rank_openapi, app)
    return app


class RankService(kserve.KServeEndpoints):
    """The lifespan, middleware, error handlers and endpoints of the app over one :class:`ServerState`
    (wired up by :func:`create_app`; the endpoints are documented in this module's docstring)."""

    def __init__(self, state: ServerState):
        self.state = state
        self.batcher, self.metrics, self.options = state.batcher, state.metrics, state.options

    @property
    def ranker(self):
        """The ranker of the served version (a live reload replaces it: a request pins one with :meth:`pin`)."""
        return self.state.ranker

    @contextlib.contextmanager
    def pin(self):
        """Hold the served (ranker, model) for one request: its version is not deactivated before it is
        answered, and it ranks the request even when another version is swapped in meanwhile."""
        st = self.state
        ranker, model = st.ranker, st.model
        key = id(ranker)
        st.inflight[key] += 1
        try:
            yield ranker, model
        finally:
            st.inflight[key] -= 1
            if st.inflight[key] <= 0:
                del st.inflight[key]

    # --- engine life cycle -------------------------------------------------------------------------

    def _activate_and_warm(self) -> None:
        ranker = self.ranker
        ranker.engine.activate()
        if self.options.warmup:
            ranker.rank_batch([warmup_slate(ranker.engine.num_positions)])
        if self.state.versions is not None:
            self.state.versions.check_serving(ranker)

    async def _load(self) -> None:
        try:
            await self.batcher.run_in_engine_thread(self._activate_and_warm)
        except Exception as e:  # noqa: BLE001 — reported by /readyz, the server stays up
            self.state.load_error = f"{type(e).__name__}: {e}"
            log.error("engine failed to load: %s", self.state.load_error)
            if self.state.versions is not None:
                self.state.versions.load_failed(self.state.load_error)
            return
        if self.state.draining:  # stopped while it loaded: never ready
            return
        self.state.ready = self.state.served = True
        self.metrics.ready.set(1)
        log.info("engine %s ready", self.ranker.engine.name)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: FastAPI):
        """Start the batcher and load the engine in the background; on shutdown drain, then deactivate."""
        state = self.state
        await self.batcher.start()
        state.loader = asyncio.get_running_loop().create_task(self._load())
        unwatch = watch_sighup(state.versions) if state.versions is not None else None
        try:
            yield
        finally:
            if unwatch is not None:
                unwatch()
            state.draining = True
            state.ready = False
            self.metrics.ready.set(0)
            await self.batcher.close()
            if not state.loader.done():
                state.loader.cancel()
            if state.versions is not None:
                state.versions.stop()
            self.ranker.engine.deactivate()

    # --- errors and counting -----------------------------------------------------------------------

    async def api_error(self, request: Request, e: ApiError):
        self.metrics.error(e.kind)
        return error_response(e)

    async def http_error(self, request: Request, e: StarletteHTTPException):
        kind = HTTP_KINDS.get(e.status_code, "bad_request" if e.status_code < 500 else "internal")
        message = f"no route {request.url.path}" if e.status_code == 404 else str(e.detail)
        self.metrics.error(kind)
        return error_response(ApiError(e.status_code, kind, message, dict(e.headers or {})))

    async def validation_error(self, request: Request, e: RequestValidationError):
        self.metrics.error("bad_request")
        return error_response(ApiError(422, "bad_request", str(e.errors())[:2000]))

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
            response = error_response(ApiError(500, "internal", f"internal error ({type(e).__name__}); "
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
        state = self.state
        if state.ready and not state.draining:  # name and version only: no path, engine or options to anyone
            return {"status": "ready", "served_model_names": list(state.model.names), "model_version": state.model.version}
        if state.draining:
            kind, msg = "draining", "server is shutting down"
        elif state.load_error:
            kind, msg = "load_failed", f"engine failed to load: {state.load_error}"
        else:
            kind, msg = "not_ready", "engine is loading / warming up"
        return error_response(ApiError(503, kind, msg))

    async def prometheus_metrics(self):
        return Response(self.metrics.render(), media_type=self.metrics.content_type)

    async def rank(self, request: Request):
        t0 = time.perf_counter()
        self._check_ready()
        body = await read_body(request, self.options.max_body_bytes, self.options.body_timeout_s)
        slates, deadline = parse_rank_body(body, request.headers.get("content-type", ""),
                                           self.options.max_slates_per_request)
        res, timing = await self.submit(slates, deadline, t0)
        return JSONResponse({"request_id": request.state.request_id, "model_version": res.model.version,
                             "rankings": [r.to_dict() for r in res.rankings], "timing": timing})

    async def models(self) -> dict:
        listing = self.state.model.listing()
        if self.state.versions is not None:
            listing["versions"] = self.state.versions.listing()
        return listing

    async def submit(self, slates: list[dict], deadline: float | None, t0: float, encoded: list | None = None,
                     pinned: tuple | None = None):
        """Encode validated slates at admission (unless ``encoded`` holds their rows already) and rank them in
        the batcher → (JobResult, timing in ms); the result's ``model`` and ``ranker`` are the version that
        ranked it: ``pinned`` (a :meth:`pin` the caller holds, whose builder encoded ``encoded``), else the
        version served at admission.

        The JobResult's score matrices follow the one rule of every route (:func:`assignment_blocks`).

        Raises: ApiError 400 (over max_documents), 422 (a slate the prompt builder refuses), 503 (queue full,
        shutting down), 504 (deadline), 500 (the engine batch failed, a non-finite score in a slate's assignment block).
        """
        if pinned is None:
            with self.pin() as own:
                return await self.submit(slates, deadline, t0, encoded, own)
        ranker, model = pinned
        if encoded is None:
            encoded = await run_in_threadpool(encode_slates, ranker, slates)
        t1 = time.perf_counter()
        self.metrics.stage.labels("validate").observe(t1 - t0)
        try:
            res = await self.batcher.submit(slates, deadline, encoded, ranker=ranker)
        except QueueFull as e:
            raise ApiError(503, "queue_full", str(e), {"Retry-After": str(e.retry_after_s)}) from None
        except ShuttingDown as e:
            raise ApiError(503, "not_ready", str(e), {"Retry-After": "1"}) from None
        except DeadlineExceeded as e:
            raise ApiError(504, "deadline", str(e)) from None
        except BatchFailed as e:
            raise ApiError(500, e.kind, str(e), error_id=e.error_id) from None
        try:
            res.scores = assignment_blocks(res.scores, res.rankings)
        except ApiError as e:
            log.error("%s (error id %s)", e.message, e.error_id)
            raise
        t2 = time.perf_counter()
        self.metrics.stage.labels("request").observe(t2 - t0)
        timing = {"validate_ms": round((t1 - t0) * 1e3, 3), **res.timing, "total_ms": round((t2 - t0) * 1e3, 3)}
        res.ranker, res.model = ranker, model
        observe_request(slates, timing, model.version)
        return res, timing

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
