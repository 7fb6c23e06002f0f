"""A fake of the ``tensorrt`` module and of the CUDA runtime library, for running hllm's TensorRT builder and
runner through the real Polygraphy on a machine without a GPU or TensorRT.

The fakes sit at the two boundaries Polygraphy itself crosses, nowhere inside hllm:

* ``tensorrt``: a module object put into ``sys.modules`` (Polygraphy imports it lazily,
  ``polygraphy.mod.trt_importer.lazy_import_trt``). It implements the TensorRT Python API surface
  Polygraphy 0.53.6 calls (``Builder``, ``INetworkDefinition``, ``OnnxParser``, ``IBuilderConfig``,
  ``IOptimizationProfile``, ``ITimingCache``, ``Runtime``, ``ICudaEngine``, ``IExecutionContext``,
  ``IOutputAllocator``, the enums), with the names of the TensorRT Python API documentation, and
  records every call. The "plan" it builds is JSON naming the ONNX file, the network flags and the
  profiles; its execution context checks input shapes against the active profile like TensorRT and
  computes ``scores`` by running the ONNX graph in ONNX Runtime on the bytes found at the tensor
  addresses Polygraphy bound, then hands them to Polygraphy's output allocator.
* ``libcudart``: Polygraphy's ``polygraphy.cuda.wrapper()`` calls ``ctypes.CDLL("libcudart.so")``
  functions (``cudaMalloc``, ``cudaMemcpyAsync``, ``cudaStreamCreate`` …). :class:`FakeCudart` implements
  them over host memory (``ctypes`` buffers), so "device pointers" are real addresses and Polygraphy's
  copies really move the bytes.
"""

from __future__ import annotations

import ctypes
import enum
import json
import types

import numpy as np

# -- CUDA runtime ----------------------------------------------------------------------------------------
class FakeCudart:
    """The functions of ``libcudart.so`` that Polygraphy's CUDA wrapper and hllm's device query call."""

    def __init__(self, name: str = "NVIDIA H100 80GB HBM3", cc=(9, 0), runtime: int = 12080, driver: int = 12080):
        self.name, self.cc, self.runtime, self.driver = name, cc, runtime, driver
        self.mem: dict[int, ctypes.Array] = {}
        self.calls: list[tuple] = []
        self._streams = 0

    @staticmethod
    def _out(ref, value) -> None:
        ref._obj.value = value  # ctypes.byref(x) → CArgObject whose _obj is x

    def cudaMalloc(self, ref, nbytes):
        buf = ctypes.create_string_buffer(max(int(nbytes.value), 1))
        self.mem[ctypes.addressof(buf)] = buf
        self._out(ref, ctypes.addressof(buf))
        self.calls.append(("cudaMalloc", int(nbytes.value)))
        return 0

    def cudaFree(self, ptr):
        self.mem.pop(ptr.value, None)
        self.calls.append(("cudaFree",))
        return 0

    def cudaMemcpyAsync(self, dst, src, nbytes, kind, stream):
        ctypes.memmove(dst.value, src.value, nbytes.value)
        self.calls.append(("cudaMemcpyAsync", int(kind.value), int(nbytes.value), stream.value))
        return 0

    def cudaMemcpy(self, dst, src, nbytes, kind):
        ctypes.memmove(dst.value, src.value, nbytes.value)
        self.calls.append(("cudaMemcpy", int(kind.value), int(nbytes.value)))
        return 0

    def cudaStreamCreate(self, ref):
        self._streams += 1
        self._out(ref, 0x5EED0 + self._streams)
        self.calls.append(("cudaStreamCreate",))
        return 0

    def cudaStreamSynchronize(self, ptr):
        self.calls.append(("cudaStreamSynchronize", ptr.value))
        return 0

    def cudaStreamDestroy(self, ptr):
        self.calls.append(("cudaStreamDestroy", ptr.value))
        return 0

    def cudaSetDevice(self, dev):
        self.calls.append(("cudaSetDevice", int(dev.value)))
        return 0

    def cudaDeviceGetAttribute(self, ref, attr, dev):
        self._out(ref, {75: self.cc[0], 76: self.cc[1]}[int(attr.value)])
        return 0

    def cudaGetDeviceProperties_v2(self, props, dev):
        raw = self.name.encode() + b"\x00"
        ctypes.memmove(ctypes.addressof(props), raw, len(raw))
        return 0

    def cudaRuntimeGetVersion(self, ref):
        self._out(ref, self.runtime)
        return 0

    def cudaDriverGetVersion(self, ref):
        self._out(ref, self.driver)
        return 0


