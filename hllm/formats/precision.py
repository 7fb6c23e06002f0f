"""The numeric precision of an exported graph or plan (one enum, one default), torch-free.

Recorded as a string in ``export.json`` and in the plan sidecar (``"fp32"``, ``"fp16"``, ...). A
sidecar without the key is an FP32 export (the only thing ``hllm export`` wrote before the key
existed), so :meth:`Precision.parse` defaults to ``FP32`` and nowhere else chooses a default.
"""

from __future__ import annotations

from enum import Enum

from hllm.errors import HllmError


class Precision(str, Enum):
    """Precision of a graph's weights/activations (its tensor-core path on a GPU).

    ``fp32``: the reference export. ``fp16``: FP16 with FP32 islands (``hllm export --precision fp16``).
    ``bf16``: bfloat16 weights and activations (CPU: AVX512_BF16 / AMX). ``int8`` / ``fp8``: quantized
    (``hllm calibrate``). Values are the strings stored in sidecars.
    """

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    INT8 = "int8"
    FP8 = "fp8"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: "str | Precision | None", where: str = "precision") -> "Precision":
        """``None`` → FP32 (a sidecar that predates the key); a known string → the member.

        Raises: HllmError naming ``where`` and the known values for anything else.
        """
        if value is None:
            return cls.FP32
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                return cls(value.lower())
            except ValueError:
                pass
        raise HllmError(f"{where}: unknown precision {value!r}; one of {[p.value for p in cls]}")

    @property
    def is_quantized(self) -> bool:
        """True for the integer / FP8 precisions written by ``hllm calibrate``."""
        return self in (Precision.INT8, Precision.FP8)
