"""Ray scale-out on a local Ray instance bound to 127.0.0.1 (2 CPUs, no dashboard): the committed Serve config
(deploy/ray-serve.yaml, the application builder) serves the app of `hllm serve` (v1, KServe v2, metrics, docs,
errors) and scales from 1 to 2 replicas with @serve.batch micro-batching, and Ray Data
(`hllm rank --ray`, 2 actors) writes the single-process run's output byte for byte, in order."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'hllm[ray]')")
httpx = pytest.importorskip("httpx", reason="httpx is not installed (pip install 'hllm[serve]')")

from hllm.runtime import Ranker  # noqa: E402
from hllm.runtime.slates import write_jsonl  # noqa: E402
from hllm.testing import tiny_slates  # noqa: E402
from tests.conftest import REPO  # noqa: E402


@pytest.fixture(scope="module")
def local_ray():
    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             logging_level="WARNING", log_to_driver=False)
    yield ray
    from ray import serve

    serve.shutdown()
    ray.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _deploy_config(export_dir, port: int, **args) -> None:
    """Deploy the committed deploy/ray-serve.yaml as `serve run deploy/ray-serve.yaml` does (ray.serve.scripts.run:
    ServeDeploySchema → serve_start with its http_options → deploy_apps), with the tiny export, a free port
    and ``args`` overriding the file's; waits until the application is RUNNING."""
    import time

    import yaml
    from ray.serve._private import api as serve_api
    from ray.serve.schema import ServeDeploySchema

    doc = yaml.safe_load((REPO / "deploy" / "ray-serve.yaml").read_text())
    doc["http_options"]["port"] = port
    doc["applications"][0]["args"].update(export=str(export_dir), **args)
    config = ServeDeploySchema.model_validate(doc)
    client = serve_api.serve_start(http_options=config.http_options.model_dump(), proxy_location=config.proxy_location)
    client.deploy_apps(config, _blocking=False)
    from ray import serve

    deadline = time.monotonic() + 300
    while True:
        app = serve.status().applications.get("hllm")
        if app is not None and app.status == "RUNNING" and \
                app.deployments["HllmRanker"].replica_states.get("RUNNING") == args.get("num_replicas", 1):
            return
        assert app is None or app.status not in ("DEPLOY_FAILED", "UNHEALTHY"), app
        assert time.monotonic() < deadline, f"application not running: {app}"
        time.sleep(0.5)


