"""Dynamic micro-batching of rank requests in front of one :class:`hllm.runtime.Ranker` (torch-free).

Requests that arrive within ``max_wait_ms`` of the oldest waiting one are merged into ONE engine call
of at most ``max_batch_slates`` slates (right-padded by the runtime's :class:`PromptBuilder`, the only
prompt builder), then each caller gets exactly its own slates' rankings back. This is the scheme of
Triton's dynamic batcher (``max_queue_delay_microseconds`` measured from the oldest queued request,
https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/user_guide/batcher.html).

* The queue is bounded (``max_queue`` requests): :meth:`MicroBatcher.submit` raises :class:`QueueFull`
  instead of letting it grow; the HTTP layer answers 503 + ``Retry-After``.
* Every request has a deadline; one that expires while waiting is dropped before the engine runs and
  its caller gets :class:`DeadlineExceeded` (HTTP 504).
* The engine runs in ONE worker thread (``ThreadPoolExecutor(max_workers=1)``); the asyncio event loop
  only collects and dispatches, so it never blocks on the engine.
* An exception from the engine (or decode) fails only the requests of that batch, with
  :class:`BatchFailed` carrying an error id that is also logged; the collector keeps serving.
* :meth:`MicroBatcher.close` stops admission and drains what is queued (graceful shutdown);
  :meth:`MicroBatcher.abandon` ends a drain that ran out of time: every request not yet answered gets
  :class:`ShuttingDown` (HTTP 503) at once.

Each request runs on the ranker it was submitted with (``submit(..., ranker=)``, default the batcher's
``ranker``): a batch holds requests of one ranker only, so a model version swapped in while requests wait
(:mod:`hllm.serve.repository`) never shares a batch with the one it replaces.

A request with more slates than ``max_batch_slates`` runs alone, in chunks of ``max_batch_slates``. A slate
ranked in B blocks (:mod:`hllm.runtime.blocks`) counts as B + 1 slates of work (:func:`hllm.runtime.blocks.work`).
``max_batch_slates=1, max_wait_ms=0`` turns micro-batching off (one engine call per slate).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Sequence

from hllm.errors import DecodeError, EngineError, HllmError, ShapeError, SlateError
from hllm.runtime.blocks import work

log = logging.getLogger("hllm.serve")


@dataclass(frozen=True)
class BatchOptions:
    """Micro-batching options.

    Attributes:
        max_batch_slates: most slates in one engine call (≥ 1).
        max_wait_ms: how long the oldest waiting request may wait for others to join its batch (ms, ≥ 0).
        max_queue: most requests waiting for the engine (not counting the running batch); more → QueueFull.
        deadline_ms: default per-request deadline from admission to answer (ms).
        retry_after_s: the ``Retry-After`` a caller is told when the queue is full (s).
    """

    max_batch_slates: int = 8
    max_wait_ms: float = 5.0
    max_queue: int = 64
    deadline_ms: float = 60_000.0
    retry_after_s: int = 1

    def __post_init__(self):
        if self.max_batch_slates < 1:
            raise HllmError(f"max_batch_slates must be ≥ 1, got {self.max_batch_slates}")
        if self.max_wait_ms < 0:
            raise HllmError(f"max_wait_ms must be ≥ 0, got {self.max_wait_ms}")
        if self.max_queue < 1:
            raise HllmError(f"max_queue must be ≥ 1, got {self.max_queue}")
        if self.deadline_ms <= 0:
            raise HllmError(f"deadline_ms must be > 0, got {self.deadline_ms}")

    @property
    def batching(self) -> bool:
        """False when every slate runs alone (``max_batch_slates == 1``)."""
        return self.max_batch_slates > 1


class QueueFull(Exception):
    """The bounded queue is full; retry after ``retry_after_s`` seconds (HTTP 503)."""

    def __init__(self, depth: int, retry_after_s: int):
        super().__init__(f"queue full ({depth} requests waiting); retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s


class ShuttingDown(Exception):
    """The batcher is draining or closed and admits nothing new (HTTP 503)."""


class DeadlineExceeded(Exception):
    """The request's deadline passed before its ranking was ready (HTTP 504)."""


class BatchFailed(Exception):
    """The engine call of this request's batch failed (HTTP 500).

    Attributes:
        error_id: id of the failure, also in the server log with its traceback.
        kind: ``engine``, ``decode``, ``shape``, ``slate`` or ``internal``.
        batch_id: the batch that failed.
    """

    def __init__(self, message: str, error_id: str, kind: str, batch_id: int):
        super().__init__(message)
        self.error_id = error_id
        self.kind = kind
        self.batch_id = batch_id


