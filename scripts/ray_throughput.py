"""Throughput of 1 vs 2 Ray Serve replicas and 1 vs 2 Ray Data actors on one export, in ONE run.

    python scripts/ray_throughput.py --tiny --out results/ray/throughput-tiny.json
    python scripts/ray_throughput.py --model work/demo/export --slates examples/beauty-eval-sample.jsonl.gz ...

One local Ray instance on 127.0.0.1 (no dashboard). Modes are interleaved (1, 2, 2, 1, … for
``--rounds``) so both see the same machine load; each engine uses ``--threads`` intra-op threads
(default 1, so 2 replicas/actors use 2 cores where 1 uses one). Ray Serve: ``--clients`` concurrent
HTTP clients send ``--requests`` one-slate requests to ``POST /v1/rank`` (micro-batching on); Ray
Data: ``hllm.runtime.ray_data.rank_file`` over ``--slates`` (or ``--count`` tiny slates). Figures are
slates per second of wall time, the Ray cluster already up (replica/actor start-up counted for Ray
Data, whose actors start with each run; excluded for Serve, whose replicas are deployed first).
Ray Serve runs ``hllm.serve.ray_serve`` (the app of ``hllm serve`` on every replica, ``@serve.batch``); Ray
Data runs the streaming ``hllm.runtime.ray_data.rank_file``.
With ``--tiny`` the model is a tiny random Qwen3 export built in a temp dir (``hllm.testing.tiny_export``; needs
the export extra): it measures Ray's overhead and scaling, not a real model's speed.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def serve_round(url: str, slates: list[dict], clients: int, requests: int) -> dict:
    import httpx

    def one(i: int) -> float:
        t = time.perf_counter()
        r = client.post(f"{url}/v1/rank", json={"slates": [slates[i % len(slates)]]})
        r.raise_for_status()
        return time.perf_counter() - t

    with httpx.Client(timeout=600) as client, ThreadPoolExecutor(clients) as pool:
        t0 = time.perf_counter()
        lat = list(pool.map(one, range(requests)))
        wall = time.perf_counter() - t0
    return {"requests": requests, "seconds": round(wall, 3), "slates_per_s": round(requests / wall, 2),
            "latency_ms_p50": round(statistics.median(lat) * 1e3, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="export dir / .onnx (default with --tiny: build the tiny export)")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--slates", help="slates file (default: --count tiny slates)")
    p.add_argument("--count", type=int, default=400)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--note", default=None)
    p.add_argument("--shared", action="store_true", help="other work ran on the same cores (stated in the JSON)")
    p.add_argument("--out", required=True)
    a = p.parse_args()

    import ray
    from ray import serve

    from hllm.formats.provenance import library_versions
    from hllm.bench.peak import matmul_peak
    from hllm.measure import describe_machine
    from hllm.files import atomic_write_json
    from hllm.formats.report import envelope
    from hllm.runtime.ray_data import rank_file
    from hllm.runtime.slates import read_slates, write_jsonl
    from hllm.serve.ray_serve import ranker_app
    from hllm.testing import tiny_export, tiny_slates

    tmp = Path(tempfile.mkdtemp(prefix="ray-throughput-"))
    model = Path(a.model) if a.model else tiny_export(tmp / "tiny") if a.tiny else p.error("give --model or --tiny")
    slates_file = Path(a.slates) if a.slates else write_jsonl(tmp / "slates.jsonl", tiny_slates(a.count, (1, 8), seed=7))
    slates = read_slates(slates_file)
    ray.init(address="local", num_cpus=max(2, os.cpu_count() or 1), include_dashboard=False, _node_ip_address="127.0.0.1",
             logging_level="WARNING", log_to_driver=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    order = [n for r in range(a.rounds) for n in ((1, 2) if r % 2 == 0 else (2, 1))]
    res = {"serve": {1: [], 2: []}, "data": {1: [], 2: []}}
    outputs = {}
    for n in order:
        serve.run(ranker_app(str(model), num_replicas=n, threads=a.threads), name="hllm", route_prefix="/")
        serve_round(f"http://127.0.0.1:{port}", slates, a.clients, 2 * a.clients)  # warm the route
        res["serve"][n].append(serve_round(f"http://127.0.0.1:{port}", slates, a.clients, a.requests))
        serve.delete("hllm")
        t0 = time.perf_counter()
        count = rank_file(model, slates_file, tmp / f"ray-{n}.jsonl", workers=n, threads=a.threads)
        wall = time.perf_counter() - t0
        res["data"][n].append({"slates": count, "seconds": round(wall, 3), "slates_per_s": round(count / wall, 2)})
        outputs[n] = (tmp / f"ray-{n}.jsonl").read_bytes()
        print(f"{n} replica(s)/actor(s): serve {res['serve'][n][-1]['slates_per_s']} slates/s, "
              f"data {res['data'][n][-1]['slates_per_s']} slates/s", flush=True)
    serve.shutdown()
    ray.shutdown()

    def summary(kind: str) -> dict:
        mean = {n: round(statistics.mean(r["slates_per_s"] for r in res[kind][n]), 2) for n in (1, 2)}
        return {"rounds": {str(n): res[kind][n] for n in (1, 2)}, "mean_slates_per_s": {str(n): v for n, v in mean.items()},
                "speedup_2_over_1": round(mean[2] / mean[1], 3)}

    report = {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", "scripts/ray_throughput.py", *sys.argv[1:]]),
        "model": "tiny random Qwen3 export (hllm.testing, K=8)" if a.tiny and not a.model else str(model),
        "slates": len(slates), "candidates_per_slate": [min(len(s["candidates"]) for s in slates), max(len(s["candidates"]) for s in slates)],
        "threads_per_engine": a.threads, "interleaving": order,
        "ray_serve": {"clients": a.clients, "requests_per_round": a.requests, "one_slate_per_request": True, **summary("serve")},
        "ray_data": {"batch_size": 1, **summary("data"), "outputs_identical_1_vs_2": outputs[1] == outputs[2],
                     "note": "wall time includes starting the actors (each run starts its pool)"},
        "machine": describe_machine(shared=a.shared, note=a.note), "gemm_peak": matmul_peak(n=1024), "libraries": {**library_versions(), "ray": ray.__version__},
    }
    atomic_write_json(a.out, envelope("ray_throughput", report))
    print(json.dumps({k: report[k]["mean_slates_per_s"] for k in ("ray_serve", "ray_data")}), f"→ {a.out}")


if __name__ == "__main__":
    main()