def test_ray_serve_config_serves_the_hllm_serve_app_and_scales_1_to_2(local_ray, export_dir):
    """The committed config deploys the app builder; the replica answers /v1/rank, the KServe v2 infer of the
    generated Triton client, /metrics, /docs and the error envelope of `hllm serve`; redeployed with 2 replicas
    it answers concurrent requests merged by @serve.batch."""
    tritonclient_http = pytest.importorskip("tritonclient.http")
    from hllm.serve.schemas import RankResponse
    from hllm.serve.triton.client import rank_slates

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    slates = tiny_slates(8, (1, 8), seed=90)
    with Ranker.from_path(export_dir) as ranker:
        want = [r.to_dict() for r in ranker.rank(slates)]
    _deploy_config(export_dir, port, num_replicas=1)
    with httpx.Client(timeout=120) as client:
        one = client.post(f"{url}/v1/rank", json={"slates": slates[:3]}, headers={"X-Request-ID": "ray-1"})
        v2 = rank_slates(tritonclient_http.InferenceServerClient(url=f"127.0.0.1:{port}", network_timeout=120), "hllm_ranker", slates)
        too_many = client.post(f"{url}/v1/rank", json={"candidates": [{"title": f"t{i}"} for i in range(9)]})
        bad_json = client.post(f"{url}/v1/rank", content=b"{nope", headers={"content-type": "application/json"})
        nowhere = client.get(f"{url}/v1/nowhere")
        metrics, docs, ready = client.get(f"{url}/metrics"), client.get(f"{url}/docs"), client.get(f"{url}/readyz")
        openapi = client.get(f"{url}/openapi.json").json()
    assert one.status_code == 200 and one.headers["x-request-id"] == "ray-1" and one.json()["request_id"] == "ray-1"
    assert [r["order"] for r in RankResponse.model_validate(one.json()).model_dump()["rankings"]] == [w["order"] for w in want[:3]]
    assert [r["order"] for r in v2] == [w["order"] for w in want] and [r["ranking"] for r in v2] == [w["ranking"] for w in want]
    np.testing.assert_allclose([s for r in v2 for s in r["scores"]], [s for w in want for s in w["scores"]], atol=1e-4)
    assert too_many.status_code == 200 and too_many.json()["rankings"][0]["blocks"] == 2  # N > K: ranked in blocks
    assert bad_json.status_code == 400 and bad_json.json()["error"]["kind"] == "bad_json"
    assert nowhere.status_code == 404 and nowhere.json()["error"]["kind"] == "not_found"
    assert 'hllm_requests_total{code="200",path="/v1/rank"}' in metrics.text and "hllm_request_duration_seconds_bucket" in metrics.text
    assert docs.status_code == 200 and "swagger" in docs.text.lower() and "/v2/models/{model_name}/infer" in openapi["paths"]
    assert ready.status_code == 200 and ready.json()["status"] == "ready" and ready.json()["served_model_names"] == ["hllm_ranker"]
    assert set(ready.json()) == {"status", "served_model_names", "model_version"}  # never a path or engine detail
    _rerank_clients_on_the_sample(url, export_dir)

    _deploy_config(export_dir, port, num_replicas=2, batch_wait_timeout_s=0.2)  # scale 1 → 2 in place
    try:
        with httpx.Client(timeout=120) as client, ThreadPoolExecutor(8) as pool:  # one slate per request, all at once
            bodies = list(pool.map(lambda s: client.post(f"{url}/v1/rank", json={"slates": [s]}), slates))
        status = serve_status()
    finally:
        from ray import serve

        serve.delete("hllm")
    assert status == {"RUNNING": 2}
    assert all(r.status_code == 200 for r in bodies), [r.text for r in bodies if r.status_code != 200]
    got = [r.json()["rankings"][0] for r in bodies]
    assert [g["order"] for g in got] == [w["order"] for w in want] and [g["truncated"] for g in got] == [w["truncated"] for w in want]
    timings = [r.json()["timing"] for r in bodies]
    assert set(timings[0]) == set(RankResponse.model_fields["timing"].annotation.model_fields)
    assert max(t["batch_requests"] for t in timings) > 1  # @serve.batch merged concurrent requests


def _rerank_clients_on_the_sample(url: str, export_dir) -> None:
    """/v1/rerank and /v2/rerank on the replica: the cohere SDK (v2 and v1), LangChain's and LlamaIndex's CohereRerank
    rank every slate of the packaged sample (cut to K = 8 candidates) in the order of `hllm rank` (the Ranker)."""
    from hllm.runtime.slates import read_slates, subslate
    from tests.conftest import SAMPLE_SLATES
    from tests.serve.rerank_clients import CLIENT_MODULES, query_slates, rank_all

    for mod in CLIENT_MODULES:
        pytest.importorskip(mod, reason="the rerank-clients extra is not installed (pip install -e .[rerank-clients])")
    sample = read_slates(SAMPLE_SLATES)
    with Ranker.from_path(export_dir) as ranker:
        want = [r.order for r in ranker.rank(query_slates(sample, 8))]
    got = rank_all(url, [subslate(s, 8) for s in sample])
    for name, results in got.items():
        assert [order for order, _ in results] == want, name
    metrics = httpx.get(f"{url}/metrics").text
    assert 'hllm_requests_total{code="200",path="/v2/rerank"}' in metrics and 'path="/v1/rerank"' in metrics


def serve_status() -> dict:
    from ray import serve

    return dict(serve.status().applications["hllm"].deployments["HllmRanker"].replica_states)


