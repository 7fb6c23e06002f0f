"""End-to-end smoke check of the ``hllm serve`` CLI process on a real export (loopback only).

    python scripts/serve_smoke.py work/demo/export --out results/serve/serve-smoke-smollm2-ort-cpu.json

Starts ``hllm serve`` on 127.0.0.1 and a free port, records ``/healthz`` and ``/readyz`` while the
engine loads, ranks one full slate (JSON) and two slates (JSONL), sends two bad requests (K + 1
candidates, malformed JSON), reads ``/metrics`` and ``/openapi.json``, then sends SIGTERM and records
how the process ended. Writes one JSON (atomic). Bounded: every call has a timeout.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    import httpx

    from hllm.files import atomic_write_json
    from hllm.formats.report import envelope
    from hllm.runtime import read_slates
    from hllm.runtime.artefact import resolve
    from hllm.serve.server import wait_ready

    p = argparse.ArgumentParser(description="Smoke-check `hllm serve` on an export.")
    p.add_argument("model")
    p.add_argument("--slates", default="examples/beauty-eval-sample.jsonl.gz")
    p.add_argument("--out", required=True)
    p.add_argument("--log", default=None, help="server log file (default: hllm-serve-smoke.log in the temp dir)")
    p.add_argument("--note", default="")
    a = p.parse_args(argv)

    k = resolve(a.model).num_positions
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "hllm", "serve", a.model, "--port", str(port), "--max-batch", "4", "--max-wait-ms", "20",
           "--deadline-ms", "600000"]
    rec: dict = {"command": "hllm " + " ".join(cmd[3:]), "note": a.note}
    log_path = Path(a.log) if a.log else Path(tempfile.gettempdir()) / "hllm-serve-smoke.log"
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            for _ in range(600):
                try:
                    rec["healthz_while_loading"] = httpx.get(f"{url}/healthz", timeout=5).status_code
                    r = httpx.get(f"{url}/readyz", timeout=5)
                    rec["readyz_while_loading"] = {"status": r.status_code, **r.json()}
                    break
                except httpx.TransportError:
                    time.sleep(0.1)
            rec["readyz"] = wait_ready(url, timeout_s=600)
            rec["seconds_to_ready"] = round(time.perf_counter() - t0, 1)
            slates = read_slates(a.slates, limit=2)
            r = httpx.post(f"{url}/v1/rank", json={"slates": [slates[0]]}, timeout=600)
            if r.status_code == 200:
                got = r.json()["rankings"][0]
                rec["rank_one_slate"] = {
                    "status": 200, "slate_id": got["slate_id"], "candidates": len(slates[0]["candidates"]),
                    "top5": got["ranking"][:5], "is_permutation": sorted(got["order"]) == list(range(len(slates[0]["candidates"]))),
                    "timing": r.json()["timing"],
                }
            else:
                rec["rank_one_slate"] = {"status": r.status_code, **r.json()}
            body = "".join(json.dumps(s) + "\n" for s in slates)
            r = httpx.post(f"{url}/v1/rank", content=body, headers={"content-type": "application/x-ndjson"}, timeout=600)
            rec["rank_jsonl_two_slates"] = (
                {"status": 200, "slate_ids": [x["slate_id"] for x in r.json()["rankings"]], "timing": r.json()["timing"]}
                if r.status_code == 200 else {"status": r.status_code, **r.json()}
            )
            big = {key: v for key, v in slates[0].items() if key != "labels"}
            big["candidates"] = (slates[0]["candidates"] * (k // len(slates[0]["candidates"]) + 1))[: k + 1]
            r = httpx.post(f"{url}/v1/rank", json=big, timeout=60)
            rec["k_plus_one_candidates"] = {"status": r.status_code, **r.json()}
            r = httpx.post(f"{url}/v1/rank", content="{", headers={"content-type": "application/json"}, timeout=60)
            rec["malformed_json"] = {"status": r.status_code, **r.json()}
            m = httpx.get(f"{url}/metrics", timeout=30).text
            keep = ("hllm_requests_total", "hllm_errors_total", "hllm_batch_slates_count", "hllm_stage_seconds_sum", "hllm_ready", "hllm_queue_depth")
            rec["metrics_excerpt"] = [line for line in m.splitlines() if line.startswith(keep)]
            rec["openapi_paths"] = sorted(httpx.get(f"{url}/openapi.json", timeout=30).json()["paths"])
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                rc = proc.wait(timeout=120)
                rec["exit_after_sigterm"] = f"signal {-rc} (uvicorn re-raises the signal after draining)" if rc < 0 else rc
            except subprocess.TimeoutExpired:
                proc.kill()
                rec["exit_after_sigterm"] = "killed: did not exit within 120 s"
    atomic_write_json(a.out, envelope("serve_smoke", rec))
    print(json.dumps(rec, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
