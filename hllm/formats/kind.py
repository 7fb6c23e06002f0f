"""Which deployable artefact a path holds, decided in one place (torch-free).

* ``checkpoint`` — a directory with the manifest ``hllm.json`` (:mod:`hllm.formats.checkpoint`);
* ``onnx`` — a directory with ``export.json`` (:mod:`hllm.formats.export`), or an ``.onnx`` file;
* ``tensorrt`` — a ``.plan`` / ``.engine`` file (its sidecar ``<plan>.json``, :mod:`hllm.formats.plan`).

:func:`hllm.runtime.artefact.resolve` opens what this names; :func:`hllm.formats.describe.describe` reports
on it (and on the other files it knows: calibration sets, feature caches, backbones, slates).
"""

from __future__ import annotations

import os
from pathlib import Path

#: File suffixes of a TensorRT plan (trtexec writes ``.engine`` as often as ``.plan``).
PLAN_SUFFIXES = (".plan", ".engine")


def artefact_kind(path: str | os.PathLike) -> str | None:
    """``"checkpoint"``, ``"onnx"``, ``"tensorrt"`` or None (not a deployable artefact); reads no file."""
    from hllm.formats.checkpoint import MANIFEST
    from hllm.formats.export import SIDECAR

    p = Path(path)
    if p.is_dir() and (p / MANIFEST).is_file():
        return "checkpoint"
    if (p.is_dir() and (p / SIDECAR).is_file()) or p.suffix == ".onnx":
        return "onnx"
    if p.suffix in PLAN_SUFFIXES:
        return "tensorrt"
    return None
