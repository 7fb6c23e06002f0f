"""``calibration_report.json``: what one ``hllm calibrate`` run decided, typed (numpy-free, torch-free).

:func:`hllm.calibration.selection.pipeline.calibrate` returns a :class:`CalibrationResult`; its :meth:`to_dict` is the
file beside the quantized export and the ``--report`` / ``--json`` document. The gate's figures
(:mod:`hllm.verify.gate`) compare the quantized graph's rankings with the FP32 export's on held-out slates.
"""

from __future__ import annotations

from dataclasses import dataclass

from hllm.formats.precision import Precision
from hllm.formats.report import envelope

#: File name of the record inside the written directory.
REPORT_NAME = "calibration_report.json"


@dataclass
class CalibrationResult:
    """One calibrate run.

    Attributes:
        precision: the quantized graph's :class:`Precision` (INT8 / FP8). backend: ``ort-static``,
            ``ort-dynamic``, ``ort-weight-only`` or ``modelopt``. target: the GPU target, or None.
        passed: the gate passed (the graph went to ``out_dir``; else ``out_dir.FAILED``).
        top1_agreement, kendall_tau_mean: against FP32 on the evaluation slates, in [0, 1] / [-1, 1].
        recall10_delta: FP32 Recall@10 − quantized Recall@10 (JSON key ``recall@10_delta``).
        excluded_parts: parts kept in float (``head``, ``block:N``, ...). gate: the full gate record.
        eval_slates: ``{file, count, first_id, last_id}``. calibration: how the calibration set was drawn
            (source, its sha256, seed, count, batch size, data_sha256), None without one.
        options: the quantizer options used. reference: the FP32 export directory; reference_seconds: the
            time of its reference run (s). auto: the automatic-exclusion ladder and tries, or None.
        speed, speedup_vs_fp32, machine: the interleaved speed run (``--bench-runs``), else None.
    """

    precision: Precision
    backend: str
    target: str | None
    passed: bool
    top1_agreement: float
    kendall_tau_mean: float
    recall10_delta: float
    excluded_parts: list[str]
    gate: dict
    eval_slates: dict
    calibration: dict | None
    options: dict
    reference: str
    reference_seconds: float
    auto: dict | None = None
    speed: dict | None = None
    speedup_vs_fp32: float | None = None
    machine: dict | None = None

    def to_dict(self) -> dict:
        """The JSON document (keys as written since the first version; absent optional parts left out)."""
        d = {"precision": str(self.precision), "backend": self.backend, "target": self.target, "passed": self.passed,
             "top1_agreement": self.top1_agreement, "kendall_tau_mean": self.kendall_tau_mean,
             "recall@10_delta": self.recall10_delta, "excluded_parts": list(self.excluded_parts), "gate": self.gate,
             "eval_slates": self.eval_slates, "calibration": self.calibration, "options": self.options,
             "reference": self.reference, "reference_seconds": self.reference_seconds}
        if self.auto:
            d["auto"] = self.auto
        if self.speed is not None:
            d.update(speed=self.speed, speedup_vs_fp32=self.speedup_vs_fp32, machine=self.machine)
        return d

    def to_report(self) -> dict:
        """:meth:`to_dict` in the report envelope (:func:`hllm.formats.report.envelope`, kind ``calibration``):
        the file written and the ``--report`` document. ``machine`` is the speed run's, else this machine's."""
        return envelope("calibration", self.to_dict(), machine=self.machine)
