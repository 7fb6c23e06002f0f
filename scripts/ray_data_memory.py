"""Driver peak memory of `hllm rank --ray` (hllm.runtime.ray_data.rank_file): this tree vs an earlier revision.

    python scripts/ray_data_memory.py --slates data/amazon-beauty/train.jsonl.gz \
        --counts 3000,12000 --before-rev 083686c --shared --out results/ray/data-driver-memory.json

Each (implementation, slate count) runs in its own driver process (a fresh local Ray on 127.0.0.1,
``--workers`` actors): the figure is that process's peak resident set size (``ru_maxrss``) and its growth
over the RSS measured after ``ray.init`` (imports and Ray's client are the same for both; ``ray.data``, pyarrow and pandas are imported before that baseline). The model is
the tiny random export (hllm.testing.tiny_export, K = 8), so ranking is cheap; the slates are the file's
first N slates cut to their first 8 candidates (hllm.runtime.slates.subslate), written once to a
temporary .jsonl.gz. ``--before-rev`` names the git revision whose hllm/runtime/ray_data.py is "before"
(it collected every ranking in the driver and wrote them at the end).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def child(impl: str, model: str, slates: str, n: int, out: str, workers: int, batch_size: int) -> None:
    """One driver: start Ray, rank ``n`` slates with ``impl`` (a module file), print a JSON result line."""
    import pandas  # noqa: F401 — imported by Ray Data at execution; loaded before the baseline
    import pyarrow  # noqa: F401
    import ray
    import ray.data  # noqa: F401

    spec = importlib.util.spec_from_file_location("ray_data_impl", impl)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, workers + 1), include_dashboard=False,
             _node_ip_address="127.0.0.1", logging_level="WARNING", log_to_driver=False)
    base = _rss_kib()
    t0 = time.perf_counter()
    count = mod.rank_file(model, slates, out, workers=workers, batch_size=batch_size, threads=1, limit=n)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ray.shutdown()
    print("RESULT " + json.dumps({"slates": count, "seconds": round(seconds, 1), "rss_after_init_mib": round(base / 1024, 1),
                                  "peak_rss_mib": round(peak / 1024, 1), "growth_mib": round((peak - base) / 1024, 1)}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--slates", required=True)
    p.add_argument("--counts", default="3000,12000")
    p.add_argument("--before-rev", default="083686c")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--shared", action="store_true", help="other work ran on the same cores (stated in the JSON)")
    p.add_argument("--out", required=True)
    p.add_argument("--child", nargs=7, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        impl, model, slates, n, out, workers, bs = a.child
        return child(impl, model, slates, int(n), out, int(workers), int(bs))

    from hllm.measure import describe_machine
    from hllm.files import atomic_write_json
    from hllm.formats.report import envelope
    from hllm.runtime.slates import iter_slates, subslate, write_jsonl
    from hllm.testing import tiny_export

    counts = [int(c) for c in a.counts.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="ray-data-memory-"))
    model = tiny_export(tmp / "tiny")
    data = write_jsonl(tmp / "slates-k8.jsonl.gz", (subslate(s, 8) for s in iter_slates(a.slates, max(counts))))
    before = tmp / "ray_data_before.py"
    before.write_bytes(subprocess.check_output(["git", "-C", str(REPO), "show", f"{a.before_rev}:hllm/runtime/ray_data.py"]))
    impls = {"before": before, "after": REPO / "hllm" / "runtime" / "ray_data.py"}
    runs, outputs = [], {}
    for n in counts:
        for name, impl in impls.items():
            out = tmp / f"{name}-{n}.jsonl"
            r = subprocess.run([sys.executable, __file__, "--slates", a.slates, "--out", a.out, "--child", str(impl), str(model),
                                str(data), str(n), str(out), str(a.workers), str(a.batch_size)],
                               capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
            line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                raise SystemExit(f"{name} {n} failed: {r.stderr[-3000:]}")
            runs.append({"implementation": name, **json.loads(line[7:])})
            outputs[(name, n)] = out.read_bytes()
            print(runs[-1], flush=True)
    report = {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", "scripts/ray_data_memory.py", *sys.argv[1:]]),
        "what": "peak RSS of the driver process of hllm.runtime.ray_data.rank_file, before (revision "
                f"{a.before_rev}: from_items of every chunk, every ranking collected in the driver) and after "
                "(streaming datasource → map_batches → streamed write)",
        "model": "tiny random Qwen3 export (hllm.testing.tiny_export, K=8)",
        "slates": f"first N slates of {a.slates}, cut to their first 8 candidates",
        "workers": a.workers, "batch_size": a.batch_size, "runs": runs,
        "outputs_identical_before_after": {str(n): outputs[("before", n)] == outputs[("after", n)] for n in counts},
        "machine": describe_machine(shared=a.shared, note=None),
    }
    atomic_write_json(a.out, envelope("ray_data_memory", report))
    print(f"→ {a.out}")


if __name__ == "__main__":
    main()
