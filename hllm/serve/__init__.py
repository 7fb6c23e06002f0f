"""``hllm serve``: the ranking HTTP API with dynamic micro-batching, health and Prometheus metrics.

Optional extra ``serve`` (fastapi, uvicorn, httpx, prometheus_client); torch-free like the runtime.
:func:`create_app` builds the app over a :class:`hllm.runtime.Ranker`; :mod:`.batching` holds the
micro-batcher, :mod:`.server` runs uvicorn, :mod:`.loadtest` measures it.
"""

from hllm.serve.app import ServeOptions, create_app
from hllm.serve.batching import BatchOptions, MicroBatcher

__all__ = ["BatchOptions", "MicroBatcher", "ServeOptions", "create_app"]
