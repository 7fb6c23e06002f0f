"""hllm: take an hLLM reranker from a trained checkpoint to a fast, verified, served engine.

The base package needs only numpy; the rest comes in extras (:mod:`hllm.extras`):
``pip install 'hllm[runtime]'`` for the lean ranking runtime, ``'hllm[cli]'`` for the ``hllm``
command, ``'hllm[export]'``, ``'hllm[serve]'``, ``'hllm[ray]'``, …
"""

import os as _os
from importlib.metadata import PackageNotFoundError, version as _version

# ONNX Runtime's telemetry: its native library writes a device id and a database under
# ~/.cache/Microsoft/DeveloperTools/.onnxruntime when the module is imported (1.32 on Linux), before any
# Python call could stop it; the variable ORT_DISABLE_TELEMETRY (read by the library at load) turns that
# off. Set unless the user chose otherwise; hllm.engines.ort also calls onnxruntime.disable_telemetry_events().
_os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

try:  # one source of truth: the version in pyproject.toml, as installed
    __version__ = _version("hllm")
except PackageNotFoundError:  # a source tree on sys.path without an installed distribution
    __version__ = "0+unknown"

__all__ = ["__version__"]
