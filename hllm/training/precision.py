"""Where and in which precision training and feature caching compute: the device (CPU, or CUDA when a
GPU is present) and bf16 autocast where the hardware has bf16 matrix instructions.

``precision`` is a request: ``fp32``; ``bf16`` (refused where there are no bf16 instructions: on a CPU
without AVX512_BF16 / AMX-BF16 autocast would emulate bf16 and run slower than fp32); ``auto`` (bf16
where the device has it, else fp32). bf16 applies to the matrix products only: the forward runs under
``torch.autocast(device_type, dtype=torch.bfloat16)`` (PyTorch "Automatic Mixed Precision", CPU and
CUDA op lists: matmuls and linear layers in bf16; softmax, norms and reductions in fp32), the
parameters, the optimizer state and the saved adapter and head stay fp32, and the Sinkhorn loss is
computed in fp32 from the scores cast back to fp32. No gradient scaler is needed: bf16 has fp32's
exponent range (unlike fp16).

Autocast caches its bf16 copy of a weight only for leaf tensors that require grad, so a frozen weight is
converted again at every call: on an AVX512_BF16 CPU a [1300, 576] × [576, 1536] product ran at 109–231
GFLOP per CPU-second under autocast against 303–330 with bf16 operands, 65–82 in fp32 (docs/training.md).
:meth:`Compute.cast_frozen` converts the frozen ``nn.Linear`` weights to bf16 once, which autocast would
have produced call by call (the same round-to-nearest conversion), so the results are unchanged and
the conversions are gone; trainable weights (LoRA, head), norms and embeddings stay fp32.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

from hllm.errors import HllmError
from hllm.formats.precision import Precision

PRECISIONS = ("auto", "fp32", "bf16")
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class Compute:
    """A resolved compute setting.

    Attributes:
        device: ``cpu`` or ``cuda``.
        precision: :class:`~hllm.formats.precision.Precision` ``FP32`` or ``BF16`` (what autocast uses).
        reason: one sentence saying why (the CPU's bf16 instructions, or the GPU), stored in provenance.
    """

    device: str
    precision: Precision
    reason: str

    def to_dict(self) -> dict:
        """``{device, precision, reason}`` (for a checkpoint's provenance or a benchmark JSON)."""
        return {"device": self.device, "precision": str(self.precision), "reason": self.reason}

    def autocast(self):
        """The context manager the forward runs under: bf16 ``torch.autocast`` on this device, or none."""
        return autocast(self.device, self.precision)

    def cast_frozen(self, module) -> int:
        """In bf16, convert the weight (and bias) of every ``nn.Linear`` of ``module`` whose weight does not
        require grad to bf16, in place; a no-op in fp32. The module must then run under :meth:`autocast`
        (outside it a bf16 weight meets fp32 inputs). Returns the number of layers converted."""
        import torch

        if self.precision != Precision.BF16:
            return 0
        n = 0
        for m in module.modules():
            if isinstance(m, torch.nn.Linear) and not m.weight.requires_grad and m.weight.dtype == torch.float32:
                m.weight.data = m.weight.data.to(torch.bfloat16)
                if m.bias is not None and not m.bias.requires_grad:
                    m.bias.data = m.bias.data.to(torch.bfloat16)
                n += 1
        return n


def cuda_available() -> bool:
    """Whether torch sees a CUDA GPU (False without torch's CUDA build)."""
    import torch

    return bool(torch.cuda.is_available())


def resolve_compute(precision: str = "auto", device: str = "auto") -> Compute:
    """Resolve a ``precision`` / ``device`` request to what runs here.

    Args:
        precision: ``auto`` | ``fp32`` | ``bf16``.
        device: ``auto`` (CUDA when torch sees a GPU, else CPU) | ``cpu`` | ``cuda``.
    Returns: :class:`Compute`.
    Raises: HllmError (CLI exit 2) for an unknown value, ``cuda`` without a CUDA GPU, or ``bf16`` on a
        CPU without bf16 matrix instructions (the message names the CPU features found,
        :func:`hllm.measure.bf16_support`) or on a GPU without bf16 support.
    """
    if precision not in PRECISIONS:
        raise HllmError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if device not in DEVICES:
        raise HllmError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    has_cuda = cuda_available()
    if device == "cuda" and not has_cuda:
        raise HllmError("--device cuda: torch sees no CUDA GPU (a CPU-only torch build, or no GPU)")
    dev = "cuda" if device == "cuda" or (device == "auto" and has_cuda) else "cpu"
    if dev == "cuda":
        import torch

        ok = bool(torch.cuda.is_bf16_supported())
        name = torch.cuda.get_device_name(0)
        what = f"CUDA GPU {name}: bf16 {'supported' if ok else 'not supported'}"
    else:
        from hllm.measure import bf16_support

        ok, what = bf16_support()
    wanted = None if precision == "auto" else Precision.parse(precision)  # the request, converted once
    if wanted is Precision.BF16 and not ok:
        raise HllmError(f"--precision bf16 needs bf16 matrix instructions on the {dev.upper()} "
                        f"({what}); use --precision fp32 or auto")
    chosen = Precision.BF16 if wanted is Precision.BF16 or (wanted is None and ok) else Precision.FP32
    return Compute(dev, chosen, f"{precision} on {dev}: {what}")


def autocast(device: str, precision: str):
    """``torch.autocast(device, dtype=torch.bfloat16)`` for ``precision == "bf16"``, else a no-op context.

    Raises: HllmError for a precision other than ``fp32`` / ``bf16`` (resolve ``auto`` first).
    """
    import torch

    if precision == Precision.BF16:
        return torch.autocast(device_type=device, dtype=torch.bfloat16)
    if precision == Precision.FP32:
        return contextlib.nullcontext()
    raise HllmError(f"autocast takes a resolved precision (fp32 or bf16), got {precision!r}")


@contextlib.contextmanager
def no_autocast(device: str) -> Iterator[None]:
    """Run the block in fp32 inside an autocast region (the Sinkhorn loss)."""
    import torch

    with torch.autocast(device_type=device, enabled=False):
        yield
