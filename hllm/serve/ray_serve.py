"""The Ranker as a Ray Serve application: the app of ``hllm serve`` on every replica, ``@serve.batch``.

Ray's application-builder form (https://docs.ray.io/en/latest/serve/advanced-guides/app-builder-guide.html),
so every way Ray starts an application works::

    serve run hllm.serve.ray_serve:app_builder export=work/demo/export num_replicas=2
    serve run deploy/ray-serve.yaml                   # a Serve config file (serve build format)
    serve deploy deploy/ray-serve.yaml                # a running cluster; KubeRay RayService takes the same file

    from ray import serve
    from hllm.serve.ray_serve import app_builder
    serve.run(app_builder({"export": "work/demo/export", "num_replicas": 2}), route_prefix="/")

:func:`app_builder` takes ONE argument, a dict or :class:`RayServeArgs` (Ray validates the dict against
that pydantic model). Each replica (:class:`HllmRanker`) loads ONE engine (:class:`hllm.runtime.Ranker`,
activated and warmed up in its constructor) and serves, through ``@serve.ingress``, the SAME FastAPI app
``hllm serve`` runs (:func:`hllm.serve.app.create_app`): ``POST /v1/rank``, the Cohere / Jina rerank API
``POST /v1/rerank`` / ``/v2/rerank`` (:mod:`hllm.serve.rerank`), the Open Inference Protocol
``/v2/...`` (:mod:`hllm.serve.kserve`), ``/healthz``, ``/readyz``, ``/metrics`` (this replica's
counters), ``/docs``, the same ``{"error": {...}}`` envelope and ``X-Request-ID``. The only difference:
requests are merged into engine batches by Ray's ``@serve.batch`` (:class:`ServeBatcher`, at most
``max_batch_requests`` requests within ``batch_wait_timeout_s``) instead of ``hllm serve``'s
:class:`hllm.serve.batching.MicroBatcher`; queueing is bounded by Ray's ``max_ongoing_requests`` /
``max_queued_requests`` (over it: 503). Ray calls :meth:`HllmRanker.check_health` every
``health_check_period_s``; replicas take ``num_cpus`` / ``num_gpus``; ``autoscaling_config`` (Ray's
dict) replaces ``num_replicas``.

API keys (:mod:`hllm.serve.auth`): each replica reads them from ``$HLLM_API_KEYS`` in ITS environment (e.g. a
Kubernetes ``secretKeyRef`` on the Ray worker pods) and from ``api_key_file`` (a path on every node: a mounted
secret); the config file names at most the file, never a key (``args`` refuses unknown keys such as
``api_keys``). With no key found a replica refuses to start unless ``no_auth: true`` (:func:`replica_auth`).
``public_metrics`` / ``public_docs`` and ``served_model_names`` are those of ``hllm serve``.

Needs ``pip install 'hllm[ray]'``; imports neither torch nor transformers.
Ray Serve: https://docs.ray.io/en/latest/serve/http-guide.html (FastAPI ingress),
https://docs.ray.io/en/latest/serve/advanced-guides/dyn-req-batch.html (``@serve.batch``).
"""

# No ``from __future__ import annotations``: Ray reads app_builder's parameter annotation as a class.
import asyncio
import concurrent.futures
import logging
import os
import time
import uuid
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field
from ray import serve
from ray.serve import Application

from hllm.runtime.artefact import resolve
from hllm.runtime.ranker import Ranker
from hllm.serve.app import ServeOptions, create_app, warmup_slate
from hllm.serve.auth import ENV_VAR, AuthOptions, load_api_keys
from hllm.serve.models import DEFAULT_NAME, ServedModel, model_version
from hllm.serve.batching import (BatchFailed, BatchOptions, DeadlineExceeded, EngineThread, JobResult, ShuttingDown,
                                 error_kind)

log = logging.getLogger("hllm.serve")


