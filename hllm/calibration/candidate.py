"""One engine × precision to build, gate or time: the type shared by ``hllm calibrate --backend auto`` (its
candidates, :data:`hllm.calibration.auto_candidates.CANDIDATES`, built from an FP32 export) and ``hllm bench frontier``
(its contenders, artefacts already built, :func:`hllm.bench.frontier.frontier`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hllm.errors import HllmError
from hllm.formats.precision import Precision

#: Engines a candidate names: ``auto`` (what the artefact's sidecar says), ONNX Runtime, OpenVINO, or the
#: checkpoint's PyTorch eager reference (``torch``).
ENGINES = ("auto", "onnxruntime", "openvino", "torch")
#: Precisions of a candidate's matrix products.
PRECISIONS = (Precision.FP32, Precision.BF16, Precision.INT8)


@dataclass(frozen=True)
class Candidate:
    """One engine × precision.

    Attributes:
        name: unique in its list (a record key of the selection report, a row of the frontier table).
        engine: one of :data:`ENGINES`.
        precision: the dtype of its matrix products, one of :data:`PRECISIONS` (a string is parsed,
            :meth:`hllm.formats.precision.Precision.parse`).
        path: the artefact it runs (export directory, ``.onnx`` or checkpoint); None for a candidate that
            ``calibrate`` builds from the FP32 export.
        inference_precision: OpenVINO's ``INFERENCE_PRECISION_HINT`` (``f32`` / ``bf16``); None = the
            sidecar's or the engine's default.
        flavour: the export flavour it is built from (``standard`` / ``ort-cpu``; None = any).
        isa: CPU features of which at least one must be present (:func:`hllm.measure.cpu_flags` names;
            empty = none needed).
        needs_calibration: built from calibration data.
        gate: gate figures measured elsewhere (``bench frontier --gates``: a ``GateReport.to_dict``).
    Raises: HllmError naming an unknown engine or precision.
    """

    name: str
    engine: str
    precision: Precision
    path: str | None = None
    inference_precision: str | None = None
    flavour: str | None = None
    isa: tuple[str, ...] = ()
    needs_calibration: bool = False
    gate: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise HllmError(f"candidate {self.name}: unknown engine {self.engine!r}; one of {list(ENGINES)}")
        p = Precision.parse(self.precision, f"candidate {self.name}")
        if p not in PRECISIONS:
            raise HllmError(f"candidate {self.name}: precision {p} is not one of {[str(x) for x in PRECISIONS]}")
        object.__setattr__(self, "precision", p)
