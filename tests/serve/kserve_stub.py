"""A small stand-in for Triton: runs a generated model repository behind the KServe v2 HTTP protocol.

    python kserve_stub.py --repo OUT/models --pb2 .../model_config_pb2.py [--port 0]

It does what Triton does with the repository, on 127.0.0.1 only: parses every ``config.pbtxt`` as
Triton's ``ModelConfig`` protobuf; loads each Python-backend model from its ``1/model.py`` the way the
Python backend does (version and model directories on ``sys.path``, ``initialize(args)`` with
Triton's keys), each with a fresh set of ``hllm`` modules (Triton runs each in its own process);
loads an ``onnxruntime_onnx`` engine with ONNX Runtime and runs its ``model_warmup`` (raw
``warmup/`` files); runs the ensemble's steps by their ``input_map`` / ``output_map``; checks every
tensor's data type and dims (batch dim ≤ ``max_batch_size``) against the configs, in and out; applies
an input's ``reshape`` before the engine runs; refuses, as Triton does on load, a tensor without dims, an
ensemble step reading a tensor nothing produced, a warm-up that does not feed every input.
Endpoints: ``GET /v2/health/{live,ready}``, ``GET /v2/models/NAME[/ready]``,
``POST /v2/models/NAME[/versions/V]/infer`` with JSON tensors or the binary tensor extension
(``Inference-Header-Content-Length``), which ``tritonclient.http`` uses by default.
It prints ``PORT <n>`` once ready and ``HLLM_MODULES <json>`` (where every loaded hllm module came
from). Protocol: https://github.com/kserve/open-inference-protocol (REST),
https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_binary_data.md
Not Triton: one process, no scheduling or dynamic batching, CPU only, no TensorRT.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import struct
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent / "triton_stub"))
import triton_python_backend_utils as pb_utils  # noqa: E402

NUMPY = {"TYPE_INT64": np.int64, "TYPE_BOOL": np.bool_, "TYPE_FP32": np.float32, "TYPE_STRING": np.object_}
V2 = {"TYPE_INT64": "INT64", "TYPE_BOOL": "BOOL", "TYPE_FP32": "FP32", "TYPE_STRING": "BYTES"}
FROM_V2 = {"INT64": np.int64, "BOOL": np.bool_, "FP32": np.float32, "BYTES": np.object_}


class InferError(Exception):
    """A request Triton would answer with 400 and ``{"error": message}``."""


def load_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def to_bytes(arr: np.ndarray) -> bytes:
    if arr.dtype == np.object_:
        out = b""
        for x in arr.reshape(-1):
            b = x if isinstance(x, bytes) else str(x).encode("utf-8")
            out += struct.pack("<I", len(b)) + b
        return out
    return np.ascontiguousarray(arr).tobytes()


def from_bytes(raw: bytes, dtype, shape: list[int]) -> np.ndarray:
    if dtype is np.object_:
        items, i = [], 0
        while i < len(raw):
            (n,) = struct.unpack_from("<I", raw, i)
            items.append(raw[i + 4 : i + 4 + n])
            i += 4 + n
        return np.array(items, dtype=object).reshape(shape)
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


class Model:
    """One model of the repository: its parsed config and how to run it."""

    def __init__(self, cfg, home: Path):
        self.cfg, self.home, self.name = cfg, home, cfg.name

    def check(self, tensors: dict, specs, what: str) -> int:
        """Check names, dtypes and dims against the config; returns the batch size."""
        pb = self.pb2
        batches = set()
        for spec in specs:
            if spec.name not in tensors:
                raise InferError(f"{self.name}: {what} {spec.name!r} missing")
            a = tensors[spec.name]
            dt = pb.DataType.Name(spec.data_type)
            if a.dtype != np.dtype(NUMPY[dt]):
                raise InferError(f"{self.name}: {what} {spec.name!r} has dtype {a.dtype}, config says {dt}")
            shape = list(a.shape)
            if self.cfg.max_batch_size > 0:
                if not shape or shape[0] > self.cfg.max_batch_size:
                    raise InferError(f"{self.name}: {what} {spec.name!r} batch {shape[:1]} over max_batch_size {self.cfg.max_batch_size}")
                batches.add(shape[0])
                shape = shape[1:]
            dims = list(spec.dims)
            if len(shape) != len(dims) or any(d != -1 and d != s for d, s in zip(dims, shape)):
                raise InferError(f"{self.name}: {what} {spec.name!r} has shape {list(a.shape)}, config dims {dims}")
        if len(batches) > 1:
            raise InferError(f"{self.name}: {what}s disagree on the batch size: {sorted(batches)}")
        return batches.pop() if batches else 0

    def infer(self, inputs: dict) -> dict:
        self.check(inputs, self.cfg.input, "input")
        outputs = self.run(inputs)
        self.check(outputs, self.cfg.output, "output")
        return outputs


class PythonModel(Model):
    def __init__(self, cfg, home: Path):
        super().__init__(cfg, home)
        version = home / "1"
        for key in [k for k in sys.modules if k == "hllm" or k.startswith("hllm.")]:
            del sys.modules[key]  # Triton runs each Python model in its own process
        sys.path.extend([str(version), str(home)])  # what the Python backend's stub appends
        module = load_module(f"{cfg.name}_1_model", version / "model.py")
        self.modules = {k: getattr(m, "__file__", None) for k, m in sys.modules.items() if k == "hllm" or k.startswith("hllm.")}
        self.instance = module.TritonPythonModel()
        from google.protobuf import json_format

        self.instance.initialize({
            "model_config": json_format.MessageToJson(cfg, preserving_proto_field_name=True),
            "model_instance_kind": "CPU", "model_instance_name": f"{cfg.name}_0", "model_instance_device_id": "0",
            "model_repository": str(home), "model_version": "1", "model_name": cfg.name,
        })

    def run(self, inputs: dict) -> dict:
        request = pb_utils.InferenceRequest(model_name=self.name, inputs=[pb_utils.Tensor(k, v) for k, v in inputs.items()],
                                            requested_output_names=[o.name for o in self.cfg.output])
        responses = self.instance.execute([request])
        if len(responses) != 1:
            raise InferError(f"{self.name}: execute returned {len(responses)} responses for 1 request")
        if responses[0].has_error():
            raise InferError(responses[0].error().message())
        return {t.name(): t.as_numpy() for t in responses[0].output_tensors()}


class OrtModel(Model):
    def __init__(self, cfg, home: Path):
        super().__init__(cfg, home)
        import onnxruntime as ort

        self.session = ort.InferenceSession(str(home / "1" / (cfg.default_model_filename or "model.onnx")), providers=["CPUExecutionProvider"])
        self.warmups = 0
        for w in cfg.model_warmup:  # as Triton does before the model is ready
            feeds = {}
            for name, spec in w.inputs.items():
                dt = NUMPY[self.pb2.DataType.Name(spec.data_type)]
                shape = [w.batch_size, *spec.dims]
                if spec.HasField("input_data_file"):
                    raw = (home / "warmup" / spec.input_data_file).read_bytes() * w.batch_size
                    feeds[name] = from_bytes(raw, dt, shape)
                else:
                    feeds[name] = np.zeros(shape, dtype=dt)
            self.infer(feeds)
            self.warmups += 1

    def run(self, inputs: dict) -> dict:
        names = [o.name for o in self.cfg.output]
        feeds = {}
        for spec in self.cfg.input:  # Triton hands the backend the model's shape: [batch, *reshape.shape]
            a = inputs[spec.name]
            feeds[spec.name] = a.reshape(a.shape[0], *spec.reshape.shape) if spec.HasField("reshape") else a
        return dict(zip(names, self.session.run(names, feeds)))


class Ensemble(Model):
    def __init__(self, cfg, home: Path, models: dict):
        super().__init__(cfg, home)
        self.models = models

    def run(self, inputs: dict) -> dict:
        tensors = dict(inputs)
        for step in self.cfg.ensemble_scheduling.step:
            model = self.models[step.model_name]
            feeds = {k: tensors[v] for k, v in step.input_map.items()}
            outs = model.infer(feeds)
            tensors.update({v: outs[k] for k, v in step.output_map.items()})
        return {o.name: tensors[o.name] for o in self.cfg.output}


def validate(cfg) -> None:
    """Refuse what Triton refuses at load time: a tensor without dims, an ensemble step that reads a tensor
    no ensemble input or earlier step provides, a warm-up that does not feed every input."""
    for t in [*cfg.input, *cfg.output]:
        if not t.dims:
            raise SystemExit(f"{cfg.name}: tensor {t.name!r} has no dims (Triton requires non-empty dims)")
    produced = {t.name for t in cfg.input}
    for step in cfg.ensemble_scheduling.step:
        missing = set(step.input_map.values()) - produced
        if missing:
            raise SystemExit(f"{cfg.name}: step {step.model_name} reads {sorted(missing)}, which nothing produces")
        produced.update(step.output_map.values())
    for w in cfg.model_warmup:
        if set(w.inputs) != {t.name for t in cfg.input}:
            raise SystemExit(f"{cfg.name}: warm-up {w.name} feeds {sorted(w.inputs)}, not every input")


def load_repository(root: Path, pb2) -> dict:
    Model.pb2 = pb2
    from google.protobuf import text_format

    cfgs = {}
    for path in sorted(root.glob("*/config.pbtxt")):
        cfg = text_format.Parse(path.read_text(), pb2.ModelConfig())
        validate(cfg)
        cfgs[cfg.name] = (cfg, path.parent)
    models = {}
    for name, (cfg, home) in cfgs.items():
        if cfg.backend == "python":
            models[name] = PythonModel(cfg, home)
        elif cfg.platform == "onnxruntime_onnx":
            models[name] = OrtModel(cfg, home)
    for name, (cfg, home) in cfgs.items():
        if cfg.platform == "ensemble":
            models[name] = Ensemble(cfg, home, models)
    missing = set(cfgs) - set(models)
    if missing:
        raise SystemExit(f"stub cannot run {sorted(missing)} (only python, onnxruntime_onnx and ensemble)")
    return models


def make_handler(models: dict):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def _send(self, code: int, body: bytes, headers: dict | None = None) -> None:
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {"Content-Type": "application/json"}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, obj) -> None:
            self._send(code, json.dumps(obj).encode())

        def do_GET(self):
            path = self.path.split("?")[0].rstrip("/")
            if path in ("/v2/health/live", "/v2/health/ready"):
                return self._send(200, b"")
            m = re.fullmatch(r"/v2/models/([^/]+)(?:/versions/[^/]+)?(/ready)?", path)
            if not m or m.group(1) not in models:
                return self._json(404, {"error": f"unknown path or model: {path}"})
            if m.group(2):
                return self._send(200, b"")
            cfg = models[m.group(1)].cfg
            io = lambda ts: [{"name": t.name, "datatype": V2[Model.pb2.DataType.Name(t.data_type)],  # noqa: E731
                              "shape": ([-1] if cfg.max_batch_size else []) + list(t.dims)} for t in ts]
            return self._json(200, {"name": cfg.name, "versions": ["1"], "platform": cfg.platform or cfg.backend,
                                    "inputs": io(cfg.input), "outputs": io(cfg.output)})

        def do_POST(self):
            m = re.fullmatch(r"/v2/models/([^/]+)(?:/versions/[^/]+)?/infer", self.path.split("?")[0])
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if not m or m.group(1) not in models:
                return self._json(404, {"error": f"unknown model or path {self.path}"})
            try:
                hlen = self.headers.get("Inference-Header-Content-Length")
                head, blob = (json.loads(body[: int(hlen)]), body[int(hlen):]) if hlen else (json.loads(body), b"")
                inputs, off = {}, 0
                for t in head["inputs"]:
                    dt = FROM_V2[t["datatype"]]
                    size = (t.get("parameters") or {}).get("binary_data_size")
                    if size is not None:
                        inputs[t["name"]] = from_bytes(blob[off : off + size], dt, t["shape"])
                        off += size
                    else:
                        data = t["data"] if dt is not np.object_ else [str(x).encode() for x in t["data"]]
                        inputs[t["name"]] = np.array(data, dtype=dt).reshape(t["shape"])
                outputs = models[m.group(1)].infer(inputs)
            except (InferError, KeyError, ValueError) as e:
                return self._json(400, {"error": str(e)})
            wanted = head.get("outputs") or [{"name": k} for k in outputs]
            default_binary = (head.get("parameters") or {}).get("binary_data_output", False)
            meta, blobs = [], []
            for w in wanted:
                a = outputs[w["name"]]
                o = {"name": w["name"], "datatype": {np.dtype(v): k for k, v in FROM_V2.items()}[a.dtype], "shape": list(a.shape)}
                if (w.get("parameters") or {}).get("binary_data", default_binary):
                    raw = to_bytes(a)
                    o["parameters"] = {"binary_data_size": len(raw)}
                    blobs.append(raw)
                else:
                    o["data"] = [x.decode() for x in a.reshape(-1)] if a.dtype == np.object_ else a.reshape(-1).tolist()
                meta.append(o)
            header = json.dumps({"model_name": m.group(1), "model_version": "1", "id": head.get("id", ""), "outputs": meta}).encode()
            if blobs:
                return self._send(200, header + b"".join(blobs), {"Content-Type": "application/octet-stream",
                                                                  "Inference-Header-Content-Length": str(len(header))})
            return self._send(200, header)

    return Handler


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", required=True, help="the models/ folder of a generated repository")
    p.add_argument("--pb2", required=True, help="path of Triton's model_config_pb2.py (from tritonclient)")
    p.add_argument("--port", type=int, default=0)
    a = p.parse_args()
    models = load_repository(Path(a.repo), load_module("model_config_pb2", Path(a.pb2)))
    modules = {name: m.modules for name, m in models.items() if isinstance(m, PythonModel)}
    warmups = {name: m.warmups for name, m in models.items() if isinstance(m, OrtModel)}
    server = ThreadingHTTPServer(("127.0.0.1", a.port), make_handler(models))
    print("HLLM_MODULES " + json.dumps(modules), flush=True)
    print("WARMUPS " + json.dumps(warmups), flush=True)
    print(f"PORT {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
