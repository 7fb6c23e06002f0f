"""NVIDIA TensorRT Model Optimizer ONNX PTQ: explicit INT8 / FP8 Q/DQ for TensorRT (backend ``modelopt``,
:mod:`hllm.calibration.recipes.options`).

``modelopt.onnx.quantization.quantize`` (https://nvidia.github.io/TensorRT-Model-Optimizer/) is installed
only with the ``hllm[modelopt]`` extra, best in its own environment (it pins onnx and onnxruntime-gpu).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Sequence

from hllm.calibration.recipes.options import QuantOptions
from hllm.calibration.recipes.ort_quantize import calibration_reader, external_data
from hllm.errors import EngineError, HllmError

MODELOPT_HINT = (
    "NVIDIA ModelOpt is not importable in this environment: install the optional extra "
    "`pip install 'hllm[modelopt]'` (nvidia-modelopt[onnx]; it pins onnx and onnxruntime-gpu, so use a "
    "separate venv, e.g. `python -m venv .venv-modelopt && .venv-modelopt/bin/pip install -e '.[modelopt]'`) "
    "and run `hllm calibrate` from there"
)


def modelopt_available() -> bool:
    """True when ``modelopt.onnx.quantization`` can be imported here."""
    try:
        import modelopt.onnx.quantization  # noqa: F401
    except Exception:
        return False
    return True


def quantize_modelopt(src: Path, dst: Path, options: QuantOptions, calib, exclude: Sequence[str] = ()) -> None:
    """ModelOpt ONNX PTQ: explicit INT8 or FP8 Q/DQ for TensorRT, other tensors kept in FP32.

    Raises: EngineError (ModelOpt not importable: names the extra / venv; no calibration data; failure).
    """
    if not modelopt_available():
        raise EngineError(MODELOPT_HINT)
    if calib is None:
        raise EngineError("ModelOpt PTQ needs calibration data (--calibration or --calib-slates)")
    from modelopt.onnx.quantization import quantize as mo_quantize

    work = dst.parent / f".{dst.stem}.modelopt-src"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    # ModelOpt rewrites its input .onnx in place (and names its data file *.onnx_data): quantize a copy.
    for p in src.parent.iterdir():
        if p.is_file() and p.name.startswith(src.name):
            shutil.copy2(p, work / p.name)
    methods = {"minmax": "max", "max": "max", "entropy": "entropy"}
    if options.calibrate_method not in methods:
        raise EngineError(f"ModelOpt calibrate_method must be one of {list(methods)}, got {options.calibrate_method!r}")
    method = methods[options.calibrate_method]
    try:
        mo_quantize(
            onnx_path=str(work / src.name),
            quantize_mode=str(options.precision),
            calibration_data_reader=calibration_reader(calib),
            calibration_method=method,
            calibration_eps=["cpu"],
            op_types_to_quantize=list(options.op_types),
            # ModelOpt matches these as regular expressions: anchor them (node_linear_1 ≠ node_linear_10)
            nodes_to_exclude=[f"^{re.escape(n)}$" for n in exclude] or None,
            high_precision_dtype="fp32",
            use_external_data_format=external_data(src),
            output_path=str(dst),
        )
    except HllmError:
        raise
    except Exception as e:
        raise EngineError(f"ModelOpt quantization failed: {type(e).__name__}: {e}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not dst.is_file():
        raise EngineError(f"ModelOpt wrote no model at {dst}")