# -- tensorrt --------------------------------------------------------------------------------------------
def _enum(name: str, names) -> type[enum.IntEnum]:
    return enum.IntEnum(name, {n: i for i, n in enumerate(names)})


_ONNX_TO_TRT = {1: "float32", 10: "float16", 6: "int32", 7: "int64", 9: "bool", 3: "int8", 2: "uint8", 16: "bfloat16"}
_TRT_TO_NP = {"float32": np.float32, "float16": np.float16, "int32": np.int32, "int64": np.int64, "bool": np.bool_,
              "int8": np.int8, "uint8": np.uint8}


class HostMemory(bytes):
    """``IHostMemory``: bytes that are also a context manager (Polygraphy writes ``with cache.serialize() as b``)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def make_tensorrt(version: str, rec: list) -> types.ModuleType:
    """A fake ``tensorrt`` module of ``version`` (10.x: ``BuilderFlag.FP16`` etc. and ``STRONGLY_TYPED``;
    11.x: no FP16/BF16/INT8 builder flags, ``STRONGLY_TYPED`` kept as a deprecated no-op). Calls go to ``rec``."""
    major = int(version.split(".")[0])
    trt = types.ModuleType("tensorrt")
    trt.__version__ = version
    trt.NetworkDefinitionCreationFlag = _enum("NetworkDefinitionCreationFlag", ["EXPLICIT_BATCH", "STRONGLY_TYPED",
                                                                               "PREFER_AOT_PYTHON_PLUGINS"])
    trt.BuilderFlag = _enum("BuilderFlag", (["FP16", "BF16", "INT8"] if major < 11 else []) + ["TF32", "REFIT", "DIRECT_IO"])
    trt.MemoryPoolType = _enum("MemoryPoolType", ["WORKSPACE", "DLA_MANAGED_SRAM", "DLA_LOCAL_DRAM", "TACTIC_DRAM"])
    trt.HardwareCompatibilityLevel = _enum("HardwareCompatibilityLevel", ["NONE", "AMPERE_PLUS", "SAME_COMPUTE_CAPABILITY"])
    trt.TensorIOMode = _enum("TensorIOMode", ["NONE", "INPUT", "OUTPUT"])
    trt.TensorFormat = _enum("TensorFormat", ["LINEAR", "CHW2", "HWC8", "CHW4", "CHW16", "CHW32", "HWC"])
    trt.DeviceType = _enum("DeviceType", ["GPU", "DLA"])
    trt.LayerType = _enum("LayerType", ["SHAPE", "QUANTIZE", "DEQUANTIZE"])
    trt.ProfilingVerbosity = _enum("ProfilingVerbosity", ["LAYER_NAMES_ONLY", "NONE", "DETAILED"])
    trt.DataType = _enum("DataType", list(_ONNX_TO_TRT.values()))
    for n, v in trt.DataType.__members__.items():
        setattr(trt, n, v)

    class ILogger:
        def __init__(self):
            pass

    class Logger(ILogger):
        INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = range(5)

        def __init__(self, severity=2):
            super().__init__()

    trt.ILogger, trt.Logger = ILogger, Logger
    trt.init_libnvinfer_plugins = lambda logger, namespace: True

    class IOutputAllocator:
        def __init__(self):
            pass

    trt.IOutputAllocator = IOutputAllocator
    _build_api(trt, rec)
    _run_api(trt, rec)
    return trt


def _build_api(trt, rec: list) -> None:
    class Tensor:
        def __init__(self, name, shape, dtype):
            self.name, self.shape, self.dtype, self.is_shape_tensor = name, tuple(shape), dtype, False

    class Network:
        def __init__(self, flags):
            self.flags, self.inputs = flags, []

        num_inputs = property(lambda self: len(self.inputs))

        def get_input(self, i):
            return self.inputs[i]

        def get_flag(self, flag):
            return bool(self.flags & (1 << int(flag)))

        def __iter__(self):
            return iter(())  # no layer has a precision set (strongly typed graph)

    class OnnxParser:
        def __init__(self, network, logger):
            self.network, self.num_errors, self.flags = network, 0, 0

        def parse_from_file(self, path):
            import onnx

            rec.append(("parse_from_file", path))
            g = onnx.load(path, load_external_data=False).graph
            for i in g.input:
                t = i.type.tensor_type
                shape = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
                self.network.inputs.append(Tensor(i.name, shape, getattr(trt, _ONNX_TO_TRT[t.elem_type])))
            self.network.onnx = path
            return True

    class OptimizationProfile:
        def __init__(self):
            self.shapes = {}

        def set_shape(self, name, mn, opt, mx):
            rec.append(("set_shape", name, tuple(mn), tuple(opt), tuple(mx)))
            self.shapes[name] = (tuple(mn), tuple(opt), tuple(mx))

        def __bool__(self):
            return True

    class TimingCache:
        def __init__(self, blob):
            self.blob = bytes(blob)

        def combine(self, other, ignore_mismatch):
            rec.append(("combine_timing_cache", other.blob, ignore_mismatch))
            self.blob = other.blob + self.blob if other.blob not in self.blob else self.blob
            return True

        def serialize(self):
            return HostMemory(self.blob)

    class BuilderConfig:
        def __init__(self):
            object.__setattr__(self, "_pools", {})
            object.__setattr__(self, "_flags", {trt.BuilderFlag.TF32})  # TensorRT's default
            object.__setattr__(self, "profiles", [])
            object.__setattr__(self, "_cache", None)
            object.__setattr__(self, "DLA_core", -1)
            object.__setattr__(self, "default_device_type", trt.DeviceType.GPU)

        def __setattr__(self, k, v):
            rec.append(("config", k, v))
            object.__setattr__(self, k, v)

        def set_flag(self, f):
            rec.append(("set_flag", f))
            self._flags.add(f)

        def clear_flag(self, f):
            rec.append(("clear_flag", f))
            self._flags.discard(f)

        def get_flag(self, f):
            return f in self._flags

        def set_memory_pool_limit(self, pool, n):
            rec.append(("set_memory_pool_limit", pool, n))
            self._pools[pool] = n

        def get_memory_pool_limit(self, pool):
            return self._pools.get(pool, 80 << 30)

        def add_optimization_profile(self, p):
            rec.append(("add_optimization_profile", len(self.profiles)))
            self.profiles.append(p)
            return len(self.profiles) - 1

        num_optimization_profiles = property(lambda self: len(self.profiles))

        def create_timing_cache(self, blob):
            rec.append(("create_timing_cache", bytes(blob)))
            return TimingCache(blob)

        def set_timing_cache(self, cache, ignore_mismatch):
            rec.append(("set_timing_cache", cache.blob, ignore_mismatch))
            object.__setattr__(self, "_cache", cache)
            return True

        def get_timing_cache(self):
            return self._cache

    class Builder:
        def __init__(self, logger):
            pass

        def create_network(self, flags=0):
            rec.append(("create_network", flags))
            return Network(flags)

        def create_builder_config(self):
            return BuilderConfig()

        def create_optimization_profile(self):
            return OptimizationProfile()

        def build_serialized_network(self, network, config):
            rec.append(("build_serialized_network",))
            config._cache.blob += b"+tuned"
            inputs = [(t.name, list(t.shape), t.dtype.name) for t in network.inputs]
            plan = {"fake_trt": trt.__version__, "onnx": network.onnx, "flags": network.flags, "inputs": inputs,
                    "profiles": [{k: [list(s) for s in v] for k, v in p.shapes.items()} for p in config.profiles]}
            return HostMemory(json.dumps(plan).encode())

    trt.Builder, trt.OnnxParser, trt.IOptimizationProfile, trt.ITimingCache = Builder, OnnxParser, OptimizationProfile, TimingCache
    trt.IBuilderConfig, trt.INetworkDefinition = BuilderConfig, Network


def _run_api(trt, rec: list) -> None:
    class ICudaEngine:
        def __init__(self, plan: dict):
            self.plan = plan
            self.inputs = {n: (tuple(s), getattr(trt, d)) for n, s, d in plan["inputs"]}
            self.names = [*self.inputs, "scores"]

        num_io_tensors = property(lambda self: len(self.names))
        num_optimization_profiles = property(lambda self: len(self.plan["profiles"]))

        def get_tensor_name(self, i):
            return self.names[i]

        def get_tensor_mode(self, name):
            return trt.TensorIOMode.INPUT if name in self.inputs else trt.TensorIOMode.OUTPUT

        def get_tensor_shape(self, name):
            return self.inputs[name][0] if name in self.inputs else (-1, -1, -1)

        def get_tensor_dtype(self, name):
            return self.inputs[name][1] if name in self.inputs else trt.float32

        def is_shape_inference_io(self, name):
            return False

        def get_tensor_format(self, name, profile=0):
            return trt.TensorFormat.LINEAR

        def create_execution_context(self):
            rec.append(("create_execution_context",))
            return IExecutionContext(self)

    class IExecutionContext:
        def __init__(self, engine):
            self.engine, self.active_optimization_profile = engine, 0
            self.shapes, self.addresses, self.allocators, self.fed = {}, {}, {}, []

        def set_optimization_profile_async(self, index, stream):
            rec.append(("set_optimization_profile_async", index, stream))
            if not 0 <= index < self.engine.num_optimization_profiles:
                return False
            self.active_optimization_profile = index
            return True

        def get_tensor_shape(self, name):
            return self.shapes.get(name, self.engine.get_tensor_shape(name))

        def set_input_shape(self, name, shape):
            mn, _, mx = self.engine.plan["profiles"][self.active_optimization_profile][name]
            ok = len(shape) == len(mn) and all(a <= s <= b for a, s, b in zip(mn, shape, mx))
            rec.append(("set_input_shape", name, tuple(shape), ok))
            if ok:
                self.shapes[name] = tuple(shape)
            return ok

        def get_tensor_address(self, name):
            return self.addresses.get(name, 0)

        def set_tensor_address(self, name, ptr):
            self.addresses[name] = int(ptr)
            return True

        def set_output_allocator(self, name, allocator):
            self.allocators[name] = allocator
            return True

        def execute_async_v3(self, stream):
            import onnxruntime as ort

            feeds = {}
            for name, (_, dtype) in self.engine.inputs.items():
                shape, np_dtype = self.shapes[name], np.dtype(_TRT_TO_NP[dtype.name])
                raw = ctypes.string_at(self.addresses[name], int(np.prod(shape)) * np_dtype.itemsize)
                feeds[name] = np.frombuffer(raw, np_dtype).reshape(shape).copy()
            self.fed.append(feeds)
            rec.append(("execute_async_v3", stream, {k: v.shape for k, v in feeds.items()}))
            sess = ort.InferenceSession(self.engine.plan["onnx"], providers=["CPUExecutionProvider"])
            scores = np.ascontiguousarray(sess.run(["scores"], feeds)[0], dtype=np.float32)
            alloc = self.allocators["scores"]
            ptr = alloc.reallocate_output_async("scores", 0, scores.nbytes, 256, stream)
            ctypes.memmove(ptr, scores.ctypes.data, scores.nbytes)
            alloc.notify_shape("scores", scores.shape)
            return True

    class Runtime:
        def __init__(self, logger):
            pass

        def deserialize_cuda_engine(self, buffer):
            plan = json.loads(bytes(buffer))
            rec.append(("deserialize_cuda_engine", plan["fake_trt"]))
            return ICudaEngine(plan)

    trt.ICudaEngine, trt.IExecutionContext, trt.Runtime = ICudaEngine, IExecutionContext, Runtime
