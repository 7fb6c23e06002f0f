"""TensorRT runner: load a plan built by :mod:`hllm.exporter.plan` and run it through
Polygraphy (torch-free).

One recipe for TensorRT 10.x and 11.x (TensorRT "Migrating from 10.x to 11.x": 11 removed
``BuilderFlag.FP16/BF16/INT8`` and weak typing). Precision lives in the ONNX graph
(``hllm export --precision fp16``: FP16 with FP32 islands, :mod:`hllm.exporter.fp16`); the network
is strongly typed, so TensorRT runs every tensor in the graph's type:

* TensorRT 10.x: the network is created with ``NetworkDefinitionCreationFlag.STRONGLY_TYPED``
  (Polygraphy ``NetworkFromOnnxPath(..., strongly_typed=True)``), no precision flag.
* TensorRT 11.x: every network is strongly typed (the flag is deprecated, later removed), so none is passed.
* TensorRT < 10: refused (no strongly typed ONNX import, no ``execute_async_v3`` / INT64 I/O).

The TensorRT and CUDA work is Polygraphy's (``polygraphy.backend.trt``, 0.53.6; docs
https://docs.nvidia.com/deeplearning/tensorrt/polygraphy/docs/): ``EngineFromBytes`` deserializes the
plan, ``TrtRunner`` owns the execution context, its CUDA stream, the device input buffers and the
output allocator; per call hllm picks the optimization profile by slate shape
(:func:`hllm.engines.tensorrt.profiles.select_profile`), switches with ``TrtRunner.set_profile`` when it
changes, and calls ``TrtRunner.infer(feed_dict, copy_outputs_to_host=True)`` (``set_input_shape``,
host→device copies, ``execute_async_v3``, device→host copy and one stream synchronize, all inside
Polygraphy). hllm keeps its own parts: the sidecar and compatibility check (:mod:`hllm.formats.plan`),
the I/O-name and profile-count checks, and the profile choice.

The device query (:func:`device_info`) calls the CUDA runtime library that Polygraphy's
``polygraphy.cuda.wrapper()`` has loaded (``cudaDeviceGetAttribute``, ``cudaGetDeviceProperties``,
``cudaRuntimeGetVersion``, ``cudaDriverGetVersion``): no cuda-python.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hllm.engines.base import Engine
from hllm.engines.tensorrt.profiles import select_profile
from hllm.engines.tensorrt.targets import DeviceInfo, check_compatible
from hllm.errors import EngineError
from hllm.formats.graph import OUTPUT_NAME, input_names, sidecar_reads_context
from hllm.formats.plan import profiles as sidecar_profiles, read_sidecar
from hllm.formats.precision import Precision
from hllm.formats.profiles import Profile

MIN_MAJOR = 10
INSTALL_HINT = ("install TensorRT from NVIDIA's package index and Polygraphy, e.g. "
                "`pip install 'hllm[tensorrt]' tensorrt-cu12 --extra-index-url https://pypi.nvidia.com` (see docs/tensorrt.md)")
# cudaDeviceAttr values (CUDA runtime API, "cudaDeviceAttr"): compute capability major / minor.
_CUDA_DEV_ATTR_CC_MAJOR, _CUDA_DEV_ATTR_CC_MINOR = 75, 76


def import_tensorrt():
    """``import tensorrt``; raises EngineError with the install hint when it (or Polygraphy) is missing or broken."""
    try:
        import tensorrt
    except ImportError as e:  # also OSError-like failures surface as ImportError (missing libnvinfer)
        raise EngineError(f"TensorRT is not importable ({e}); {INSTALL_HINT}") from None
    try:
        import polygraphy  # noqa: F401
    except ImportError:
        raise EngineError(f"Polygraphy is not installed; {INSTALL_HINT}") from None
    return tensorrt


@contextlib.contextmanager
def polygraphy_calls(what: str, stdout_to_stderr: bool = False):
    """Run Polygraphy calls quietly (its logger at ERROR: warnings and progress off) and turn a
    ``PolygraphyException`` (raised by ``G_LOGGER.critical``) into an EngineError naming ``what``.
    ``stdout_to_stderr``: Polygraphy prints errors (e.g. the ONNX parser's) on stdout; the builder moves
    them to stderr so that ``--json`` output stays clean (not used on the runner's per-call path)."""
    from polygraphy.exception import PolygraphyException
    from polygraphy.logger import G_LOGGER

    redirect = contextlib.redirect_stdout(sys.stderr) if stdout_to_stderr else contextlib.nullcontext()
    try:
        with redirect, G_LOGGER.verbosity(G_LOGGER.ERROR):
            yield
    except PolygraphyException as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise EngineError(f"{what} failed in Polygraphy/TensorRT: {first}") from None


@dataclass(frozen=True)
class TrtApi:
    """The TensorRT code path chosen for an installed version.

    Attributes:
        version: ``tensorrt.__version__``. major: its major number.
        strongly_typed_flag: pass ``strongly_typed=True`` to Polygraphy's ``NetworkFromOnnxPath``
            (10.x: sets ``1 << NetworkDefinitionCreationFlag.STRONGLY_TYPED``); False on 11.x, where
            every network is strongly typed.
        network_flags: the ``create_network`` flags that follow (``1 << STRONGLY_TYPED`` on 10.x, 0 on 11.x).
    """

    version: str
    major: int
    strongly_typed_flag: bool
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
    if major > MIN_MAJOR:  # 11.x: strong typing is unconditional; STRONGLY_TYPED is deprecated and ignored
        return TrtApi(version, major, False, 0)
    strongly_typed = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    if strongly_typed is None:
        raise EngineError(f"TensorRT {version} lacks NetworkDefinitionCreationFlag.STRONGLY_TYPED; upgrade to 10.x ≥ 10.0")
    return TrtApi(version, major, True, 1 << int(strongly_typed))


# -- CUDA device query through Polygraphy's CUDA runtime wrapper -------------------------------------
def _cudart():
    """Polygraphy's global CUDA wrapper (``polygraphy.cuda.wrapper()``: libcudart via ctypes)."""
    from polygraphy import cuda

    try:
        with polygraphy_calls("loading the CUDA runtime"):
            return cuda.wrapper()
    except OSError as e:  # ctypes.CDLL("libcudart.so") found nothing: no CUDA runtime, no GPU driver stack
        raise EngineError(f"the CUDA runtime library (libcudart) cannot be loaded ({e}): TensorRT needs an NVIDIA GPU "
                          "with CUDA; put libcudart on LD_LIBRARY_PATH or `pip install nvidia-cuda-runtime-cu12`") from None


def _cuda_int(wrapper, fn: str, *args) -> int:
    val = ctypes.c_int(0)
    with polygraphy_calls(fn):
        wrapper.check(getattr(wrapper.handle, fn)(ctypes.byref(val), *args))
    return int(val.value)


def set_device(device: int = 0) -> None:
    """``cudaSetDevice(device)`` through Polygraphy's CUDA wrapper (the runner's stream and buffers follow it)."""
    wrapper = _cudart()
    with polygraphy_calls("cudaSetDevice"):
        wrapper.check(wrapper.handle.cudaSetDevice(ctypes.c_int(int(device))))


def device_info(device: int = 0) -> DeviceInfo:
    """Name, compute capability and CUDA runtime/driver versions of GPU ``device``.

    Calls the CUDA runtime (``cudaDeviceGetAttribute`` with ``cudaDevAttrComputeCapabilityMajor/Minor``,
    ``cudaGetDeviceProperties`` — ``name`` is the struct's first field, ``char[256]`` —,
    ``cudaRuntimeGetVersion``, ``cudaDriverGetVersion``) through the library Polygraphy loaded.
    Raises: EngineError when the CUDA runtime or a GPU is missing.
    """
    wrapper = _cudart()
    dev = ctypes.c_int(int(device))
    major = _cuda_int(wrapper, "cudaDeviceGetAttribute", ctypes.c_int(_CUDA_DEV_ATTR_CC_MAJOR), dev)
    minor = _cuda_int(wrapper, "cudaDeviceGetAttribute", ctypes.c_int(_CUDA_DEV_ATTR_CC_MINOR), dev)
    props = ctypes.create_string_buffer(16384)  # larger than any cudaDeviceProp (≈1 KB); only name is read
    fn = "cudaGetDeviceProperties_v2" if hasattr(wrapper.handle, "cudaGetDeviceProperties_v2") else "cudaGetDeviceProperties"
    with polygraphy_calls(fn):
        wrapper.check(getattr(wrapper.handle, fn)(props, dev))
    name = props.raw[:256].split(b"\x00", 1)[0].decode(errors="replace")
    fmt = lambda v: f"{int(v) // 1000}.{(int(v) % 1000) // 10}"  # noqa: E731  12040 → "12.4"
    rt = _cuda_int(wrapper, "cudaRuntimeGetVersion")
    drv = _cuda_int(wrapper, "cudaDriverGetVersion")
    return DeviceInfo(name, (major, minor), fmt(rt), fmt(drv))


# -- run -------------------------------------------------------------------------------------------------
class TensorRTEngine(Engine):
    """Runs a plan built by :func:`hllm.exporter.plan.build_plan` on one GPU (Polygraphy ``TrtRunner``).

    Args:
        plan_path: the ``.plan`` file.
        num_positions: K (checked against the sidecar).
        sidecar: the sidecar dict (read from ``<plan>.json`` when None).
        device: CUDA device ordinal.
    Run: inputs as in :mod:`hllm.engines.base` (``context_positions [B] int64`` too when the head reads
    the user context) → ``scores [B, N, K] float32``.
    Raises (on activate): EngineError — TensorRT / Polygraphy missing, plan built for another
    TensorRT version or GPU, plan unreadable, I/O names or profile count differ. On run: EngineError
    for a request outside the plan's optimization profiles or an output of the wrong shape.
    """

    name = "tensorrt"

    def __init__(self, plan_path: str | os.PathLike, num_positions: int, sidecar: dict | None = None, device: int = 0):
        super().__init__(num_positions, (sidecar or {}).get("precision"), sidecar_reads_context(sidecar or {}))
        self.plan_path = Path(plan_path)
        self.sidecar = sidecar
        self.device = device
        self._profiles: list[Profile] = []
        self._runner = None
        self._profile_index = None

    def _read_meta(self) -> dict:
        if not self.plan_path.is_file():
            raise EngineError(f"TensorRT plan not found: {self.plan_path}")
        meta = read_sidecar(self.plan_path)
        if self.sidecar and self.sidecar.get("plan_sha256") not in (None, meta.get("plan_sha256")):
            raise EngineError(f"the sidecar given does not belong to {self.plan_path}")
        if int(meta["num_positions"]) != self.num_positions:
            raise EngineError(f"{self.plan_path} outputs K={meta['num_positions']}, expected {self.num_positions}")
        return meta

    def _activate(self) -> None:
        meta = self._read_meta()
        self.sidecar = meta
        self.precision = Precision.parse(meta.get("precision"))
        self.context = sidecar_reads_context(meta)
        self._profiles = sidecar_profiles(meta)
        trt = import_tensorrt()
        trt_api(trt)
        set_device(self.device)
        check_compatible(meta, trt.__version__, device_info(self.device))
        from polygraphy.backend.trt import EngineFromBytes, TrtRunner

        with polygraphy_calls(f"deserializing {self.plan_path}"):
            engine = EngineFromBytes(self.plan_path.read_bytes())()
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        want = [*input_names(self.context), OUTPUT_NAME]
        if sorted(names) != sorted(want):
            raise EngineError(f"{self.plan_path} has I/O tensors {names}, expected {want}")
        if engine.num_optimization_profiles != len(self._profiles):
            raise EngineError(f"{self.plan_path} has {engine.num_optimization_profiles} profiles, sidecar lists {len(self._profiles)}")
        runner = TrtRunner(engine, name="hllm-tensorrt")
        with polygraphy_calls("activating the TensorRT runner"):
            runner.activate()
        self._runner, self._profile_index = runner, None

    def _deactivate(self) -> None:
        runner, self._runner, self._profile_index = self._runner, None, None
        if runner is not None and runner.is_active:
            with polygraphy_calls("deactivating the TensorRT runner"):
                runner.deactivate()

    def _run(self, input_ids, readout_positions, item_mask, context_positions=None) -> np.ndarray:
        b, s = input_ids.shape
        n = item_mask.shape[1]
        idx = select_profile(self._profiles, b, s, n)
        feeds = OrderedDict(self.feeds(input_ids, readout_positions, item_mask, context_positions))
        with polygraphy_calls(f"TensorRT inference (profile {idx}, batch={b} seq={s} items={n})"):
            if idx != self._profile_index:
                self._runner.set_profile(idx)
                self._profile_index = idx
            outputs = self._runner.infer(feeds, copy_outputs_to_host=True)
        scores = outputs.get(OUTPUT_NAME)
        want = (b, n, self.num_positions)
        if scores is None or tuple(scores.shape) != want:
            raise EngineError(f"TensorRT returned {OUTPUT_NAME} of shape {None if scores is None else tuple(scores.shape)}, "
                              f"expected {want}")
        return np.array(scores, dtype=np.float32, copy=True)  # Polygraphy reuses its host buffers between calls


__all__ = ["TensorRTEngine", "TrtApi", "device_info", "import_tensorrt", "polygraphy_calls", "set_device", "trt_api"]