class RayServeArgs(BaseModel):
    """The arguments of :func:`app_builder` (``serve run ... key=value`` or ``args:`` in a config file)."""

    model_config = ConfigDict(extra="forbid")

    export: str = Field(..., description="Export dir / .onnx, TensorRT .plan or checkpoint dir, as seen by the replicas.")
    name: str = Field("HllmRanker", description="Deployment name.")
    num_replicas: Union[int, Literal["auto"]] = Field(1, description="Replicas (ignored with autoscaling_config).")
    autoscaling_config: Optional[dict] = Field(None, description="Ray's autoscaling_config (min_replicas, max_replicas, "
                                               "target_ongoing_requests, ...); replaces num_replicas.")
    max_ongoing_requests: int = Field(16, ge=1, description="Requests a replica handles at once (≥ max_batch_requests).")
    max_queued_requests: int = Field(64, ge=-1, description="Requests waiting for a replica; more → 503 (-1: no bound).")
    num_cpus: float = Field(1.0, ge=0, description="CPUs per replica (ray_actor_options).")
    num_gpus: float = Field(0.0, ge=0, description="GPUs per replica (ray_actor_options).")
    threads: Optional[int] = Field(1, ge=1, description="Engine intra-op threads per replica.")
    max_batch_requests: int = Field(8, ge=1, description="@serve.batch max_batch_size (requests per engine batch).")
    batch_wait_timeout_s: float = Field(0.005, ge=0, description="@serve.batch batch_wait_timeout_s.")
    max_batch_slates: int = Field(8, ge=1, description="Most slates per engine call.")
    max_slates_per_request: int = Field(32, ge=1, description="More slates in one request → 413.")
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1, description="Larger bodies → 413.")
    deadline_ms: float = Field(60_000.0, gt=0, description="Default per-request deadline (ms) → 504.")
    health_check_period_s: float = Field(10.0, gt=0, description="How often Ray calls check_health.")
    health_check_timeout_s: float = Field(30.0, gt=0, description="check_health timeout.")
    graceful_shutdown_timeout_s: float = Field(20.0, ge=0, description="Drain time of a replica being stopped.")
    api_key_file: Optional[str] = Field(None, description=f"File of API keys (one a line) on every node, e.g. a mounted "
                                        f"secret; ${ENV_VAR} in the replicas' environment counts too. Never keys here.")
    no_auth: bool = Field(False, description="Serve without API keys (a replica with no key refuses to start otherwise).")
    public_metrics: bool = Field(False, description="/metrics answers without a key.")
    public_docs: bool = Field(False, description="/docs, /redoc and /openapi.json answer without a key.")
    served_model_names: list[str] = Field([DEFAULT_NAME], min_length=1, description="Names the model answers to.")


def replica_auth(a: RayServeArgs, env=None) -> Optional[AuthOptions]:
    """The API keys of a replica: ``a.api_key_file`` and ``$HLLM_API_KEYS`` of ``env`` (default: the replica's
    environment). None with ``no_auth``. Raises ValueError when keys are found with ``no_auth`` or none without it
    (the message names where keys are read, never a key); HllmError for a malformed key or key file."""
    keys = load_api_keys((), a.api_key_file, os.environ if env is None else env)
    if keys and a.no_auth:
        raise ValueError(f"no_auth is set but API keys were found (api_key_file or ${ENV_VAR}): choose one")
    if not keys and not a.no_auth:
        raise ValueError(f"no API key: set api_key_file (a mounted secret) or ${ENV_VAR} in the replicas' "
                         "environment, or no_auth: true to serve without keys")
    return AuthOptions(keys, a.public_metrics, a.public_docs) if keys else None


