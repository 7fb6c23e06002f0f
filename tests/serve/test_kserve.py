"""The Open Inference Protocol (KServe v2) on `hllm serve`: the SAME client code — the generated Triton
client's `rank_slates` over `tritonclient.http` — ranks against `hllm serve` and against the KServe v2
stub running the `hllm triton-repo` repository, with identical rankings; health / metadata / readiness,
JSON and binary tensors, errors in the protocol's body, `X-Request-ID`, the end-to-end latency histogram."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

for _mod in ("fastapi", "uvicorn", "httpx", "prometheus_client", "tritonclient.http"):
    pytest.importorskip(_mod, reason=f"{_mod} is not installed (pip install -e '.[dev]')")

import httpx  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from hllm.runtime import Ranker  # noqa: E402
from hllm.serve.app import ServeOptions, create_app  # noqa: E402
from hllm.serve.server import BackgroundServer, wait_ready  # noqa: E402
from hllm.serve.triton.client import rank_slates, slates_tensor  # noqa: E402
from hllm.serve.triton.repo import write_repository  # noqa: E402
from hllm.testing import tiny_slates  # noqa: E402
from tests.serve.conftest import KServeStub, assert_same_rankings, ranker_rankings  # noqa: E402

MODEL = "hllm_ranker"


@pytest.fixture(scope="module")
def served(export_dir):
    """`hllm serve`'s app over the tiny export in a background uvicorn on 127.0.0.1."""
    app = create_app(Ranker.from_path(export_dir), ServeOptions(max_slates_per_request=8))
    with BackgroundServer(app) as server:
        wait_ready(server.url, timeout_s=120)
        yield server


def _client(base: str) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(url=base.split("://", 1)[-1], network_timeout=120.0)


def test_same_client_ranks_identically_on_hllm_serve_and_the_triton_stub(served, export_dir, tmp_path):
    slates = tiny_slates(7, (1, 8), seed=95)
    del slates[2]["slate_id"]  # named by its row in the request, on both servers
    write_repository(export_dir, tmp_path / "repo", max_batch_size=8, kind="cpu")
    stub = KServeStub(tmp_path / "repo" / "models", ["-I"])
    try:
        on_stub = rank_slates(_client(stub.url), MODEL, slates)
    finally:
        stub.close()
    client = _client(served.url)
    on_hllm = rank_slates(client, MODEL, slates)
    assert_same_rankings(on_hllm, on_stub)
    assert_same_rankings(on_hllm, ranker_rankings(export_dir, slates))
    assert on_hllm[2]["slate_id"] == "2"
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(MODEL)
    meta = client.get_model_metadata(MODEL)
    assert meta["name"] == MODEL and meta["inputs"] == [{"name": "slates", "datatype": "BYTES", "shape": [-1, 1]}]
    assert [(o["name"], o["datatype"], o["shape"]) for o in meta["outputs"]] == [
        ("ranking", "INT64", [-1, 8]), ("scores", "FP32", [-1, 8, 8]), ("truncated", "BOOL", [-1, 8])]
    assert not client.is_model_ready("no_such_model")
    config = client.get_model_config(MODEL)  # what perf_analyzer reads; the generated repository's ensemble says the same
    assert config["max_batch_size"] == 8 and [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("slates", "TYPE_STRING", [1])]
    assert [(t["name"], t["data_type"]) for t in config["output"]] == [("ranking", "TYPE_INT64"), ("scores", "TYPE_FP32"),
                                                                       ("truncated", "TYPE_BOOL")]


def test_json_tensors_request_id_and_errors(served, export_dir):
    slates = tiny_slates(2, (3, 8), seed=96)
    want = ranker_rankings(export_dir, slates)
    body = {"id": "req-7", "inputs": [{"name": "slates", "datatype": "BYTES", "shape": [2, 1],
                                       "data": [json.dumps(s) for s in slates]}],
            "outputs": [{"name": "ranking"}]}
    with httpx.Client(base_url=served.url, timeout=60) as c:
        r = c.post(f"/v2/models/{MODEL}/versions/1/infer", json=body, headers={"X-Request-ID": "trace-abc.1"})
        assert r.status_code == 200, r.text
        assert r.headers["x-request-id"] == "trace-abc.1"
        doc = r.json()
        assert doc["id"] == "req-7" and doc["model_name"] == MODEL and [o["name"] for o in doc["outputs"]] == ["ranking"]
        ranking = np.array(doc["outputs"][0]["data"]).reshape(doc["outputs"][0]["shape"])
        for row, w in zip(ranking, want):
            assert row[row >= 0].tolist() == w["order"] and (row[len(w["order"]):] == -1).all()
        v1 = c.post("/v1/rank", json={"slates": slates}, headers={"X-Request-ID": "my-id-1"})
        assert v1.headers["x-request-id"] == "my-id-1" and v1.json()["request_id"] == "my-id-1"
        fresh = c.get("/healthz", headers={"X-Request-ID": "has space"})
        assert len(fresh.headers["x-request-id"]) == 12 and fresh.headers["x-request-id"] != "has space"
        assert c.get("/v2/health/live").status_code == 200 and c.get("/v2/health/ready").status_code == 200
        unknown = c.get("/v2/models/other")
        assert unknown.status_code == 404 and "unknown model 'other'" in unknown.json()["error"]
        bad = c.post(f"/v2/models/{MODEL}/infer", json={"inputs": [{"name": "slates", "datatype": "BYTES", "shape": [1, 1],
                                                                      "data": ['{"candidates": []}']}]})
        assert bad.status_code == 400 and "slates[0]" in bad.json()["error"]
        wrong = c.post(f"/v2/models/{MODEL}/infer", json={"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]})
        assert wrong.status_code == 400 and "exactly ['slates']" in wrong.json()["error"]
        blob = struct.pack("<I", 50) + b"{}"  # a BYTES element that says 50 bytes and has 2
        head = json.dumps({"inputs": [{"name": "slates", "datatype": "BYTES", "shape": [1, 1],
                                       "parameters": {"binary_data_size": len(blob)}}]}).encode()
        short = c.post(f"/v2/models/{MODEL}/infer", content=head + blob,
                       headers={"Inference-Header-Content-Length": str(len(head)), "content-type": "application/octet-stream"})
        assert short.status_code == 400 and "past the end" in short.json()["error"]
        metrics = c.get("/metrics").text
    count = [line for line in metrics.splitlines() if line.startswith('hllm_request_duration_seconds_count{path="/v2/infer"}')]
    assert count and float(count[0].split()[-1]) >= 4  # every v2 infer response is timed, errors included


def test_client_sees_the_servers_error_message(served):
    too_many = {"slate_id": "big", "candidates": [{"title": f"t{i}"} for i in range(1001)]}
    with pytest.raises(InferenceServerException, match="over the limit of 1000 documents"):
        rank_slates(_client(served.url), MODEL, [too_many])
    longer = {"slate_id": "long", "candidates": [{"title": f"t{i}"} for i in range(2 * 8 + 5)]}  # N > K: in blocks
    got = rank_slates(_client(served.url), MODEL, [longer, tiny_slates(1, 3, seed=1)[0]])
    assert sorted(got[0]["order"]) == list(range(21)) and sorted(got[1]["order"]) == [0, 1, 2]
    inp = httpclient.InferInput("slates", [9, 1], "BYTES")
    inp.set_data_from_numpy(slates_tensor(tiny_slates(9, (1, 8), seed=97)))
    with pytest.raises(InferenceServerException, match="allowed 1..8"):
        _client(served.url).infer(MODEL, [inp])
