"""ONNX Runtime backend (CPU provider; CUDA provider when installed), torch-free.

Source: ONNX Runtime Python API, https://onnxruntime.ai/docs/api/python/api_summary.html
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from hllm.engines.base import Engine
from hllm.formats.graph import OUTPUT_NAME, input_names
from hllm.errors import EngineError
from hllm.extras import quiet_telemetry
from hllm.formats.precision import Precision


class OnnxRuntimeEngine(Engine):
    """Runs an exported hLLM ONNX graph with ONNX Runtime.

    Args:
        model_path: the ``.onnx`` file (external data files beside it are found by ORT).
        num_positions: K of the head (checked against the graph's output shape on activate).
        providers: ORT execution providers; default CUDA first when available, then CPU.
        intra_op_threads: threads per op (0 = ORT default = physical cores).
        graph_optimization: ``"all"`` (default), ``"extended"``, ``"basic"`` or ``"disabled"``.
        precision: the graph's :class:`Precision` (from its sidecar; recorded in reports).
        context: the graph has the ``context_positions`` input (checked on activate).
    """

    name = "onnxruntime"

    def __init__(
        self,
        model_path: str | os.PathLike,
        num_positions: int,
        providers: list[str] | None = None,
        intra_op_threads: int = 0,
        graph_optimization: str = "all",
        precision: Precision = Precision.FP32,
        context: bool = False,
    ):
        super().__init__(num_positions, precision, context)
        self.model_path = Path(model_path)
        self.providers = providers
        self.intra_op_threads = intra_op_threads
        self.graph_optimization = graph_optimization
        self._session = None

    def _activate(self) -> None:
        quiet_telemetry()  # before ONNX Runtime's native library loads (it reads ORT_DISABLE_TELEMETRY then)
        import onnxruntime as ort

        if hasattr(ort, "disable_telemetry_events"):  # Windows ETW events; the Linux files: quiet_telemetry
            ort.disable_telemetry_events()
        if not self.model_path.is_file():
            raise EngineError(f"ONNX model not found: {self.model_path}")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.intra_op_threads
        levels = {
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        }
        if self.graph_optimization not in levels:
            raise EngineError(f"unknown graph_optimization {self.graph_optimization!r}; one of {list(levels)}")
        opts.graph_optimization_level = levels[self.graph_optimization]
        available = ort.get_available_providers()
        providers = self.providers or [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]
        try:
            self._session = ort.InferenceSession(str(self.model_path), sess_options=opts, providers=providers)
        except Exception as e:
            raise EngineError(f"ONNX Runtime cannot load {self.model_path}: {e}") from None
        names = [i.name for i in self._session.get_inputs()]
        want = input_names(self.context)
        if sorted(names) != sorted(want):
            raise EngineError(f"{self.model_path} has inputs {names}, expected {list(want)} (its sidecar says the "
                              f"head {'reads' if self.context else 'does not read'} the user context)")
        out = self._session.get_outputs()[0]
        k = out.shape[-1]
        if isinstance(k, int) and k != self.num_positions:
            raise EngineError(f"{self.model_path} outputs K={k} positions, expected {self.num_positions}")

    def _deactivate(self) -> None:
        self._session = None

    def _run(self, input_ids, readout_positions, item_mask, context_positions=None) -> np.ndarray:
        feeds = self.feeds(input_ids, readout_positions, item_mask, context_positions)
        try:
            (scores,) = self._session.run([OUTPUT_NAME], feeds)
        except Exception as e:
            raise EngineError(f"ONNX Runtime failed: {e}") from None
        return scores