def test_app_builder_takes_one_argument_and_refuses_bad_ones():
    import inspect

    import pydantic
    from ray.serve import Application
    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary

    from hllm.serve.ray_serve import RayServeArgs, app_builder

    assert list(inspect.signature(app_builder).parameters) == ["args"]
    assert inspect.signature(app_builder).parameters["args"].annotation is RayServeArgs  # Ray validates the dict with it
    app = call_user_app_builder_with_args_if_necessary(app_builder, {"export": "x", "num_replicas": "2", "num_gpus": "0.5"})
    assert isinstance(app, Application)
    dep = app._bound_deployment
    assert dep.num_replicas == 2 and dep.ray_actor_options == {"num_cpus": 1.0, "num_gpus": 0.5} and dep.max_ongoing_requests == 16
    auto = app_builder({"export": "x", "autoscaling_config": {"min_replicas": 1, "max_replicas": 3}})._bound_deployment
    assert auto._deployment_config.autoscaling_config.max_replicas == 3
    with pytest.raises(pydantic.ValidationError, match="no_such"):
        app_builder({"export": "x", "no_such": 1})
    with pytest.raises(ValueError, match="max_ongoing_requests"):
        app_builder({"export": "x", "max_ongoing_requests": 2, "max_batch_requests": 8})


def test_ray_data_rank_equals_single_process_output(local_ray, export_dir, tmp_path):
    from hllm.cli import main
    from hllm.runtime.ray_data import rank_file

    slates = tiny_slates(23, (1, 8), seed=91)
    slates[4] = tiny_slates(1, 2 * 8 + 5, seed=92)[0]  # N = 2K + 5: ranked in blocks by each actor's Ranker
    for s in slates[::5]:
        del s["slate_id"]  # the fallback id is the slate's index in the file, whichever actor ranks it
    write_jsonl(tmp_path / "s.jsonl.gz", slates)
    one = subprocess.run([sys.executable, "-m", "hllm", "rank", str(export_dir), "--slates", str(tmp_path / "s.jsonl.gz"),
                          "--out", str(tmp_path / "one.jsonl"), "--batch-size", "3"], capture_output=True, text=True)
    assert one.returncode == 0, one.stderr
    n = rank_file(export_dir, tmp_path / "s.jsonl.gz", tmp_path / "ray.jsonl", workers=2, batch_size=3, chunks_per_call=2)
    assert n == 23
    assert (tmp_path / "ray.jsonl").read_bytes() == (tmp_path / "one.jsonl").read_bytes()
    # the CLI path (uses the running Ray instance), with --limit
    with pytest.raises(SystemExit) as e:
        main(["rank", str(export_dir), "--slates", str(tmp_path / "s.jsonl.gz"), "--out", str(tmp_path / "cli.jsonl"),
              "--batch-size", "3", "--limit", "10", "--ray", "--workers", "2"])
    assert e.value.code == 0
    assert (tmp_path / "cli.jsonl").read_text().splitlines() == (tmp_path / "one.jsonl").read_text().splitlines()[:10]


def test_ray_rank_of_the_sample_is_byte_identical_to_hllm_rank(local_ray, export_k50, tmp_path):
    """`hllm rank --ray` (read → map_batches over 2 actors → streamed write) on the packaged 100-slate sample."""
    from hllm.cli import main

    sample = REPO / "examples" / "beauty-eval-sample.jsonl.gz"
    one = subprocess.run([sys.executable, "-m", "hllm", "rank", str(export_k50), "--slates", str(sample),
                          "--out", str(tmp_path / "one.jsonl"), "--batch-size", "4"], capture_output=True, text=True)
    assert one.returncode == 0, one.stderr
    with pytest.raises(SystemExit) as e:
        main(["rank", str(export_k50), "--slates", str(sample), "--out", str(tmp_path / "ray.jsonl"), "--batch-size", "4",
              "--ray", "--workers", "2", "--cpus-per-worker", "0.5"])
    assert e.value.code == 0
    assert (tmp_path / "ray.jsonl").read_bytes() == (tmp_path / "one.jsonl").read_bytes()
    assert len((tmp_path / "ray.jsonl").read_text().splitlines()) == 100


