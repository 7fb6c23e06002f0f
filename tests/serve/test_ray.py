"""Ray scale-out on a local Ray instance bound to 127.0.0.1 (2 CPUs, no dashboard): the Ray Serve deployment
answers POST /v1/rank like `hllm serve` from 2 replicas with @serve.batch micro-batching, and Ray Data
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


def test_ray_serve_two_replicas_answer_like_hllm_serve(local_ray, export_dir):
    from ray import serve

    from hllm.serve.ray_serve import ranker_app
    from hllm.serve.schemas import RankResponse

    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(ranker_app(str(export_dir), num_replicas=2, batch_wait_timeout_s=0.2), name="hllm", route_prefix="/")
    url = f"http://127.0.0.1:{port}"
    slates = tiny_slates(8, (1, 8), seed=90)
    with Ranker.from_path(export_dir) as ranker:
        want = [r.to_dict() for r in ranker.rank(slates)]
    try:
        with httpx.Client(timeout=120) as client:
            with ThreadPoolExecutor(8) as pool:  # one slate per request, all at once → micro-batches
                bodies = list(pool.map(lambda s: client.post(f"{url}/v1/rank", json={"slates": [s]}), slates))
            many = client.post(f"{url}/v1/rank", json=slates[:3])  # a JSON list of slates
            ndjson = client.post(f"{url}/v1/rank", content="\n".join(json.dumps(s) for s in slates[3:5]),
                                 headers={"content-type": "application/x-ndjson"})
            too_many = client.post(f"{url}/v1/rank", json={"candidates": [{"title": f"t{i}"} for i in range(9)]})
            bad_json = client.post(f"{url}/v1/rank", content=b"{nope", headers={"content-type": "application/json"})
            ready = client.get(f"{url}/readyz")
        status = serve.status().applications["hllm"].deployments["HllmRanker"].replica_states
    finally:
        serve.delete("hllm")
    assert status == {"RUNNING": 2}
    assert all(r.status_code == 200 for r in bodies), [r.text for r in bodies if r.status_code != 200]
    got = [RankResponse.model_validate(r.json()).rankings[0].model_dump() for r in bodies]  # the hllm serve schema
    assert [g["order"] for g in got] == [w["order"] for w in want]
    assert [g["ranking"] for g in got] == [w["ranking"] for w in want] and [g["truncated"] for g in got] == [w["truncated"] for w in want]
    np.testing.assert_allclose([s for g in got for s in g["scores"]], [s for w in want for s in w["scores"]], atol=1e-4)
    timings = [r.json()["timing"] for r in bodies]
    assert set(timings[0]) == set(RankResponse.model_fields["timing"].annotation.model_fields)
    assert max(t["batch_requests"] for t in timings) > 1  # @serve.batch merged concurrent requests
    assert [r["order"] for r in many.json()["rankings"]] == [w["order"] for w in want[:3]]
    assert [r["order"] for r in ndjson.json()["rankings"]] == [w["order"] for w in want[3:5]]
    assert too_many.status_code == 422 and too_many.json()["error"]["kind"] == "bad_slate" and "K=8" in too_many.json()["error"]["message"]
    assert bad_json.status_code == 400 and bad_json.json()["error"]["kind"] == "bad_json"
    assert ready.status_code == 200 and ready.json()["num_positions"] == 8


def test_ray_data_rank_equals_single_process_output(local_ray, export_dir, tmp_path):
    from hllm.cli import main
    from hllm.runtime.ray_data import rank_file

    slates = tiny_slates(23, (1, 8), seed=91)
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
