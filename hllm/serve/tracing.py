"""Request traces (OpenTelemetry) and access logs of ``hllm serve``.

:class:`TelemetryMiddleware` (pure ASGI) wraps every request:

* **trace** (when a tracer is given): one SERVER span per request, named ``METHOD ROUTE`` (the route
  template, e.g. ``POST /v2/models/{model_name}/infer``), with the attributes ``http.request.method``,
  ``http.route``, ``url.path``, ``http.response.status_code``, ``hllm.request_id``, ``hllm.slates``,
  ``hllm.documents`` (candidates over the request's slates), ``hllm.model_version``; a 5xx sets the span's
  status to ERROR. A request that reached the engine gets four child spans: ``tokenize`` (admission:
  parse, validate and encode), ``queue wait`` (waiting for its engine batch), ``engine`` (the batch's
  engine call) and ``decode`` (LAPJV). The children are laid out from the request's ``timing``
  (:mod:`hllm.serve.schemas`): the engine and decode spans are the stage times of the whole engine batch
  the request rode in (shared by its requests; summed over the chunks of a request over the batch size),
  placed after the queue wait and the batch's prompt padding. Spans follow the OpenTelemetry HTTP semantic
  conventions (https://opentelemetry.io/docs/specs/semconv/http/http-spans/).
* **access log**: one record per request on the ``hllm.access`` logger (INFO) with ``request_id``,
  ``method``, ``route``, ``status``, ``latency_ms``, ``slates``, ``documents``, ``model_version``: a JSON
  object per line with ``--log-format json`` (:class:`JsonFormatter`, which also formats every other log
  record of the server), else ``key=value`` text.
* the ``X-Model-Version`` header on every response (:mod:`hllm.serve.models`).

The counts reach the middleware from inside the endpoint through :func:`observe_request` (a context
variable holding this request's :class:`RequestRecord`). opentelemetry is imported only by
:func:`otlp_tracer` (the ``otel`` extra): the server runs without it when tracing is off.
"""

from __future__ import annotations

import contextvars
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from hllm.extras import require

access_log = logging.getLogger("hllm.access")

_current: contextvars.ContextVar["RequestRecord | None"] = contextvars.ContextVar("hllm_request", default=None)

#: The child spans of a request and the ``timing`` keys (ms) that give their durations.
STAGES = (("tokenize", "validate_ms"), ("queue wait", "queue_ms"), ("engine", "engine_ms"), ("decode", "decode_ms"))


@dataclass
class RequestRecord:
    """What the endpoint tells the middleware: slate and document counts, the timing, when it was measured,
    the model version that ranked the request."""

    slates: int = 0
    documents: int = 0
    timing: dict | None = None
    done_ns: int = 0  # time.time_ns() when the timing was taken
    model_version: str | None = None


def observe_request(slates: list[dict], timing: dict, model_version: str | None = None) -> None:
    """Record the ranked ``slates``, their ``timing`` (ms) and the ``model_version`` that ranked them for the
    current request's span, header and access log (no-op outside :class:`TelemetryMiddleware`)."""
    rec = _current.get()
    if rec is not None:
        rec.model_version = model_version or rec.model_version
        rec.slates += len(slates)
        rec.documents += sum(len(s.get("candidates") or ()) for s in slates)
        rec.timing, rec.done_ns = dict(timing), time.time_ns()


