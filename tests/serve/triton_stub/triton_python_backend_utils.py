"""A stand-in for Triton's ``triton_python_backend_utils`` (the part hllm's Python-backend models use).

Inside Triton this module is provided by the Python backend's stub process; this one holds numpy arrays
in memory with the same names and call shapes: ``Tensor(name, array)`` with ``name()`` / ``as_numpy()``,
``InferenceRequest(model_name=, inputs=, requested_output_names=)`` with ``inputs()``,
``InferenceResponse(output_tensors=, error=)`` with ``output_tensors()`` / ``has_error()`` / ``error()``,
``TritonError(message)`` with ``message()``, ``get_input_tensor_by_name`` and
``get_output_tensor_by_name``. Source of the API: https://github.com/triton-inference-server/python_backend#usage
"""

from __future__ import annotations

import numpy as np


class TritonError(Exception):
    """An error a model returns in a response (the request fails; the model keeps serving)."""

    def __init__(self, message: str):
        super().__init__(message)
        self._message = message

    def message(self) -> str:
        return self._message


class Tensor:
    """A named numpy array. Like Triton's, it refuses a non-numpy value and keeps BYTES as object arrays."""

    def __init__(self, name: str, array: np.ndarray):
        if not isinstance(array, np.ndarray):
            raise TritonError(f"Tensor {name!r}: expected a numpy array, got {type(array).__name__}")
        self._name, self._array = name, array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class InferenceRequest:
    """One request as ``execute`` receives it."""

    def __init__(self, model_name: str = "", inputs: list | None = None, requested_output_names: list | None = None):
        self.model_name = model_name
        self._inputs = list(inputs or [])
        self._requested = list(requested_output_names or [])

    def inputs(self) -> list:
        return self._inputs

    def requested_output_names(self) -> list:
        return self._requested


class InferenceResponse:
    """The response to one request: output tensors, or an error."""

    def __init__(self, output_tensors: list | None = None, error: TritonError | None = None):
        self._outputs = list(output_tensors or [])
        self._error = error

    def output_tensors(self) -> list:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return next((t for t in request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in response.output_tensors() if t.name() == name), None)
