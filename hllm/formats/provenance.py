"""Provenance recorded in every sidecar and result JSON: library versions (torch-free)."""

from __future__ import annotations

import importlib.metadata as md
import platform

#: Packages whose versions shape an export or a measurement.
PACKAGES = (
    "hllm", "numpy", "scipy", "lap", "tokenizers", "onnxruntime", "onnxruntime-gpu", "onnx", "onnxscript",
    "torch", "transformers", "peft", "tensorrt", "fastapi", "starlette", "uvicorn", "httpx", "ray",
)


def library_versions(packages: tuple[str, ...] = PACKAGES) -> dict:
    """``{package: version}`` of the installed ones among ``packages``, plus ``python``."""
    out = {"python": platform.python_version()}
    for name in packages:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    return out