def test_ray_rank_refuses_bad_slates_before_ray_and_caps_local_workers(export_dir, tmp_path, capsys, monkeypatch):
    from hllm.cli import main
    from hllm.cli.options import MAX_WORKERS

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(tiny_slates(1, (1, 8), seed=1)[0]) + "\n{\"candidates\": []}\n")
    with pytest.raises(SystemExit) as e:
        main(["rank", str(export_dir), "-s", str(bad), "-o", str(tmp_path / "o.jsonl"), "--ray"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"{bad}:2" in err and not (tmp_path / "o.jsonl").exists()
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(SystemExit) as e:
        main(["rank", str(export_dir), "-o", str(tmp_path / "o.jsonl"), "--ray", "--workers", str(MAX_WORKERS + 1)])
    assert e.value.code == 2 and "RAY_ADDRESS" in capsys.readouterr().err


def test_ray_data_ranks_a_context_head_like_one_process(local_ray, context_export_dir, tmp_path):
    from hllm.runtime.ray_data import rank_file

    slates = tiny_slates(9, (2, 8), seed=92)
    write_jsonl(tmp_path / "s.jsonl", slates)
    one = subprocess.run([sys.executable, "-m", "hllm", "rank", str(context_export_dir), "--slates", str(tmp_path / "s.jsonl"),
                          "--out", str(tmp_path / "one.jsonl"), "--batch-size", "2"], capture_output=True, text=True)
    assert one.returncode == 0, one.stderr
    assert rank_file(context_export_dir, tmp_path / "s.jsonl", tmp_path / "ray.jsonl", workers=2, batch_size=2) == 9
    assert (tmp_path / "ray.jsonl").read_bytes() == (tmp_path / "one.jsonl").read_bytes()


def test_ray_modules_import_no_torch():
    code = ("import sys, hllm.serve.ray_serve, hllm.runtime.ray_data;"
            "bad=[m for m in ('torch','transformers','peft') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_replica_reads_api_keys_from_its_environment_or_a_secret_file_never_the_config(tmp_path, monkeypatch, export_dir):
    """A replica takes keys from $HLLM_API_KEYS and api_key_file (never from args), refuses to start with none
    unless no_auth, and its app (the one Ray serves) answers 401 without the key and 200 with it."""
    import pydantic

    from hllm.serve.auth import ENV_VAR
    from hllm.serve.ray_serve import HllmRanker, RayServeArgs, app_builder, replica_auth
    from hllm.serve.server import BackgroundServer, wait_ready

    key, env_key = "hk-ray-0123456789abcdef", "hk-env-0123456789abcdef"
    (tmp_path / "keys").write_text(key + "\n")
    args = RayServeArgs(export=str(export_dir), api_key_file=str(tmp_path / "keys"))
    assert replica_auth(args, {ENV_VAR: env_key}).keys == (key.encode(), env_key.encode())
    with pytest.raises(ValueError, match="no API key"):
        replica_auth(RayServeArgs(export="x"), {})
    assert replica_auth(RayServeArgs(export="x", no_auth=True), {}) is None
    with pytest.raises(ValueError, match="no_auth is set"):
        replica_auth(RayServeArgs(export="x", no_auth=True), {ENV_VAR: env_key})
    for field in ("api_keys", "api_key"):  # keys in the config file in clear: refused
        with pytest.raises(pydantic.ValidationError, match=field):
            app_builder({"export": "x", field: key})
    monkeypatch.setenv(ENV_VAR, env_key)
    replica = HllmRanker.__new__(HllmRanker)  # the replica's constructor and app, without a Ray cluster
    HllmRanker.__mro__[1].__init__(replica, args.model_copy(update={"served_model_names": ["team-ranker"]}).model_dump())
    with BackgroundServer(replica.__serve_build_asgi_app__()) as srv:
        wait_ready(srv.url, timeout_s=120)
        # (ranking needs @serve.batch inside a replica: the Ray deployment test covers it; here the gate)
        body = {"query": "q", "documents": ["a", "b"], "model": "team-ranker"}
        assert httpx.post(f"{srv.url}/v2/rerank", json=body, timeout=60).status_code == 401
        assert httpx.get(f"{srv.url}/v1/models", timeout=60).status_code == 401
        for k in (key, env_key):
            r = httpx.get(f"{srv.url}/v1/models", headers={"Authorization": f"Bearer {k}"}, timeout=60)
            assert r.status_code == 200 and [m["id"] for m in r.json()["data"]] == ["team-ranker"], r.text
