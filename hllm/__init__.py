"""hllm: take an hLLM reranker from a trained checkpoint to a fast, verified, served engine.

The base package needs only numpy; the rest comes in extras (:mod:`hllm.extras`):
``pip install 'hllm[runtime]'`` for the lean ranking runtime, ``'hllm[cli]'`` for the ``hllm``
command, ``'hllm[export]'``, ``'hllm[serve]'``, ``'hllm[ray]'``, …
"""

import os as _os
import sys as _sys
from importlib.metadata import PackageNotFoundError, version as _version

# ONNX Runtime's telemetry: its native library writes a device id and a database under
# ~/.cache/Microsoft/DeveloperTools/.onnxruntime when the module is imported (1.32 on Linux), before any
# Python call could stop it; the variable ORT_DISABLE_TELEMETRY (read by the library at load) turns that
# off. Set unless the user chose otherwise; hllm.engines.ort also calls onnxruntime.disable_telemetry_events().
_os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")


def _openvino_telemetry_opted_in() -> bool:
    """True when the user gave OpenVINO consent: ``opt_in_out --opt_in`` wrote "1" to ~/intel/openvino_telemetry."""
    path = _os.path.join(_os.path.expanduser("~"), "intel", "openvino_telemetry")
    try:
        if not _os.path.isfile(path):  # not a FIFO or a device that would block the import
            return False
        with open(path, encoding="ascii") as f:
            return f.read(8).strip() == "1"
    except (OSError, ValueError):
        return False


# OpenVINO's and NNCF's telemetry (openvino-telemetry 2025.2): `import openvino` (openvino.tools.ovc) and
# `import nncf` (nncf.telemetry) write a client id and a stats file under ~/intel and send Google Analytics
# events from a thread pool, unless the consent file ~/intel/openvino_telemetry holds "0" — which its documented
# switch, `opt_in_out --opt_out`, writes under $HOME — or a CI variable is set. Both libraries document a
# no-telemetry fallback for an environment without the openvino_telemetry module (openvino.tools.ovc uses its
# telemetry_stub; nncf.telemetry "No telemetry will be sent"): take that fallback by marking the module absent,
# unless it is already imported or the user opted in. Nothing is written under $HOME and no socket is opened.
if "openvino_telemetry" not in _sys.modules and not _openvino_telemetry_opted_in():
    _sys.modules["openvino_telemetry"] = None  # import → ImportError (the import system's rule)

try:  # one source of truth: the version in pyproject.toml, as installed
    __version__ = _version("hllm")
except PackageNotFoundError:  # a source tree on sys.path without an installed distribution
    __version__ = "0+unknown"

__all__ = ["__version__"]
