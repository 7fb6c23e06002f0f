"""``hllm serve``: the ranking HTTP API with dynamic micro-batching, health and Prometheus metrics.

Optional extra ``serve`` (fastapi, uvicorn, httpx, prometheus_client); torch-free like the runtime.
:func:`create_app` builds the app over a :class:`hllm.runtime.Ranker`; :mod:`.batching` holds the
micro-batcher, :mod:`.server` runs uvicorn, :mod:`hllm.bench.loadtest` measures it.

The names below are imported on first use (PEP 562 module ``__getattr__``), so the subpackages that need
no web framework — :mod:`hllm.serve.triton` (the Triton repository writer) and :mod:`hllm.serve.ray_serve`
— import without fastapi installed.
"""

from __future__ import annotations

import importlib

_LAZY = {"ServeOptions": "hllm.serve.app", "create_app": "hllm.serve.app",
         "BatchOptions": "hllm.serve.batching", "MicroBatcher": "hllm.serve.batching"}

__all__ = ["BatchOptions", "MicroBatcher", "ServeOptions", "create_app"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hllm.serve' has no attribute {name!r}")
