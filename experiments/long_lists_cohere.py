"""[experiment] last run at commit 7d7b38f; output: results/longlists/cohere-demo-export.json. Kept for provenance, not maintained (experiments/README.md).
The cohere SDK reranks 100, 500 and 1,000 documents through `hllm serve` on the demo export (docs/long-lists.md).

    python experiments/long_lists_cohere.py EXPORT_DIR OUT.json [--port 8765]

Documents are the candidate titles of the packaged eval sample (100 slates × 50), in file order; the query is the
first slate's last history title. Checks each result: a permutation of the documents, relevance scores in [0, 1]
and non-increasing, ⌈N/100⌉ search units, a warning naming the blocks. Records wall time per call, the CPU model
and flags (shared or quiet cores as stated by --note).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import subprocess
import sys
import time
from pathlib import Path

import cohere
import httpx

from hllm.measure import describe_machine
from hllm.runtime.slates import read_slates

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("export", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--note", default="")
    a = ap.parse_args()
    slates = read_slates(REPO / "examples" / "beauty-eval-sample.jsonl.gz")
    docs = [c["title"] for s in slates for c in s["candidates"]]
    query = slates[0]["history"][-1]
    server = subprocess.Popen([sys.executable, "-m", "hllm", "serve", str(a.export), "--port", str(a.port),
                               "--log-level", "warning"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    records = []
    try:
        for _ in range(600):
            try:
                if httpx.get(f"http://127.0.0.1:{a.port}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        client = cohere.ClientV2(api_key="unused", base_url=f"http://127.0.0.1:{a.port}", timeout=1800)
        for n in (100, 500, 1000):
            t0 = time.perf_counter()
            res = client.rerank(model="hllm_ranker", query=query, documents=docs[:n])
            wall = time.perf_counter() - t0
            idx = [r.index for r in res.results]
            rel = [r.relevance_score for r in res.results]
            checks = {"permutation": sorted(idx) == list(range(n)),
                      "relevance_in_0_1": all(0.0 <= x <= 1.0 for x in rel),
                      "relevance_non_increasing": all(x >= y for x, y in zip(rel, rel[1:])),
                      "search_units": res.meta.billed_units.search_units == math.ceil(n / 100),
                      "blocks_warning": any("block" in w for w in (res.meta.warnings or []))}
            records.append({"documents": n, "wall_s": round(wall, 2), "checks": checks, "top3": idx[:3],
                            "warnings": res.meta.warnings})
            print(n, round(wall, 1), checks, flush=True)
    finally:
        server.terminate()
        server.wait(timeout=120)
    doc = {"what": "cohere ClientV2.rerank through hllm serve (ONNX Runtime, fp32) on the demo export",
           "export": str(a.export), "machine": describe_machine(note=a.note or None), "python": platform.python_version(),
           "note": a.note, "records": records}
    a.out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    assert all(all(r["checks"].values()) for r in records), records


if __name__ == "__main__":
    main()
