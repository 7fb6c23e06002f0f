"""Versioned model repositories for ``hllm serve``: numbered version folders, the newest valid one served,
the next one loaded, checked and swapped in live (``POST /admin/reload``, SIGHUP).

Layout (Triton's versioned model repository; OpenVINO Model Server's ``latest`` version policy with one
version served)::

    REPO/
      1/   an export dir (export.json, model.onnx, tokenizer.json), a checkpoint dir,
      2/   or a folder holding ONE TensorRT .plan / .engine file (with its .plan.json sidecar)
      ...

A version folder's name is a positive integer without leading zeros (at most 18 digits); other entries of
``REPO`` are ignored. A path that is itself an artefact (an export dir, ...) is served as before, without
versions. In a repository the served ``model_version`` (every response, ``GET /v1/models``, the KServe
``model_version``) is the version folder's number, e.g. ``"2"``; ``GET /v1/models`` also lists ``versions``
(:meth:`VersionRecord.to_dict`: ``version``, ``state`` — ``loading``, ``serving``, ``retired`` or
``refused`` —, ``reason``, ``artefact_version`` — :func:`hllm.serve.models.model_version` of its sidecar —
and ``path``).

Start: the highest version whose artefact resolves (:func:`hllm.runtime.artefact.resolve`) is served; a
version that does not resolve is listed as ``refused`` with the reason. The served one is activated,
warmed and checked (:func:`check_version`) in the background as a plain export is; failing that,
``/readyz`` reports ``load_failed`` until a reload serves a version.

Reload (:meth:`VersionManager.request_reload`; one at a time — a second request joins the running one):
the versions are scanned again, from the highest down; each one above — or, when the served folder was
removed, below — the served one is loaded on a loader thread (:func:`load_version`: resolve with the graph's
sha256 checked, open, activate, warm, :func:`check_version`) while the served one keeps answering. The
first that passes is swapped in atomically (one step of the event loop: requests admitted before it run,
whole, on the version they were admitted on — the micro-batcher never mixes versions in one batch, and
each response's ``model_version`` is the version that ranked it; requests admitted after it run on the new
one). The old engine is deactivated once its last request is answered. A version that fails is
``refused`` (the reason is logged at ERROR and listed) and the next lower one is tried; the served version
keeps serving whatever fails. Refused versions are tried again at the next reload (the folder may have been
fixed). Copy a new version in under another name and rename it to its number when complete (a rename is
atomic): a half-copied folder fails the size or hash check and is refused.

The version check (:func:`check_version`), run after warm-up on every version before it serves:

1. the export's recorded validation passed (sidecar ``validation.max_abs_diff <= validation.atol``, when
   recorded: the export's ONNX-vs-PyTorch agreement);
2. the fixed probe slate (:func:`probe_slate`, ``min(K, 8)`` candidates) scores ``[n, K]`` finite values,
   its order is a permutation of its ``n`` candidates, and scoring it again gives the same matrix
   (|Δ| ≤ 1e-5: a deterministic engine).
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from hllm.errors import HllmError
from hllm.runtime import Ranker
from hllm.runtime.artefact import PLAN_SUFFIXES, artefact_kind, resolve
from hllm.serve.models import DEFAULT_NAME, ServedModel, model_version

log = logging.getLogger("hllm.serve")

#: A version folder's name: a positive integer without leading zeros.
VERSION_RE = re.compile(r"[1-9][0-9]{0,17}")
#: Largest |Δscore| between two runs of the probe slate on one engine.
REPEAT_ATOL = 1e-5
#: How often a retiring engine's in-flight count is polled (s).
RETIRE_POLL_S = 0.01


class VersionRefused(HllmError):
    """A version that cannot serve: it failed to resolve, load, warm or pass :func:`check_version`."""


def version_folders(root: str | Path) -> list[tuple[int, Path]]:
    """The version folders of ``root`` as ``(number, folder)``, lowest first (module doc). Reads names only."""
    root = Path(root)
    try:
        entries = list(root.iterdir())
    except OSError as e:
        raise HllmError(f"model repository {root}: {e.strerror or e}") from None
    return sorted((int(p.name), p) for p in entries if VERSION_RE.fullmatch(p.name) and p.is_dir())


def is_repository(path: str | Path) -> bool:
    """True when ``path`` is a directory that is not an artefact itself and holds a version folder."""
    p = Path(path)
    return p.is_dir() and artefact_kind(p) is None and bool(version_folders(p))


def version_artefact(folder: Path) -> Path:
    """The artefact path of a version folder: the folder itself (export or checkpoint dir), or the one
    ``.plan`` / ``.engine`` file in it. Raises: VersionRefused (none, or several plans)."""
    if artefact_kind(folder) is not None:
        return folder
    plans = sorted(p for p in folder.iterdir() if p.suffix in PLAN_SUFFIXES and p.is_file())
    if len(plans) == 1:
        return plans[0]
    if plans:
        raise VersionRefused(f"{folder}: {len(plans)} TensorRT plans ({', '.join(p.name for p in plans[:4])}); keep one")
    raise VersionRefused(f"{folder}: no export.json, hllm.json or .plan file: not a model version")


def probe_slate(k: int) -> dict:
    """The fixed slate every version is checked on: ``min(k, 8)`` candidates, a two-item history."""
    n = max(1, min(int(k), 8))
    titles = ("a red wool scarf", "noise-cancelling headphones", "a paperback mystery novel", "trail running shoes",
              "a cast iron skillet", "a desk lamp with a dimmer", "a set of watercolour paints", "a travel mug")
    return {"slate_id": "version-check", "history": ["a hiking backpack", "a thermos flask"],
            "candidates": [{"item_id": f"p{i}", "title": titles[i]} for i in range(n)]}


def check_version(ranker: Any, meta: dict | None) -> None:
    """The version check (module doc) of an activated, warmed ranker whose sidecar is ``meta``.

    Raises: VersionRefused naming the failed rule.
    """
    val = (meta or {}).get("validation")
    if isinstance(val, dict) and isinstance(val.get("max_abs_diff"), (int, float)) and isinstance(val.get("atol"), (int, float)):
        if not float(val["max_abs_diff"]) <= float(val["atol"]):
            raise VersionRefused(f"the export's recorded validation failed: max |Δscores| {val['max_abs_diff']} "
                                 f"over atol {val['atol']}")
    k = ranker.engine.num_positions
    slate = probe_slate(k)
    n = len(slate["candidates"])
    first, again = ranker.rank_batch([slate]), ranker.rank_batch([slate])
    m = np.asarray(first.scores[0])
    if m.shape != (n, k):
        raise VersionRefused(f"probe slate: score matrix of shape {list(m.shape)}, expected [{n}, {k}]")
    if not np.isfinite(m).all():
        raise VersionRefused(f"probe slate: {int((~np.isfinite(m)).sum())} non-finite scores")
    order = list(first.rankings[0].order)
    if sorted(order) != list(range(n)):
        raise VersionRefused(f"probe slate: the order {order[:16]} is not a permutation of its {n} candidates")
    diff = float(np.max(np.abs(m - np.asarray(again.scores[0]))))
    if not diff <= REPEAT_ATOL:
        raise VersionRefused(f"probe slate: two runs differ by {diff:.3g} (> {REPEAT_ATOL:g}): the engine is not deterministic")


def _reason(e: BaseException) -> str:
    text = str(e) if isinstance(e, HllmError) else f"{type(e).__name__}: {e}"
    return text[:2000]


def load_version(folder: Path, open_options: dict | None = None, warmup: dict | None = None) -> tuple[Any, dict]:
    """Load one version on the calling thread: resolve (sha256 checked), open, activate, warm with the slate
    ``warmup`` (default :func:`probe_slate`), :func:`check_version` → (activated Ranker, its sidecar dict).

    Raises: VersionRefused with the reason (the engine is deactivated again).
    """
    try:
        art = resolve(version_artefact(folder), verify_hash=True)
        ranker = Ranker.from_path(art, **(open_options or {}))
    except Exception as e:  # noqa: BLE001 — any failure refuses the version, the server keeps serving
        raise VersionRefused(_reason(e)) from e
    try:
        ranker.engine.activate()
        ranker.rank_batch([warmup or probe_slate(ranker.engine.num_positions)])
        check_version(ranker, art.meta)
    except Exception as e:  # noqa: BLE001
        ranker.engine.deactivate()
        raise (e if isinstance(e, VersionRefused) else VersionRefused(_reason(e))) from e
    return ranker, art.meta


@dataclass
class VersionRecord:
    """What the server knows about one version folder (listed by ``GET /v1/models``)."""

    number: int
    path: Path
    state: str  # loading | serving | retired | refused
    reason: str | None = None
    artefact_version: str | None = None
    changed: float = 0.0  # time.time() of the last state change

    def set(self, state: str, reason: str | None = None) -> None:
        self.state, self.reason, self.changed = state, reason, time.time()

    def to_dict(self) -> dict:
        return {"version": str(self.number), "state": self.state, "reason": self.reason,
                "artefact_version": self.artefact_version, "path": str(self.path),
                "changed": round(self.changed, 3)}


class VersionManager:
    """The versions of one repository and the live swap (module doc).

    Built by :meth:`open`; :func:`hllm.serve.app.create_app` binds it to the app's state (:meth:`attach`).
    Every method but :meth:`open` runs on the server's event loop.
    """

    def __init__(self, root: str | Path, names: tuple[str, ...] = (DEFAULT_NAME,), open_options: dict | None = None):
        self.root = Path(root)
        self.names = tuple(names)
        self.open_options = dict(open_options or {})
        self.records: dict[int, VersionRecord] = {}
        self.current: int | None = None
        self.state: Any = None
        self._meta: dict | None = None  # the sidecar of the version served at start
        self._reload: asyncio.Task | None = None
        self._retiring: dict[int, Any] = {}  # id(ranker) → ranker, until deactivated
        self._tasks: set[asyncio.Task] = set()

    @classmethod
    def open(cls, root: str | Path, names: tuple[str, ...] = (DEFAULT_NAME,),
             **open_options) -> tuple["VersionManager", Any, ServedModel]:
        """The manager of repository ``root``, the (not activated) Ranker of its highest version that resolves
        and that version's :class:`ServedModel`. ``open_options``: :func:`hllm.runtime.artefact.open_engine`'s.

        Raises: HllmError when no version folder holds a model that resolves (each reason named).
        """
        m = cls(root, names, open_options)
        folders = version_folders(root)
        if not folders:
            raise HllmError(f"{root}: no version folder (named 1, 2, ...) and not a model")
        for number, folder in reversed(folders):
            rec = m.records[number] = VersionRecord(number, folder, "loading", changed=time.time())
            try:
                art = resolve(version_artefact(folder))
                ranker = Ranker.from_path(art, **open_options)
            except Exception as e:  # noqa: BLE001 — refused, the next lower version is tried
                rec.set("refused", _reason(e))
                log.error("model version %d refused: %s", number, rec.reason)
                continue
            rec.artefact_version = model_version(art.meta)
            m.current, m._meta = number, art.meta
            return m, ranker, ServedModel(m.names, str(number))
        raise HllmError(f"{root}: no version opens: " + "; ".join(f"{r.number}: {r.reason}" for r in m.records.values()))

    def attach(self, state: Any) -> None:
        """Bind the app's :class:`hllm.serve.app.ServerState` (its ranker, model, info, in-flight counts)."""
        self.state = state

    # -- what GET /v1/models lists -------------------------------------------------------------------

    def listing(self) -> list[dict]:
        """Every known version, highest first."""
        return [self.records[n].to_dict() for n in sorted(self.records, reverse=True)]

    def check_serving(self, ranker: Any) -> None:
        """Startup: :func:`check_version` on the first served version (engine thread, after warm-up); its
        record turns ``serving`` or ``refused``. Raises: VersionRefused."""
        rec = self.records.get(self.current)
        try:
            check_version(ranker, self._meta)
        except VersionRefused as e:
            if rec is not None:
                rec.set("refused", str(e))
            raise
        if rec is not None:
            rec.set("serving")

    def load_failed(self, reason: str) -> None:
        """Startup: the first served version failed to activate or warm up."""
        rec = self.records.get(self.current)
        if rec is not None and rec.state != "refused":
            rec.set("refused", reason)

    # -- reload ----------------------------------------------------------------------------------------

    def request_reload(self) -> asyncio.Task:
        """Start a reload in the background (or return the one running) → its task, whose result is
        ``{"serving": version or None, "swapped": bool, "previous", "refused": [{"version", "reason"}], "error"}``."""
        if self._reload is None or self._reload.done():
            self._reload = asyncio.get_running_loop().create_task(self._run_reload(), name="hllm-reload")
        return self._reload

    async def _run_reload(self) -> dict:
        st = self.state
        outcome: dict = {"serving": None if self.current is None else str(self.current), "swapped": False,
                         "previous": None, "refused": [], "error": None}
        if st.loader is not None and not st.loader.done():  # the first version is still loading: let it finish
            await asyncio.shield(st.loader)
        try:
            folders = await asyncio.to_thread(version_folders, self.root)
        except HllmError as e:
            outcome["error"] = str(e)
            log.error("reload: %s; version %s keeps serving", e, self.current)
            return outcome
        for number, folder in reversed(folders):
            if number == self.current and st.ready:
                break
            rec = self.records[number] = VersionRecord(number, folder, "loading", changed=time.time())
            log.info("reload: loading model version %d from %s", number, folder)
            try:
                ranker, meta = await asyncio.to_thread(load_version, folder, self.open_options)
            except VersionRefused as e:
                rec.set("refused", str(e))
                outcome["refused"].append({"version": str(number), "reason": rec.reason})
                log.error("reload: model version %d refused: %s; version %s keeps serving", number, rec.reason, self.current)
                continue
            rec.artefact_version = model_version(meta)
            if st.draining:  # shutting down meanwhile: never swap in, free it
                ranker.engine.deactivate()
                rec.set("retired", "the server shut down before the swap")
                break
            outcome["previous"] = outcome["serving"]
            self._swap(number, ranker, rec)
            outcome.update(serving=str(number), swapped=True)
            break
        return outcome

    def _swap(self, number: int, ranker: Any, rec: VersionRecord) -> None:
        """Serve ``ranker`` from now on: one step of the event loop (no await), so every request is admitted
        on either the old or the new version, whole."""
        st = self.state
        old_ranker, old_number = st.ranker, self.current
        st.ranker, st.model = ranker, ServedModel(self.names, str(number))
        st.batcher.ranker = ranker
        st.info.update(model=str(rec.path), model_version=st.model.version)
        self.current = number
        rec.set("serving")
        old = self.records.get(old_number)
        if old is not None and old is not rec and old.state == "serving":
            old.set("retired", f"replaced by version {number}")
        st.load_error = None
        if not st.draining:
            st.ready = True
            st.metrics.ready.set(1)
        log.info("model version %d serving (was %s)", number, old_number)
        self._retiring[id(old_ranker)] = old_ranker
        task = asyncio.get_running_loop().create_task(self._retire(old_ranker), name="hllm-retire")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _retire(self, ranker: Any) -> None:
        """Deactivate a replaced engine on the engine thread once no request holds it."""
        while self.state.inflight.get(id(ranker), 0) > 0:
            await asyncio.sleep(RETIRE_POLL_S)
        try:
            await self.state.batcher.run_in_engine_thread(ranker.engine.deactivate)
        except Exception as e:  # noqa: BLE001 — shutting down: stop() frees it
            log.debug("retire: %s", e)
            return
        self._retiring.pop(id(ranker), None)

    def stop(self) -> None:
        """Shutdown (after the batcher drained): cancel the reload and retire tasks, free retired engines."""
        for task in [self._reload, *self._tasks]:
            if task is not None and not task.done():
                task.cancel()
        for ranker in self._retiring.values():
            try:
                ranker.engine.deactivate()
            except Exception as e:  # noqa: BLE001 — shutting down
                log.warning("could not free a retired engine: %s", e)
        self._retiring.clear()


def watch_sighup(manager: VersionManager) -> Callable[[], None]:
    """On SIGHUP, :meth:`VersionManager.request_reload` (installed on the running event loop when it runs in
    the main thread, as under ``hllm serve``; elsewhere — a server in a thread — nothing is installed)
    → the function that removes the handler."""
    def noop() -> None:
        return None

    if not hasattr(signal, "SIGHUP") or threading.current_thread() is not threading.main_thread():
        return noop
    loop = asyncio.get_running_loop()

    def on_sighup() -> None:
        log.info("SIGHUP: reloading the model repository %s", manager.root)
        manager.request_reload()

    try:
        loop.add_signal_handler(signal.SIGHUP, on_sighup)
    except (NotImplementedError, RuntimeError, ValueError):
        return noop
    return lambda: loop.remove_signal_handler(signal.SIGHUP)
