"""One small error hierarchy for hllm.

Every error a user can cause (bad file, bad slate, bad option) is an :class:`HllmError`
subclass. The CLI turns these into a one-line message and exit code 2; any other exception
is a bug and keeps its traceback (with ``--debug``).
"""

from __future__ import annotations


class HllmError(Exception):
    """Base class of every error hllm raises on purpose."""


class CheckpointError(HllmError):
    """A checkpoint directory or its manifest ``hllm.json`` is missing, malformed or inconsistent."""


class SlateError(HllmError):
    """A slate (JSONL line) is malformed: missing fields, empty, more candidates than K, too long."""


class ShapeError(HllmError):
    """Arrays handed to an engine have the wrong rank, dtype or shape."""


class EngineError(HllmError):
    """An engine could not be loaded or run (missing file, wrong backend, incompatible plan)."""


class DecodeError(HllmError):
    """The score matrix cannot be decoded into a ranking (non-finite scores, bad shape)."""


class ParityError(HllmError):
    """A backend's outputs differ from the PyTorch reference beyond tolerance."""


class ExportError(HllmError):
    """ONNX export or its self-validation failed."""


class OutputError(HllmError):
    """An output cannot be written: not a regular file (directory, device, FIFO, socket), a dangling
    symbolic link, a read-only or unwritable directory, or a full disk (:mod:`hllm.files`)."""