class ServeBatcher(EngineThread):
    """The :class:`hllm.serve.batching.MicroBatcher` interface of the app, batching with Ray's ``@serve.batch``.

    ``submit`` calls the replica's ``@serve.batch`` method :meth:`HllmRanker.rank_requests`, which runs
    :meth:`run_batch`: every request's slates in engine calls of at most ``max_batch_slates`` on ONE
    engine thread (the event loop never blocks). Raises from ``submit``: ShuttingDown, DeadlineExceeded
    (``deadline_ms``), BatchFailed (the batch's engine call raised; every request of the batch gets it).
    """

    def __init__(self, replica: Any, ranker: Any, options: BatchOptions, metrics: Any = None):
        self.replica, self.ranker, self.options, self.metrics = replica, ranker, options, metrics
        self._executor: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._closing = False
        self._batch_seq = 0

    async def start(self) -> None:
        if self._executor is None:
            self._open_engine_thread()

    async def close(self) -> None:
        self._closing = True
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def depth(self) -> int:
        return 0  # Ray's router and @serve.batch hold the queue

    async def submit(self, slates, deadline_ms: Optional[float] = None, encoded=None, ranker=None) -> JobResult:
        """Queue one request's (validated, encoded) slates on ``@serve.batch`` and await its rankings
        (``ranker`` is the replica's own: a replica serves one model version)."""
        if self._closing or self._executor is None:
            raise ShuttingDown("replica is shutting down")
        timeout = (deadline_ms or self.options.deadline_ms) / 1e3
        try:
            return await asyncio.wait_for(self.replica.rank_requests(list(slates), list(encoded), time.perf_counter()), timeout)
        except asyncio.TimeoutError:
            raise DeadlineExceeded(f"deadline of {timeout * 1e3:.0f} ms exceeded") from None

    def _rank(self, slates: list, encoded: list):
        res = self.ranker.rank(slates, encoded=encoded, batch_size=self.options.max_batch_slates)
        return res.rankings, res.times, res.scores

    async def run_batch(self, requests: list, encoded: list, enqueued: list) -> list:
        """One ``@serve.batch`` batch: ``requests[i]`` slates (``encoded[i]`` rows, queued at ``enqueued[i]``,
        ``time.perf_counter()``) → one :class:`JobResult` per request. Raises BatchFailed."""
        self._batch_seq += 1
        batch_id, start = self._batch_seq, time.perf_counter()
        slates = [s for req in requests for s in req]
        rows = [e for enc in encoded for e in enc]
        try:
            rankings, times, matrices = await self.run_in_engine_thread(self._rank, slates, rows)
        except Exception as e:  # noqa: BLE001 — fails this batch only
            error_id, kind = uuid.uuid4().hex[:12], error_kind(e)
            log.error("batch %d failed (error id %s, %s): %s", batch_id, error_id, kind, e)
            if self.metrics is not None:
                self.metrics.batch_failed(kind)
            raise BatchFailed(f"{kind} failure in batch {batch_id}: {e}", error_id, kind, batch_id) from None
        if self.metrics is not None:
            self.metrics.batch(len(slates), len(requests), times)
        out, i = [], 0
        for req, queued in zip(requests, enqueued):
            if self.metrics is not None:
                self.metrics.queue_wait(start - queued)
            timing = {"queue_ms": round((start - queued) * 1e3, 3), "prompt_ms": round(times.prompt_ms, 3),
                      "engine_ms": round(times.engine_ms, 3), "decode_ms": round(times.decode_ms, 3), "batch_id": batch_id,
                      "batch_slates": len(slates), "batch_requests": len(requests)}
            out.append(JobResult(rankings[i : i + len(req)], timing, matrices[i : i + len(req)]))
            i += len(req)
        return out


