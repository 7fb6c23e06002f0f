"""OpenVINO backend (CPU plugin): the ``standard`` ONNX export in fp32 or bf16, or an NNCF INT8 IR; torch-free.

OpenVINO reads the ONNX graph with its ONNX frontend and compiles it for the CPU plugin, where it fuses
RMSNorm and the rotary embedding itself. It cannot read the ``ort-cpu`` flavour (ONNX Runtime contrib ops
such as ``com.microsoft.GroupQueryAttention``): such a graph is refused with the reason.

Precision: ``f32`` runs every op in float32 (``INFERENCE_PRECISION_HINT=f32``); ``bf16`` lets the CPU
plugin run matrix multiplications in bfloat16 — only on a CPU with AVX512_BF16 or AMX-BF16
(:func:`hllm.measure.bf16_support`), refused elsewhere because the plugin would otherwise fall back
or emulate silently. The ``bf16`` hint runs nearly every op in bfloat16 and ignores per-node runtime info;
fp32 islands are honoured through an explicitly typed graph instead (:mod:`hllm.exporter.bf16`: bfloat16
``MatMul`` nodes only where wanted, compiled with ``f32``). An INT8 IR (``model.xml`` written by :func:`hllm.calibration.recipes.openvino_int8.quantize_openvino`)
carries its own FakeQuantize nodes and runs with the f32 hint for the parts kept in float.

Sources: OpenVINO Python API (``openvino.Core.read_model`` / ``compile_model``, properties
``INFERENCE_PRECISION_HINT``, ``INFERENCE_NUM_THREADS``, ``PERFORMANCE_HINT``),
https://docs.openvino.ai/2026/openvino-workflow/running-inference.html and
https://docs.openvino.ai/2026/openvino-workflow/running-inference/optimize-inference/precision-control.html
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from pathlib import Path
from typing import Iterator

import numpy as np

from hllm.engines.base import Engine
from hllm.errors import EngineError
from hllm.extras import require
from hllm.formats.graph import OUTPUT_NAME, input_names
from hllm.formats.precision import Precision
from hllm.formats.vocabulary import OPENVINO_HINTS
from hllm.measure import bf16_support

class _StackT(ctypes.Structure):  # stack_t of sigaltstack(2) (Linux, x86-64 / aarch64)
    _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]


_SS_DISABLE = 2  # <bits/sigstack.h>


def drop_signal_stack() -> bool:
    """Disable the calling thread's alternate signal stack (``sigaltstack(SS_DISABLE)``, POSIX); returns
    whether it was done (False off Linux or where libc cannot be reached).

    Why: OpenVINO's CPU plugin (2026.4) leaves an ~11 KB alternate signal stack registered on the thread that
    compiled a model and frees it with the compiled model. Python's handlers run there (``SA_ONSTACK``), so a
    SIGINT / SIGTERM later crashed the process with SIGSEGV (exit 139): after NNCF's accuracy control, every time
    (the kernel cannot write the signal frame into the freed stack); while models were alive, often (the dynamic
    loader's lazy binding in the handler overflowed 11 KB on an AVX-512 CPU). Measured from core dumps. Without
    it the handlers run on the thread's own stack, as in a process that never loaded OpenVINO.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.sigaltstack(ctypes.byref(_StackT(None, _SS_DISABLE, 0)), None) == 0
    except (OSError, AttributeError):
        return False


@contextlib.contextmanager
def no_signal_stack_after_compile() -> Iterator[None]:
    """Within the block, every ``openvino.Core.compile_model`` (NNCF's quantizers compile through it too) is
    followed by :func:`drop_signal_stack` on the compiling thread; the method is restored on exit. Reversible
    patch around third-party code that compiles models itself."""
    ov = require("openvino", EngineError)
    original = ov.Core.compile_model

    def compile_model(self, *args, **kwargs):
        try:
            return original(self, *args, **kwargs)
        finally:
            drop_signal_stack()

    ov.Core.compile_model = compile_model
    try:
        yield
    finally:
        ov.Core.compile_model = original


#: Inference precisions this engine accepts (OpenVINO's names for ``INFERENCE_PRECISION_HINT``).
INFERENCE_PRECISIONS = OPENVINO_HINTS[:2]


def check_inference_precision(value: str) -> str:
    """Validate an inference precision for this CPU; returns OpenVINO's name (``f32`` / ``bf16``).

    ``bf16`` / ``fp32`` are accepted as aliases. Raises EngineError for an unknown value, and for bf16 on
    a CPU without AVX512_BF16 / AMX-BF16, naming the missing instruction sets and the CPU features found.
    """
    v = {"fp32": "f32", "float32": "f32", "bfloat16": "bf16"}.get(str(value).lower(), str(value).lower())
    if v not in INFERENCE_PRECISIONS:
        raise EngineError(f"OpenVINO inference precision {value!r} is not one of {INFERENCE_PRECISIONS}")
    if v == "bf16":
        ok, what = bf16_support()
        if not ok:
            raise EngineError("bf16 needs AVX512_BF16 or AMX-BF16 instructions, which this CPU lacks; "
                              f"{what}. use fp32, or INT8 (NNCF on OpenVINO, AVX512-VNNI)")
    return v


class OpenVinoEngine(Engine):
    """Runs an exported hLLM graph (``standard`` ONNX, or an OpenVINO IR ``.xml``) with OpenVINO on the CPU.

    Args:
        model_path: ``model.onnx`` of a ``standard`` export, or an IR ``.xml`` (its ``.bin`` beside it).
        num_positions: K of the head (checked against the graph's output shape on activate).
        threads: ``INFERENCE_NUM_THREADS`` (0 / None = OpenVINO's default, all cores).
        inference_precision: ``f32`` or ``bf16`` (:func:`check_inference_precision`; checked at construction).
        precision: the graph's :class:`Precision` recorded in reports (INT8 for an NNCF IR; BF16 is set
            automatically when ``inference_precision`` is bf16, and is the precision of a typed bf16-GEMM
            graph from :func:`hllm.exporter.bf16.convert_to_bf16`, which runs under ``f32`` and is refused on
            a CPU without bf16 instructions like the ``bf16`` hint).
        context: the graph has the ``context_positions`` input (checked on activate).
        flavour: the export's flavour when known; ``ort-cpu`` is refused (contrib ops OpenVINO cannot read).
        dynamic_quantization_group_size: the CPU plugin's ``DYNAMIC_QUANTIZATION_GROUP_SIZE`` (None = its default).
    Raises: EngineError (at construction for a refused flavour or precision; on activate for a graph
        OpenVINO cannot read or whose inputs/K do not match the sidecar).
    """

    name = "openvino"

    def __init__(self, model_path: str | os.PathLike, num_positions: int, threads: int | None = None,
                 inference_precision: str = "f32", precision: Precision = Precision.FP32, context: bool = False,
                 flavour: str | None = None, dynamic_quantization_group_size: int | None = None):
        if flavour == "ort-cpu":
            raise EngineError(f"OpenVINO cannot run {model_path}: it is the `ort-cpu` flavour (ONNX Runtime contrib "
                              "ops such as com.microsoft.GroupQueryAttention); export with --flavour standard")
        self.inference_precision = check_inference_precision(inference_precision)
        if self.inference_precision == "bf16" and Precision.parse(precision) is Precision.FP32:
            precision = Precision.BF16
        if Precision.parse(precision) is Precision.BF16:  # a typed bf16 graph (hllm.exporter.bf16) under f32
            check_inference_precision("bf16")  # refused on a CPU that would silently run it in f32
        super().__init__(num_positions, precision, context)
        self.model_path = Path(model_path)
        self.threads = threads
        self.dynamic_quantization_group_size = dynamic_quantization_group_size
        self._compiled = None
        self._request = None

    def config(self) -> dict:
        """The CPU plugin properties this engine compiles with (strings, as OpenVINO accepts them)."""
        cfg = {"INFERENCE_PRECISION_HINT": self.inference_precision, "PERFORMANCE_HINT": "LATENCY"}
        if self.threads:
            cfg["INFERENCE_NUM_THREADS"] = int(self.threads)
        if self.dynamic_quantization_group_size is not None:
            cfg["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = int(self.dynamic_quantization_group_size)
        return cfg

    def compiled_property(self, name: str):
        """The value the compiled model reports for the CPU plugin property ``name`` (``get_property``): the
        setting in effect. Raises: EngineError before :meth:`activate`."""
        if self._compiled is None:
            raise EngineError("the OpenVINO engine is not active: no compiled model to ask")
        return self._compiled.get_property(name)

    def _activate(self) -> None:
        ov = require("openvino", EngineError)
        if not self.model_path.is_file():
            raise EngineError(f"model not found: {self.model_path}")
        core = ov.Core()
        try:
            model = core.read_model(str(self.model_path))
        except Exception as e:
            raise EngineError(f"OpenVINO cannot read {self.model_path} (only the `standard` flavour is supported): "
                              f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
        names = sorted(n for p in model.inputs for n in p.get_names() if n in input_names(True))
        want = sorted(input_names(self.context))
        if names != want:
            raise EngineError(f"{self.model_path} has inputs {names}, expected {want} (its sidecar says the head "
                              f"{'reads' if self.context else 'does not read'} the user context)")
        k = model.output(0).get_partial_shape()[-1]
        if k.is_static and k.get_length() != self.num_positions:
            raise EngineError(f"{self.model_path} outputs K={k.get_length()} positions, expected {self.num_positions}")
        try:
            self._compiled = core.compile_model(model, "CPU", self.config())
        except Exception as e:
            raise EngineError(f"OpenVINO cannot compile {self.model_path} for the CPU: {e}") from None
        finally:
            drop_signal_stack()  # the plugin's alternate signal stack outlives nothing safely (drop_signal_stack)
        self._request = self._compiled.create_infer_request()

    def _deactivate(self) -> None:
        self._request = None
        self._compiled = None

    def _run(self, input_ids, readout_positions, item_mask, context_positions=None) -> np.ndarray:
        feeds = self.feeds(input_ids, readout_positions, item_mask, context_positions)
        try:
            res = self._request.infer(feeds)
        except Exception as e:
            raise EngineError(f"OpenVINO failed: {e}") from None
        out = self._compiled.output(OUTPUT_NAME) if OUTPUT_NAME in self._compiled.output(0).get_names() else \
            self._compiled.output(0)
        return np.array(res[out], dtype=np.float32, copy=True)
