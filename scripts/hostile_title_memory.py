"""Peak RSS of ``hllm rank`` on one slate whose candidate title is SIZE megabytes (docs/hardening.md,
"Memory, outputs vs inputs, caches, library file errors").

Each run is a fresh subprocess measured by ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` of an intermediate
Python whose only child it is. Writes ``results/hardening/hostile_title_memory.json``.

    python scripts/hostile_title_memory.py EXPORT_DIR [--sizes 1 11 100] [-o results/hardening/hostile_title_memory.json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MEASURE = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, "
           "stderr=subprocess.DEVNULL); print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)")


def slate_file(path: Path, megabytes: int) -> Path:
    """One slate, three candidates, the last with a ``megabytes`` MiB title of natural-looking words."""
    head = b'{"slate_id": "hostile", "history": ["a"], "candidates": [{"item_id": "a", "title": "x"}, ' \
           b'{"item_id": "b", "title": "y"}, {"item_id": "huge", "title": "'
    chunk = (b"lorem ipsum dolor sit amet " * 40000)[: 1 << 20]
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(head)
        for _ in range(megabytes):
            f.write(chunk)
        f.write(b'"}]}\n')
    return path


def measure(export: str, megabytes: int, tmp: Path) -> dict:
    s = slate_file(tmp / f"t{megabytes}.jsonl.gz", megabytes)
    out = tmp / f"r{megabytes}.jsonl"
    argv = [sys.executable, "-m", "hllm", "rank", export, "-s", str(s), "-o", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-c", MEASURE, *argv], capture_output=True, text=True, env=env, cwd=REPO)
    rc, rss = (int(x) for x in p.stdout.split())
    rec = json.loads(out.read_text()) if rc == 0 else {}
    return {"title_mib": megabytes, "exit_code": rc, "peak_rss_mib": round(rss / 2**20, 1),
            "truncated": rec.get("truncated")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 11, 100])
    ap.add_argument("-o", "--out", default=str(REPO / "results" / "hardening" / "hostile_title_memory.json"))
    a = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from hllm.formats.report import envelope
    from hllm.measure import describe_machine
    from hllm.runtime.prompt import CHARS_PER_TOKEN_CEILING

    with tempfile.TemporaryDirectory() as tmp:
        records = [measure(a.export, m, Path(tmp)) for m in a.sizes]
    doc = {"kind": "hostile_title_memory", "export": Path(a.export).name, "chars_per_token_ceiling": CHARS_PER_TOKEN_CEILING,
           "bound_mib": 1024, "machine": describe_machine(shared=True), "records": records}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(envelope("hostile_title_memory", doc), indent=2) + "\n")
    print(json.dumps(records, indent=2))


if __name__ == "__main__":
    main()
