#!/usr/bin/env python3
"""Run ``make demo`` here and record what it took: ``results/demo-timings.json``.

Usage (in a checkout, ideally a fresh ``git clone``)::

    python3 scripts/demo_timings.py --out demo-timings.json [-- CKPT=checkpoints/smollm2-beauty-lora]

The Makefile's demo prints ``== k/5 …`` before each step; this script stamps every output line with
the wall clock, so a step's seconds are the time from its marker to the next one (setup is the time
before the first marker). It records the exit status, the total wall time, the children's peak RSS
(``getrusage(RUSAGE_CHILDREN).ru_maxrss``, KiB on Linux), the machine (:func:`hllm.measure.describe_machine`),
the 1-minute load average at the start and end (other jobs inflate the times), the commit and whether
the tree was clean (None outside git), then the proofs the demo wrote during this run: the merge's max
|ΔM| (from its output line), the export's validation and the parity report (files the run did not write
or change are left out). Paths are checked before make starts and nothing existing is replaced; Ctrl-C stops the
demo and still writes the record (rc 130). Standard library + ``hllm.measure`` (standard library only); it needs ``make`` and the Makefile.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # hllm.measure is standard-library only: usable before `make setup`
from hllm.formats.report import envelope  # noqa: E402
from hllm.measure import describe_machine  # noqa: E402


def git(*args: str) -> str | None:
    """``git ARGS`` output, or None without git or outside a repository."""
    try:
        r = subprocess.run(["git", *args], capture_output=True, text=True)
    except OSError:
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def refuse(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def _stamp(path: Path) -> tuple | None:
    """What tells a rewritten file from an untouched one: (inode, size, mtime ns, ctime ns), None when absent.
    Compared with the stamp taken before make starts, not with the start time: the kernel stamps files from a
    coarse clock that can read a few ms behind ``time.time()``, so a proof written at once looked older."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="JSON to write (refused if it exists).")
    ap.add_argument("--log", type=Path, help="Also keep the full make output here.")
    ap.add_argument("--note", default="", help="Free text stored in the JSON (e.g. what else ran).")
    ap.add_argument("make_args", nargs="*", help="Extra make arguments, e.g. CKPT=... N=8.")
    a = ap.parse_args()
    # Every check before make starts: a record must never be lost after a ten-minute demo.
    outputs = [p for p in (a.out, a.log) if p is not None]
    for p in outputs:
        if os.path.lexists(p):
            return refuse(f"{p} exists; choose another path (nothing is replaced)")
        if not p.resolve().parent.is_dir():
            return refuse(f"{p}: its directory does not exist")
    if a.log is not None and a.log.resolve() == a.out.resolve():
        return refuse("--log and --out are the same file")
    if shutil.which("make") is None:
        return refuse("make is not on PATH")
    variables = dict(arg.split("=", 1) for arg in a.make_args if "=" in arg)
    work = Path(variables.get("WORK", os.environ.get("WORK", "work")))  # make reads WORK ?= work from both

    proofs = {"export": work / "demo" / "export" / "export.json", "parity": work / "demo" / "parity.json"}
    before = {k: _stamp(p) for k, p in proofs.items()}  # a proof unchanged since here is an earlier run's
    started = time.time()
    load_start = os.getloadavg()[0]
    marks: list[tuple[float, str]] = [(started, "setup (make setup: venv, pinned installs)")]
    lines: list[str] = []
    merge_dm = None
    echo = True
    proc = subprocess.Popen(["make", "demo", *a.make_args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, encoding="utf-8", errors="replace", bufsize=1)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            now = time.time()
            if echo:
                try:
                    sys.stdout.write(line)
                    sys.stdout.flush()
                except BrokenPipeError:  # `| head`: stop echoing, keep timing the demo
                    echo = False
            lines.append(f"{now - started:8.1f} {line}")
            m = re.match(r"^== (\d+)/(\d+) (.*)", line)
            if m:
                marks.append((now, f"{m.group(1)}/{m.group(2)} {m.group(3).strip()}"))
            d = re.search(r"max\|ΔM\| merged vs adapter = ([0-9.eE+-]+)", line)
            if d:
                merge_dm = float(d.group(1))
        rc = proc.wait()
    except KeyboardInterrupt:  # stop make, keep what was measured
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        rc = 130
        lines.append("interrupted (SIGINT)\n")
    ended = time.time()
    marks.append((ended, "end"))
    if a.log:
        a.log.write_text("".join(lines))

    steps: dict[str, float] = {}
    for (t0, name), (t1, _) in zip(marks, marks[1:]):
        key, k = name, 2
        while key in steps:  # a marker printed twice keeps both times
            key, k = f"{name} ({k})", k + 1
        steps[key] = round(t1 - t0, 1)

    def load(key: str) -> dict | None:
        """A proof the demo wrote during this run (one unchanged since make started is another run's); None otherwise."""
        stamp = _stamp(proofs[key])
        if stamp is None or stamp == before[key]:
            return None
        try:
            return json.loads(proofs[key].read_text())
        except (OSError, ValueError):
            return None

    export = load("export") or {}
    parity = load("parity") or {}
    record = {
        "what": "wall time of `make demo` by step, timed by scripts/demo_timings.py around the make output",
        "command": " ".join(["make", "demo", *a.make_args]),
        "rc": rc,
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime(started)),
        "total_wall_s": round(ended - started, 1),
        "steps_wall_s": steps,
        "peak_child_rss_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
        "machine": {**describe_machine(shared=None), "loadavg_1min_start": round(load_start, 2),
                    "loadavg_1min_end": round(os.getloadavg()[0], 2)},
        "commit": git("rev-parse", "HEAD"),
        "tree_clean": None if (st := git("status", "--porcelain")) is None else st == "",
        "merge_max_abs_dM_vs_adapter": merge_dm,
        "export_validation": export.get("validation"),
        "parity": {k: parity.get(k) for k in ("slates", "perm_match_rate", "top1_agreement",
                                              "kendall_tau_mean", "max_abs_diff", "nonfinite", "passed")}
        if parity else None,
        "note": a.note,
    }
    a.out.write_text(json.dumps(envelope("demo_timings", record), indent=1) + "\n")
    print(f"demo rc {rc} in {record['total_wall_s']} s → {a.out}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
