"""Prometheus metrics of the ranking server (``prometheus_client``, one registry per app).

Exposed at ``GET /metrics`` in the Prometheus text format
(https://prometheus.github.io/client_python/). Names:

* ``hllm_requests_total{path, code}`` — every HTTP response the app sends, by path (``other`` for
  unknown paths) and status code (errors and unexpected exceptions included);
* ``hllm_errors_total{kind}`` — failed requests by cause (``bad_json``, ``bad_request``, ``bad_slate``,
  ``too_large``, ``unsupported_media_type``, ``not_found``, ``method_not_allowed``, ``timeout``,
  ``queue_full``, ``not_ready``, ``deadline``, ``engine``, ``decode``, ``shape``, ``slate``, ``internal``);
* ``hllm_stage_seconds{stage}`` — histogram per stage: ``validate`` (admission checks), ``queue``,
  ``prompt``, ``engine``, ``decode`` (per batch) and ``request`` (end to end inside the server);
* ``hllm_request_duration_seconds{path}`` — histogram of every response's end-to-end latency inside the
  server (arrival of the request at the app → response), by path as in ``hllm_requests_total``;
* ``hllm_batch_slates`` / ``hllm_batch_requests`` — histograms of engine-batch sizes;
* ``hllm_failed_batches_total{kind}``; ``hllm_queue_depth`` (gauge); ``hllm_ready`` (gauge, 0/1).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

#: Seconds; covers tiny test models (sub-ms) to real CPU batches (tens of seconds).
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80)
SIZE_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)


class ServeMetrics:
    """The server's metrics in their own :class:`CollectorRegistry` (so several apps can coexist)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("hllm_requests", "HTTP requests by path and status code.", ["path", "code"], registry=r)
        self.errors = Counter("hllm_errors", "Failed requests by cause.", ["kind"], registry=r)
        self.stage = Histogram("hllm_stage_seconds", "Latency per stage.", ["stage"], buckets=LATENCY_BUCKETS, registry=r)
        self.latency = Histogram("hllm_request_duration_seconds", "End-to-end latency of every response inside the server, by path.",
                                 ["path"], buckets=LATENCY_BUCKETS, registry=r)
        self.batch_slates = Histogram("hllm_batch_slates", "Slates per engine batch.", buckets=SIZE_BUCKETS, registry=r)
        self.batch_requests = Histogram("hllm_batch_requests", "Requests per engine batch.", buckets=SIZE_BUCKETS, registry=r)
        self.failed_batches = Counter("hllm_failed_batches", "Engine batches that raised.", ["kind"], registry=r)
        self.depth = Gauge("hllm_queue_depth", "Requests waiting for the engine.", registry=r)
        self.ready = Gauge("hllm_ready", "1 once the engine is loaded and warmed up.", registry=r)

    # -- observer interface of MicroBatcher ------------------------------------------------------------
    def batch(self, n_slates: int, n_requests: int, times) -> None:
        """One finished engine batch; ``times`` is a :class:`hllm.runtime.ranker.StageTimes` (ms)."""
        self.batch_slates.observe(n_slates)
        self.batch_requests.observe(n_requests)
        self.stage.labels("prompt").observe(times.prompt_ms / 1e3)
        self.stage.labels("engine").observe(times.engine_ms / 1e3)
        self.stage.labels("decode").observe(times.decode_ms / 1e3)

    def batch_failed(self, kind: str) -> None:
        self.failed_batches.labels(kind).inc()

    def queue_depth(self, n: int) -> None:
        self.depth.set(n)

    def queue_wait(self, seconds: float) -> None:
        self.stage.labels("queue").observe(seconds)

    # -- HTTP layer ---------------------------------------------------------------------------------------
    def error(self, kind: str) -> None:
        self.errors.labels(kind).inc()

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