@dataclass
class JobResult:
    """What one caller gets back: its rankings (in its slate order) and timing in ms.

    ``timing`` keys: ``queue_ms`` (admission → engine thread start), ``prompt_ms``, ``engine_ms``,
    ``decode_ms`` (the whole batch's stage times, shared by its requests), ``batch_id``,
    ``batch_slates``, ``batch_requests``. ``scores``: each slate's score matrix ``[n, K]`` float32
    (:attr:`hllm.runtime.ranker.RankResult.scores`), for the Open Inference Protocol's ``scores`` output.
    ``ranker`` and ``model``: the ranker that ranked it and its :class:`hllm.serve.models.ServedModel`
    (set by the app's service, :meth:`hllm.serve.app.RankService.submit`).
    """

    rankings: list
    timing: dict
    scores: list = field(default_factory=list)
    ranker: Any = None
    model: Any = None


@dataclass
class _Job:
    slates: Sequence[dict]
    encoded: Sequence | None  # PromptBuilder.encode_one rows, when the caller already encoded
    future: asyncio.Future
    enqueued: float  # time.perf_counter()
    deadline: float  # time.perf_counter() at which the caller gives up
    ranker: Any = None  # the ranker (model version) this request runs on
    started: float = 0.0

    @property
    def work(self) -> int:
        """Engine rows of this job: one per slate, B + 1 per slate ranked in B blocks."""
        return len(self.slates) if self.encoded is None else sum(work(e) for e in self.encoded)


def error_kind(e: BaseException) -> str:
    """The kind of a ranking error as the server reports it: ``engine``, ``decode``, ``shape``, ``slate``
    (hllm's error types) or ``internal`` (anything else)."""
    for cls, kind in ((EngineError, "engine"), (DecodeError, "decode"), (ShapeError, "shape"), (SlateError, "slate")):
        if isinstance(e, cls):
            return kind
    return "internal"


@dataclass
class _Stats:
    batches: int = 0
    failed_batches: int = 0
    sizes: collections.Counter = field(default_factory=collections.Counter)


class EngineThread:
    """The one worker thread that owns an engine (engines are not shared between threads): batchers open it in
    ``start`` and run every engine call on it, so the event loop never blocks. Raises ShuttingDown from
    :meth:`run_in_engine_thread` before it is opened."""

    _executor: concurrent.futures.ThreadPoolExecutor | None = None

    def _open_engine_thread(self) -> None:
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="hllm-engine")

    async def run_in_engine_thread(self, fn, *args):
        """Run ``fn(*args)`` on the engine thread (e.g. activation and warm-up) and await it."""
        if self._executor is None:
            raise ShuttingDown("batcher not started")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)


