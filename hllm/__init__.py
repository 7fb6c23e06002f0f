"""hllm: take an hLLM reranker from a trained checkpoint to a fast, verified, served engine.

The base package needs only numpy; the rest comes in extras (:mod:`hllm.extras`):
``pip install 'hllm[runtime]'`` for the lean ranking runtime, ``'hllm[cli]'`` for the ``hllm``
command, ``'hllm[export]'``, ``'hllm[serve]'``, ``'hllm[ray]'``, …

Importing ``hllm`` changes nothing outside it: no environment variable, no ``sys.modules`` entry but its
own. The telemetry switches of ONNX Runtime, OpenVINO and NNCF are set by the ``hllm`` command at its entry
and before hllm imports one of those libraries (:func:`hllm.extras.quiet_telemetry`).
"""

__all__ = ["__version__"]


def __getattr__(name: str) -> str:
    """``hllm.__version__``, read on first use (PEP 562): the version in pyproject.toml, as installed
    (``0+unknown`` for a source tree without an installed distribution)."""
    if name != "__version__":
        raise AttributeError(f"module 'hllm' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("hllm")
    except PackageNotFoundError:
        v = "0+unknown"
    globals()["__version__"] = v
    return v