@serve.ingress()
class HllmRanker:
    """One replica: an engine and the ``hllm serve`` app over it (module doc). Built by :func:`app_builder`."""

    def __init__(self, args: dict):
        a = RayServeArgs.model_validate(args)
        self.args = a
        self.auth = replica_auth(a)  # before the engine: a replica without keys fails fast
        art = resolve(a.export)
        self.model = ServedModel(tuple(a.served_model_names), model_version(art.meta))
        self.ranker = Ranker.from_path(art, threads=a.threads)
        self.ranker.engine.activate()
        self.ranker.rank_batch([warmup_slate(self.ranker.engine.num_positions)])
        self.rank_requests.set_max_batch_size(a.max_batch_requests)
        self.rank_requests.set_batch_wait_timeout_s(a.batch_wait_timeout_s)
        self.batcher: Optional[ServeBatcher] = None
        self.state = None

    def __serve_build_asgi_app__(self):
        """The replica's ASGI app: :func:`hllm.serve.app.create_app` with a :class:`ServeBatcher` (Ray calls
        this after the constructor, then runs the app's lifespan)."""
        a = self.args

        def batcher(ranker, options, metrics):
            self.batcher = ServeBatcher(self, ranker, options, metrics)
            return self.batcher

        options = ServeOptions(batch=BatchOptions(max_batch_slates=a.max_batch_slates, deadline_ms=a.deadline_ms),
                               max_body_bytes=a.max_body_bytes, max_slates_per_request=a.max_slates_per_request,
                               warmup=False,  # warmed up in the constructor
                               echo_request_id=False)  # Ray's proxy honours and echoes X-Request-ID itself
        app = create_app(self.ranker, options, info={"model": a.export, "runtime": "ray_serve"}, batcher_factory=batcher,
                         auth=self.auth, model=self.model)
        self.state = app.state.hllm
        return app

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.005)
    async def rank_requests(self, requests: list, encoded: list, enqueued: list) -> list:
        """``@serve.batch``: the requests that reached this replica together → one JobResult each."""
        return await self.batcher.run_batch(requests, encoded, enqueued)

    def check_health(self) -> None:
        """Ray's health check. Raises RuntimeError when the engine failed to load."""
        if self.state is not None and self.state.load_error:
            raise RuntimeError(f"engine failed to load: {self.state.load_error}")


def app_builder(args: RayServeArgs) -> Application:
    """The Ray Serve application for ``args`` (a :class:`RayServeArgs` or its dict): :class:`HllmRanker`
    with Ray's deployment options from ``args``. Raises pydantic.ValidationError for bad arguments."""
    a = args if isinstance(args, RayServeArgs) else RayServeArgs.model_validate(args)
    if a.max_ongoing_requests < a.max_batch_requests:
        raise ValueError(f"max_ongoing_requests ({a.max_ongoing_requests}) must be ≥ max_batch_requests ({a.max_batch_requests})")
    scale = {"autoscaling_config": a.autoscaling_config} if a.autoscaling_config else {"num_replicas": a.num_replicas}
    deployment = serve.deployment(HllmRanker).options(
        name=a.name,
        **scale,
        max_ongoing_requests=a.max_ongoing_requests,
        max_queued_requests=a.max_queued_requests,
        ray_actor_options={"num_cpus": a.num_cpus, "num_gpus": a.num_gpus},
        health_check_period_s=a.health_check_period_s,
        health_check_timeout_s=a.health_check_timeout_s,
        graceful_shutdown_timeout_s=a.graceful_shutdown_timeout_s,
    )
    return deployment.bind(a.model_dump())


def ranker_app(model: str, num_replicas: int = 1, max_batch_requests: int = 8, batch_wait_timeout_s: float = 0.005,
               threads: Optional[int] = 1, max_batch_slates: int = 8, max_slates_per_request: int = 32) -> Application:
    """Shorthand for :func:`app_builder` with the common arguments (``model`` is ``export``)."""
    return app_builder(RayServeArgs(export=str(model), num_replicas=num_replicas, max_batch_requests=max_batch_requests,
                                    batch_wait_timeout_s=batch_wait_timeout_s, threads=threads,
                                    max_batch_slates=max_batch_slates, max_slates_per_request=max_slates_per_request))


#: The export a bare import path (``hllm.serve.ray_serve:app``, e.g. for ``serve build``) deploys.
DEFAULT_EXPORT = "work/demo/export"


def __getattr__(name: str):
    """``app``: :func:`app_builder` with the default arguments and ``export`` from ``$HLLM_EXPORT`` (else
    :data:`DEFAULT_EXPORT`), built on first access — for tools that want an Application at an import
    path (``serve build hllm.serve.ray_serve:app``)."""
    if name == "app":
        import os

        return app_builder({"export": os.environ.get("HLLM_EXPORT", DEFAULT_EXPORT)})
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