def otlp_tracer(endpoint: str, service_name: str = "hllm-serve"):
    """An OpenTelemetry tracer whose spans go to the OTLP/HTTP collector at ``endpoint`` (e.g.
    ``http://otel-collector:4318/v1/traces``) in batches; its own provider (the global one is left alone).

    Raises: MissingExtraError naming the ``otel`` extra when opentelemetry is not installed.
    """
    trace_sdk = require("opentelemetry.sdk.trace")
    export = require("opentelemetry.sdk.trace.export")
    resources = require("opentelemetry.sdk.resources")
    otlp = require("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    provider = trace_sdk.TracerProvider(resource=resources.Resource.create({"service.name": service_name}))
    provider.add_span_processor(export.BatchSpanProcessor(otlp.OTLPSpanExporter(endpoint=endpoint)))
    return provider.get_tracer("hllm.serve")


class JsonFormatter(logging.Formatter):
    """Log records as one JSON object a line: ``ts`` (ISO 8601, UTC), ``level``, ``logger``, ``message``, and
    an access record's fields (its ``access`` extra) at the top level."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
               "level": record.levelname.lower(), "logger": record.name}
        access = getattr(record, "access", None)
        if isinstance(access, dict):
            doc.update(access)
        else:
            doc["message"] = record.getMessage()
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


class TelemetryMiddleware:
    """Pure ASGI middleware: the request's span and access-log record (module doc).

    Args:
        app: the ASGI app it wraps. tracer: an OpenTelemetry ``Tracer`` or None (no spans).
        model_version: the ``hllm.model_version`` attribute / log field / ``X-Model-Version`` header of a
            request that ranked nothing: a string, or a function giving the served version (it changes on a
            live reload); a ranked request's is the version that ranked it (:func:`observe_request`).
        access: emit the access-log record.
    """

    def __init__(self, app, tracer: Any = None, model_version: Any = "", access: bool = True):
        self.app, self.tracer, self.access = app, tracer, access
        self.served_version = model_version if callable(model_version) else (lambda: model_version)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start_ns, t0 = time.time_ns(), time.perf_counter()
        rec = RequestRecord()
        token = _current.set(rec)
        status = [500]
        served = self.served_version()

        async def send_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                version = (rec.model_version or served).encode("latin-1", "replace")
                message = {**message, "headers": [*message.get("headers", ()), (b"x-model-version", version)]}
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            _current.reset(token)
            latency_ms = (time.perf_counter() - t0) * 1e3
            route = getattr(scope.get("route"), "path", None) or scope.get("path", "")
            rid = (scope.get("state") or {}).get("request_id")
            if self.tracer is not None:
                self._spans(scope, rec, route, rid, status[0], start_ns, time.time_ns())
            if self.access and access_log.isEnabledFor(logging.INFO):
                fields = {"request_id": rid, "method": scope.get("method"), "route": route, "status": status[0],
                          "latency_ms": round(latency_ms, 3), "slates": rec.slates, "documents": rec.documents,
                          "model_version": rec.model_version or served}
                access_log.info(" ".join(f"{k}={v}" for k, v in fields.items()), extra={"access": fields})

    def _spans(self, scope, rec: RequestRecord, route: str, rid, status: int, start_ns: int, end_ns: int) -> None:
        from opentelemetry import trace  # the tracer exists: opentelemetry is installed

        attrs = {"http.request.method": scope.get("method", ""), "http.route": route, "url.path": scope.get("path", ""),
                 "http.response.status_code": status, "hllm.request_id": rid or "", "hllm.slates": rec.slates,
                 "hllm.documents": rec.documents, "hllm.model_version": rec.model_version or self.served_version()}
        root = self.tracer.start_span(f"{scope.get('method', '')} {route}", kind=trace.SpanKind.SERVER,
                                      start_time=start_ns, attributes=attrs)
        if status >= 500:
            root.set_status(trace.Status(trace.StatusCode.ERROR, f"HTTP {status}"))
        t = rec.timing
        if t:
            ctx = trace.set_span_in_context(root)
            cursor = max(start_ns, rec.done_ns - int(t.get("total_ms", 0.0) * 1e6))
            for name, key in STAGES:
                if name == "engine":
                    cursor += int(t.get("prompt_ms", 0.0) * 1e6)
                dur = int(t.get(key, 0.0) * 1e6)
                child = self.tracer.start_span(name, context=ctx, start_time=cursor,
                                               attributes={"hllm.batch_id": t.get("batch_id", -1),
                                                           "hllm.batch_slates": t.get("batch_slates", 0)}
                                               if name in ("engine", "decode") else None)
                cursor = min(cursor + dur, end_ns)
                child.end(end_time=cursor)
        root.end(end_time=end_ns)
