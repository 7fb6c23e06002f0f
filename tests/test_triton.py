"""`hllm triton-repo`: configs parse as Triton model-config protobuf, match the exported ONNX graph, and
the Python-backend decode gives the runtime's rankings. No Triton server is run here."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from hllm.errors import DecodeError
from hllm.runtime import Ranker
from hllm.testing import tiny_slates
from hllm.serve.triton import decode_model
from hllm.serve.triton.client import build_request, load_builder, pad_batch, parse_response
from hllm.serve.triton.repo import write_repository

ONNX_TO_TRITON = {7: "TYPE_INT64", 9: "TYPE_BOOL", 1: "TYPE_FP32", 10: "TYPE_FP16"}


def _model_config_pb2():
    """Triton's ModelConfig protobuf from the tritonclient package (its grpc extra is not needed)."""
    tc = pytest.importorskip("tritonclient", reason="tritonclient not installed")
    try:
        from tritonclient.grpc import model_config_pb2

        return model_config_pb2
    except (ImportError, RuntimeError):  # tritonclient.grpc/__init__ needs grpcio; the pb2 module does not
        path = Path(tc.__file__).parent / "grpc" / "model_config_pb2.py"
        spec = importlib.util.spec_from_file_location("triton_model_config_pb2", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod


@pytest.fixture(scope="module")
def repo(export_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("triton") / "repo"
    write_repository(export_dir, out, max_batch_size=4, instances=2, kind="gpu", decode_instances=3)
    return out


def _config(repo: Path, name: str):
    from google.protobuf import text_format

    pb = _model_config_pb2()
    return text_format.Parse((repo / "models" / name / "config.pbtxt").read_text(), pb.ModelConfig()), pb


def test_configs_parse_and_match_the_onnx_graph(repo, export_dir):
    import onnx

    eng, pb = _config(repo, "hllm_engine")
    assert eng.name == "hllm_engine" and eng.platform == "onnxruntime_onnx" and eng.max_batch_size == 4
    assert eng.dynamic_batching.max_queue_delay_microseconds == 2000
    assert eng.instance_group[0].count == 2 and eng.instance_group[0].kind == pb.ModelInstanceGroup.KIND_GPU
    graph = onnx.load(str(repo / "models/hllm_engine/1/model.onnx"), load_external_data=False).graph
    for cfg_t, g_t in [*zip(eng.input, graph.input), *zip(eng.output, graph.output)]:
        assert cfg_t.name == g_t.name
        assert pb.DataType.Name(cfg_t.data_type) == ONNX_TO_TRITON[g_t.type.tensor_type.elem_type]
        gdims = [d.dim_value if d.HasField("dim_value") else -1 for d in g_t.type.tensor_type.shape.dim]
        assert gdims[0] == -1  # the batch dim is dynamic in the graph, implicit in Triton
        assert list(cfg_t.dims) == gdims[1:]
    assert len(eng.input) == len(graph.input) == 3 and len(eng.output) == len(graph.output) == 1
    assert list(eng.output[0].dims) == [-1, 8]  # [items, K]
    src = (export_dir / "model.onnx").read_bytes()
    assert (repo / "models/hllm_engine/1/model.onnx").read_bytes() == src


def test_decode_and_ensemble_configs_are_consistent(repo):
    eng, _ = _config(repo, "hllm_engine")
    dec, pb = _config(repo, "hllm_decode")
    ens, _ = _config(repo, "hllm_ranker")
    assert dec.backend == "python" and dec.instance_group[0].kind == pb.ModelInstanceGroup.KIND_CPU and dec.instance_group[0].count == 3
    assert [t.name for t in dec.input] == ["scores", "item_mask"] and [t.name for t in dec.output] == ["ranking"]
    assert ens.platform == "ensemble" and ens.max_batch_size == 4
    models = {"hllm_engine": eng, "hllm_decode": dec}
    produced = {t.name for t in ens.input}
    for step in ens.ensemble_scheduling.step:
        m = models[step.model_name]
        assert set(step.input_map) == {t.name for t in m.input}  # every model input is fed …
        assert set(step.input_map.values()) <= produced  # … from an ensemble input or an earlier step
        assert set(step.output_map) <= {t.name for t in m.output}
        produced |= set(step.output_map.values())
    assert {t.name for t in ens.output} <= produced == {"input_ids", "readout_positions", "item_mask", "scores", "ranking"}
    # shapes agree along each edge
    dims = {t.name: list(t.dims) for t in [*eng.input, *eng.output]}
    assert all(list(t.dims) == dims[t.name] for t in dec.input)
    assert (repo / "models/hllm_ranker/1").is_dir()


def test_python_backend_model_is_the_runtime_decode_not_a_copy(repo):
    src = (repo / "models/hllm_decode/1/model.py").read_text()
    assert "from hllm.serve.triton.decode_model import TritonPythonModel" in src and "lapjv" not in src
    spec = importlib.util.spec_from_file_location("triton_decode_model_py", repo / "models/hllm_decode/1/model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.TritonPythonModel is decode_model.TritonPythonModel
    assert decode_model.decode_batch.__module__ == "hllm.runtime.decode"


def _fake_pb_utils():
    """The part of Triton's ``triton_python_backend_utils`` API that the decode model uses."""
    m = types.ModuleType("triton_python_backend_utils")

    class Tensor:
        def __init__(self, name, array):
            self.name, self.array = name, np.asarray(array)

        def as_numpy(self):
            return self.array

    class InferenceResponse:
        def __init__(self, output_tensors, error=None):
            self.output_tensors, self.error = output_tensors, error

    class TritonError(Exception):
        pass

    m.Tensor, m.InferenceResponse, m.TritonError = Tensor, InferenceResponse, TritonError
    m.get_input_tensor_by_name = lambda req, name: next((t for t in req if t.name == name), None)
    return m


def test_python_backend_decode_gives_the_runtime_rankings(repo, export_dir, monkeypatch):
    """Client-side padded batch → ORT engine (as Triton's engine step) → decode model → == Ranker.rank."""
    slates = tiny_slates(7, (1, 8), seed=80)
    builder, cfg = load_builder(repo / "client")
    pb = _fake_pb_utils()
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    model = decode_model.TritonPythonModel()
    model.initialize({})
    with Ranker.from_path(export_dir) as ranker:
        want = ranker.rank(slates)
        requests, chunks = [], [slates[:4], slates[4:]]
        for chunk in chunks:
            batch = pad_batch(builder.encode(chunk), cfg["num_positions"], cfg["seq_bucket"], builder.pad_id)
            assert batch.item_mask.shape[1] == 8 and batch.input_ids.shape[1] % 64 == 0
            scores = ranker.scores(batch)
            requests.append([pb.Tensor("scores", scores), pb.Tensor("item_mask", batch.item_mask)])
        requests.append([pb.Tensor("scores", np.full((1, 2, 8), np.nan, np.float32)), pb.Tensor("item_mask", np.ones((1, 2), bool))])
        responses = model.execute(requests)
    assert len(responses) == 3
    got = []
    for resp, req, chunk in zip(responses[:2], requests, chunks):
        assert resp.error is None
        ranking = resp.output_tensors[0].as_numpy()
        assert ranking.dtype == np.int64 and ranking.shape == req[1].array.shape
        body = {"outputs": [
            {"name": "ranking", "shape": list(ranking.shape), "data": ranking.reshape(-1).tolist()},
            {"name": "scores", "shape": list(req[0].array.shape), "data": req[0].array.reshape(-1).tolist()},
        ]}
        got.extend(parse_response(body, chunk))  # what the client prints
    assert [g["order"] for g in got] == [w.order for w in want]
    assert [g["ranking"] for g in got] == [w.item_ids for w in want]
    np.testing.assert_allclose([s for g in got for s in g["scores"]], [s for w in want for s in w.scores], atol=1e-4)
    assert responses[2].error is not None and "non-finite" in str(responses[2].error)


def test_rank_arrays_checks_its_inputs():
    with pytest.raises(DecodeError, match="prefix"):
        decode_model.rank_arrays(np.zeros((1, 3, 4), np.float32), np.array([[True, False, True]]))
    with pytest.raises(DecodeError, match="must be"):
        decode_model.rank_arrays(np.zeros((1, 3, 4), np.float32), np.ones((1, 2), bool))
    r = decode_model.rank_arrays(np.eye(4, dtype=np.float32)[None, :, :], np.array([[True, True, True, False]]))
    assert r.tolist() == [[0, 1, 2, -1]]


def test_client_request_is_kserve_v2(repo):
    builder, cfg = load_builder(repo / "client")
    batch = pad_batch(builder.encode(tiny_slates(2, (2, 5), seed=3)), 8, 64, builder.pad_id)
    body = build_request(batch)
    by = {i["name"]: i for i in body["inputs"]}
    assert by["input_ids"]["datatype"] == "INT64" and by["item_mask"]["datatype"] == "BOOL"
    assert by["readout_positions"]["shape"] == [2, 8] and len(by["input_ids"]["data"]) == 2 * batch.input_ids.shape[1]
    assert cfg["model"] == "hllm_ranker" and (repo / "client/rank.py").is_file()


def test_cli_triton_repo_and_refusals(export_dir, merged_checkpoint, tmp_path):
    out = tmp_path / "r"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    run = lambda *a: subprocess.run([sys.executable, "-m", "hllm", "triton-repo", *map(str, a)], capture_output=True, text=True, env=env)  # noqa: E731
    r = run(export_dir, out, "--kind", "cpu")
    assert r.returncode == 0, r.stderr
    assert "KIND_CPU" in (out / "models/hllm_engine/config.pbtxt").read_text()
    r = run(export_dir, out)
    assert r.returncode == 2 and "already exists" in " ".join(r.stderr.split())  # rich wraps long lines
    r = run(merged_checkpoint, tmp_path / "c")
    assert r.returncode == 2 and "ONNX export or a TensorRT plan" in " ".join(r.stderr.split())
    assert not (tmp_path / "c").exists()