class MicroBatcher(EngineThread):
    """Collects rank requests into engine batches (see the module docstring).

    Args:
        ranker: a :class:`hllm.runtime.Ranker` (anything with ``rank_batch(slates, encoded)`` returning a
            :class:`hllm.runtime.ranker.RankResult`); its engine is used from the single worker thread only.
        options: :class:`BatchOptions`.
        metrics: optional observer with ``batch(n_slates, n_requests, times)``, ``queue_depth(n)``,
            ``queue_wait(seconds)`` (see :class:`hllm.serve.metrics.ServeMetrics`).

    Use inside a running event loop: ``await start()``, ``await submit(slates)``, ``await close()``.
    """

    def __init__(self, ranker: Any, options: BatchOptions, metrics: Any = None):
        self.ranker = ranker
        self.options = options
        self.metrics = metrics
        self.stats = _Stats()
        self._pending: collections.deque[_Job] = collections.deque()
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._closing = False
        self._batch_seq = 0
        self._running: list[_Job] = []  # the jobs of the batch on the engine thread

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the collector task and the engine thread (idempotent)."""
        if self._task is not None:
            return
        self._wakeup = asyncio.Event()
        self._open_engine_thread()
        self._task = asyncio.get_running_loop().create_task(self._collect(), name="hllm-batcher")

    async def close(self) -> None:
        """Stop admitting; finish every queued request; stop the engine thread."""
        self._closing = True
        if self._task is None:
            return
        self._wakeup.set()
        await self._task
        self._executor.shutdown(wait=True)

    def abandon(self, reason: str) -> int:
        """Stop admitting and answer every request not answered yet — queued, or in the batch the engine
        is running (that call finishes; its results are dropped) — with :class:`ShuttingDown` (``reason``).
        For the end of a graceful shutdown's time. Returns how many requests were answered so."""
        self._closing = True
        n = 0
        for j in [*self._running, *self._pending]:
            if not j.future.done():
                j.future.set_exception(ShuttingDown(reason))
                n += 1
        self._pending.clear()
        self._observe_depth()
        if self._wakeup is not None:
            self._wakeup.set()
        return n

    @property
    def depth(self) -> int:
        """Requests waiting for the engine (not counting the running batch)."""
        return len(self._pending)

    @property
    def closing(self) -> bool:
        return self._closing

    # -- admission ---------------------------------------------------------------------------------
    async def submit(self, slates: Sequence[dict], deadline_ms: float | None = None,
                     encoded: Sequence | None = None, ranker: Any = None) -> JobResult:
        """Queue ``slates`` (already validated) and await their rankings.

        ``encoded``: the slates' :meth:`PromptBuilder.encode_one` rows when admission already encoded
        them (then they are not tokenized again), by ``ranker``'s builder. ``ranker``: the one to rank
        them with (default :attr:`ranker`).

        Raises: QueueFull, ShuttingDown, DeadlineExceeded, BatchFailed.
        """
        if self._closing or self._task is None:
            raise ShuttingDown("server is shutting down" if self._closing else "batcher not started")
        if len(self._pending) >= self.options.max_queue:
            raise QueueFull(len(self._pending), self.options.retry_after_s)
        timeout = (deadline_ms or self.options.deadline_ms) / 1e3
        now = time.perf_counter()
        job = _Job(list(slates), None if encoded is None else list(encoded),
                   asyncio.get_running_loop().create_future(), now, now + timeout, ranker or self.ranker)
        self._pending.append(job)
        self._observe_depth()
        self._wakeup.set()
        try:
            return await asyncio.wait_for(job.future, timeout)
        except asyncio.TimeoutError:
            raise DeadlineExceeded(f"deadline of {timeout * 1e3:.0f} ms exceeded") from None

    # -- collection ----------------------------------------------------------------------------------
    def _observe_depth(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth(len(self._pending))

    def _pending_slates(self) -> int:
        return sum(j.work for j in self._pending)

    async def _wait(self, seconds: float) -> None:
        self._wakeup.clear()
        try:
            await asyncio.wait_for(self._wakeup.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    async def _collect(self) -> None:
        opt = self.options
        max_wait = opt.max_wait_ms / 1e3
        while True:
            while not self._pending:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
            # Wait for the batch to fill, at most max_wait after the oldest request arrived.
            while not self._closing and self._pending_slates() < opt.max_batch_slates:
                remaining = self._pending[0].enqueued + max_wait - time.perf_counter()
                if remaining <= 0:
                    break
                await self._wait(remaining)
            if not self._pending:  # abandoned while the batch filled
                continue
            jobs = [self._pending.popleft()]
            n = jobs[0].work
            while (self._pending and n + self._pending[0].work <= opt.max_batch_slates
                   and self._pending[0].ranker is jobs[0].ranker):
                n += self._pending[0].work
                jobs.append(self._pending.popleft())
            self._observe_depth()
            now = time.perf_counter()
            live = []
            for j in jobs:
                if j.future.done():  # the caller gave up (deadline) or went away
                    continue
                if now >= j.deadline:
                    j.future.set_exception(DeadlineExceeded("deadline exceeded while queued"))
                    continue
                live.append(j)
            if live:
                await self._run(live)

    async def _run(self, jobs: list[_Job]) -> None:
        self._batch_seq += 1
        batch_id = self._batch_seq
        slates = [s for j in jobs for s in j.slates]
        encoded = None if any(j.encoded is None for j in jobs) else [e for j in jobs for e in j.encoded]
        start = time.perf_counter()
        for j in jobs:
            j.started = start
            if self.metrics is not None:
                self.metrics.queue_wait(start - j.enqueued)
        loop = asyncio.get_running_loop()
        self._running = jobs
        try:
            rankings, times, matrices = await loop.run_in_executor(self._executor, self._rank, slates, encoded, jobs[0].ranker)
        except Exception as e:  # noqa: BLE001 — any engine failure fails this batch only
            error_id = uuid.uuid4().hex[:12]
            kind = error_kind(e)
            log.error("batch %d failed (error id %s, %s): %s", batch_id, error_id, kind, e, exc_info=not isinstance(e, HllmError))
            self.stats.failed_batches += 1
            if self.metrics is not None:
                self.metrics.batch_failed(kind)
            msg = f"{kind} failure in batch {batch_id}: {e}"
            for j in jobs:
                if not j.future.done():
                    j.future.set_exception(BatchFailed(msg, error_id, kind, batch_id))
            return
        finally:
            self._running = []
        self.stats.batches += 1
        self.stats.sizes[len(slates)] += 1
        if self.metrics is not None:
            self.metrics.batch(len(slates), len(jobs), times)
        i = 0
        for j in jobs:
            mine, my_scores = rankings[i : i + len(j.slates)], matrices[i : i + len(j.slates)]
            i += len(j.slates)
            if j.future.done():
                continue
            j.future.set_result(
                JobResult(
                    mine,
                    {
                        "queue_ms": round((j.started - j.enqueued) * 1e3, 3),
                        "prompt_ms": round(times.prompt_ms, 3),
                        "engine_ms": round(times.engine_ms, 3),
                        "decode_ms": round(times.decode_ms, 3),
                        "batch_id": batch_id,
                        "batch_slates": len(slates),
                        "batch_requests": len(jobs),
                    },
                    my_scores,
                )
            )

    def _rank(self, slates: list[dict], encoded: list | None = None, ranker: Any = None):
        """Engine thread: rank ``slates`` with ``ranker`` (default :attr:`ranker`) in chunks of
        ``max_batch_slates`` → (rankings, summed stage times, score matrices ``[n, K]`` per slate)."""
        res = (ranker or self.ranker).rank(slates, encoded=encoded, batch_size=self.options.max_batch_slates)
        return res.rankings, res.times, res.scores
