"""hllm: take an hLLM reranker from a trained checkpoint to a fast, verified, served engine.

The base package needs only numpy; the rest comes in extras (:mod:`hllm.extras`):
``pip install 'hllm[runtime]'`` for the lean ranking runtime, ``'hllm[cli]'`` for the ``hllm``
command, ``'hllm[export]'``, ``'hllm[serve]'``, ``'hllm[ray]'``, …
"""

from importlib.metadata import PackageNotFoundError, version as _version

try:  # one source of truth: the version in pyproject.toml, as installed
    __version__ = _version("hllm")
except PackageNotFoundError:  # a source tree on sys.path without an installed distribution
    __version__ = "0+unknown"

__all__ = ["__version__"]
