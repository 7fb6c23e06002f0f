"""TensorRT runner: load a plan built by :mod:`hllm.engines.tensorrt.builder` and run it (torch-free).

One recipe for TensorRT 10.x and 11.x (TensorRT "Migrating from 10.x to 11.x": 11 removed
``BuilderFlag.FP16/BF16/INT8`` and weak typing). Precision lives in the ONNX graph
(``hllm export --precision fp16``: FP16 with FP32 islands, :mod:`hllm.exporter.fp16`); the network
is strongly typed, so TensorRT runs every tensor in the graph's type:

* TensorRT 10.x: ``create_network(1 << NetworkDefinitionCreationFlag.STRONGLY_TYPED)``, no precision flag.
* TensorRT 11.x: every network is strongly typed (the flag is deprecated and ignored), so none is passed.
* TensorRT < 10: refused (no strongly typed ONNX import, no ``execute_async_v3`` / INT64 I/O).

Plans are built by :mod:`hllm.engines.tensorrt.builder` (it shares :func:`trt_api` and :func:`device_info`).

Run (:class:`TensorRTEngine`): ``Runtime.deserialize_cuda_engine`` after the sidecar compatibility
check; device buffers from cuda-python (``cuda.bindings.runtime``, or ``cuda.cudart`` in older
releases) sized for the largest profile and bound once with ``set_tensor_address``; per call:
``select_profile`` → ``set_optimization_profile_async`` (when it changes) → ``set_input_shape`` ×3 →
``cudaMemcpyAsync`` H→D → ``execute_async_v3(stream)`` → ``cudaMemcpyAsync`` D→H → one
``cudaStreamSynchronize``: everything is ordered on one CUDA stream.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hllm.engines.base import Engine
from hllm.formats.graph import OUTPUT_NAME, input_names, sidecar_reads_context
from hllm.errors import EngineError
from hllm.formats.precision import Precision
from hllm.formats.plan import DeviceInfo, check_compatible, profiles as sidecar_profiles, read_sidecar
from hllm.formats.profiles import Profile, select_profile

MIN_MAJOR = 10
INSTALL_HINT = ("install TensorRT from NVIDIA's package index, e.g. "
                "`pip install tensorrt-cu12 cuda-python --extra-index-url https://pypi.nvidia.com` (see docs/tensorrt.md)")


def import_tensorrt():
    """``import tensorrt``; raises EngineError with the install hint when it is missing or broken."""
    try:
        import tensorrt
    except ImportError as e:  # also OSError-like failures surface as ImportError (missing libnvinfer)
        raise EngineError(f"TensorRT is not importable ({e}); {INSTALL_HINT}") from None
    return tensorrt


@dataclass(frozen=True)
class TrtApi:
    """The TensorRT code path chosen for an installed version.

    Attributes:
        version: ``tensorrt.__version__``. major: its major number.
        network_flags: the ``create_network`` flags (STRONGLY_TYPED bit on 10.x, 0 on 11.x).
    """

    version: str
    major: int
    network_flags: int


def trt_api(trt) -> TrtApi:
    """Choose the TensorRT 10.x or 11.x code path for module ``trt`` (see module docstring).

    Raises: EngineError for TensorRT < 10 or a 10.x without ``STRONGLY_TYPED``.
    """
    version = str(getattr(trt, "__version__", "0"))
    try:
        major = int(version.split(".")[0])
    except ValueError:
        raise EngineError(f"cannot read the TensorRT version {version!r}") from None
    if major < MIN_MAJOR:
        raise EngineError(f"TensorRT {version} is too old: hllm needs TensorRT 10.x or 11.x (strongly typed "
                          f"networks, execute_async_v3, INT64 inputs)")
    strongly_typed = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    if major == MIN_MAJOR:
        if strongly_typed is None:
            raise EngineError(f"TensorRT {version} lacks NetworkDefinitionCreationFlag.STRONGLY_TYPED; upgrade to 10.x ≥ 10.0")
        flags = 1 << int(strongly_typed)
    else:
        flags = 0  # 11.x: strong typing is unconditional; STRONGLY_TYPED is deprecated and ignored
    return TrtApi(version, major, flags)


# -- CUDA (cuda-python), kept thin ---------------------------------------------------------------------
def _cudart():
    try:
        from cuda.bindings import runtime as cudart  # cuda-python ≥ 12.6
    except ImportError:
        try:
            from cuda import cudart  # older cuda-python
        except ImportError:
            raise EngineError(f"cuda-python is not installed; {INSTALL_HINT}") from None
    return cudart


def _ok(result, what: str):
    """Unpack a cuda-python ``(err, *values)`` tuple; raise EngineError on an error code."""
    if not isinstance(result, tuple):
        result = (result,)
    err, values = result[0], result[1:]
    if int(err) != 0:
        raise EngineError(f"CUDA {what} failed: {err}")
    return values[0] if len(values) == 1 else (values or None)


def device_info(device: int = 0) -> DeviceInfo:
    """Name, compute capability and CUDA runtime/driver versions of GPU ``device`` (cuda-python).

    Raises: EngineError when cuda-python or a GPU is missing.
    """
    cudart = _cudart()
    prop = _ok(cudart.cudaGetDeviceProperties(device), "cudaGetDeviceProperties")
    name = prop.name.decode(errors="replace").rstrip("\x00") if isinstance(prop.name, bytes) else str(prop.name)
    rt = _ok(cudart.cudaRuntimeGetVersion(), "cudaRuntimeGetVersion")
    drv = _ok(cudart.cudaDriverGetVersion(), "cudaDriverGetVersion")
    fmt = lambda v: f"{int(v) // 1000}.{(int(v) % 1000) // 10}"  # noqa: E731  12040 → "12.4"
    return DeviceInfo(name, (int(prop.major), int(prop.minor)), fmt(rt), fmt(drv))


# -- run -------------------------------------------------------------------------------------------------
class TensorRTEngine(Engine):
    """Runs a plan built by :func:`hllm.engines.tensorrt.builder.build_plan` on one GPU.

    Args:
        plan_path: the ``.plan`` file.
        num_positions: K (checked against the sidecar).
        sidecar: the sidecar dict (read from ``<plan>.json`` when None).
        device: CUDA device ordinal.
    Raises (on activate): EngineError — TensorRT / cuda-python missing, plan built for another
    TensorRT version or GPU, plan unreadable, I/O names differ. On run: EngineError for a request
    outside the plan's optimization profiles.
    """

    name = "tensorrt"

    def __init__(self, plan_path: str | os.PathLike, num_positions: int, sidecar: dict | None = None, device: int = 0):
        super().__init__(num_positions, (sidecar or {}).get("precision"), sidecar_reads_context(sidecar or {}))
        self.plan_path = Path(plan_path)
        self.sidecar = sidecar
        self.device = device
        self._profiles: list[Profile] = []
        self._ctx = None

    def _activate(self) -> None:
        if not self.plan_path.is_file():
            raise EngineError(f"TensorRT plan not found: {self.plan_path}")
        meta = read_sidecar(self.plan_path)
        if self.sidecar and self.sidecar.get("plan_sha256") not in (None, meta.get("plan_sha256")):
            raise EngineError(f"the sidecar given does not belong to {self.plan_path}")
        self.sidecar = meta
        self.precision = Precision.parse(meta.get("precision"))
        self.context = sidecar_reads_context(meta)
        if int(meta["num_positions"]) != self.num_positions:
            raise EngineError(f"{self.plan_path} outputs K={meta['num_positions']}, expected {self.num_positions}")
        self._profiles = sidecar_profiles(meta)
        trt = import_tensorrt()
        trt_api(trt)
        cudart = _cudart()
        _ok(cudart.cudaSetDevice(self.device), "cudaSetDevice")
        check_compatible(meta, trt.__version__, device_info(self.device))
        self._trt, self._cudart = trt, cudart
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        engine = self._runtime.deserialize_cuda_engine(self.plan_path.read_bytes())
        if engine is None:
            raise EngineError(f"TensorRT cannot deserialize {self.plan_path} (see the TensorRT log)")
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        want = [*input_names(self.context), OUTPUT_NAME]
        if sorted(names) != sorted(want):
            raise EngineError(f"{self.plan_path} has I/O tensors {names}, expected {want}")
        if engine.num_optimization_profiles != len(self._profiles):
            raise EngineError(f"{self.plan_path} has {engine.num_optimization_profiles} profiles, sidecar lists {len(self._profiles)}")
        self._engine = engine
        self._ctx = engine.create_execution_context()
        self._stream = _ok(cudart.cudaStreamCreate(), "cudaStreamCreate")
        bmax = max(p.batch.max for p in self._profiles)
        smax = max(p.seq.max for p in self._profiles)
        nmax = max(p.items.max for p in self._profiles)
        sizes = {"input_ids": bmax * smax * 8, "readout_positions": bmax * nmax * 8, "item_mask": bmax * nmax,
                 OUTPUT_NAME: bmax * nmax * self.num_positions * 4}
        if self.context:
            sizes["context_positions"] = bmax * 8
        self._buf = {}
        for name, nbytes in sizes.items():
            ptr = _ok(cudart.cudaMalloc(nbytes), f"cudaMalloc({name})")
            self._buf[name] = int(ptr)
            if not self._ctx.set_tensor_address(name, int(ptr)):
                raise EngineError(f"TensorRT rejected the address of {name}")
        self._profile_index = None

    def _deactivate(self) -> None:
        cudart = getattr(self, "_cudart", None)
        if cudart is not None:
            for ptr in getattr(self, "_buf", {}).values():
                cudart.cudaFree(ptr)
            if getattr(self, "_stream", None) is not None:
                cudart.cudaStreamDestroy(self._stream)
        self._buf, self._stream, self._ctx, self._engine, self._runtime = {}, None, None, None, None

    def _run(self, input_ids, readout_positions, item_mask, context_positions=None) -> np.ndarray:
        cudart, ctx, stream = self._cudart, self._ctx, self._stream
        b, s = input_ids.shape
        n = item_mask.shape[1]
        idx = select_profile(self._profiles, b, s, n)
        if idx != self._profile_index:
            if not ctx.set_optimization_profile_async(idx, int(stream)):
                raise EngineError(f"TensorRT cannot switch to optimization profile {idx}")
            self._profile_index = idx
        h2d = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        host = self.feeds(input_ids, readout_positions, item_mask, context_positions)
        for name, arr in host.items():
            if not ctx.set_input_shape(name, arr.shape):
                raise EngineError(f"TensorRT rejected shape {arr.shape} for {name}")
            _ok(cudart.cudaMemcpyAsync(self._buf[name], arr.ctypes.data, arr.nbytes, h2d, stream), f"copy {name}")
        if not ctx.execute_async_v3(int(stream)):
            raise EngineError("TensorRT execute_async_v3 failed (see the TensorRT log)")
        out = np.empty((b, n, self.num_positions), dtype=np.float32)
        d2h = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        _ok(cudart.cudaMemcpyAsync(out.ctypes.data, self._buf[OUTPUT_NAME], out.nbytes, d2h, stream), "copy scores")
        _ok(cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
        return out


__all__ = ["TensorRTEngine", "TrtApi", "device_info", "import_tensorrt", "trt_api"]
