"""What an autoregressive teacher's outputs look like: the ``hllm teacher --kind ar`` statistics of one
or more output JSONLs taken together (parts of one run, e.g. slates 0–199 and 200–1117), plus how
much of the output is counting rather than ranking.

Per slate, from the repaired permutation ``order`` (0-based candidate indices, best first):

* ``ascending_run``: length of the longest run of consecutive listing numbers (k, k+1, k+2, …)
  in the order; a ranker that reads the candidates would rarely produce runs longer than 2.
* ``first_ordinal``: the 1-based candidate number the teacher put first.
* ``tau_vs_listing``: Kendall tau between the teacher's ranking and the listing order (wrapped at
  the first ordinal: a pure "k, k+1, …, N, 1, …, k-1" count gives a high value).

With ``--slates`` (labelled) it also counts where the clicked candidates sit in the listing, by
blocks of 10 listing numbers: a teacher that counts from k ranks by listing position, so that
histogram decides how it scores.

The parts must not share a slate id; with ``--slates`` they must cover exactly that file's slates,
in its order (else SystemExit naming the first mismatch).

usage: python scripts/teacher_outputs.py PART.jsonl [PART.jsonl ...] [--slates EVAL.jsonl.gz]
           [--examples 3] --out OUT.json
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json

import numpy as np

from hllm.files import atomic_write_json
from hllm.formats.report import envelope
from hllm.verify.parity import kendall_tau
from hllm.runtime.slates import read_slates
from hllm.teacher.ranker import ArResult, summarize


def read_jsonl(path: str) -> list[dict]:
    """Rows of a teacher-output JSONL[.gz] file (blank lines skipped); the slates go through
    :func:`hllm.runtime.slates.read_slates`, which validates them."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def longest_ascending_run(order: list[int]) -> int:
    """Longest run of consecutive indices i, i+1, … in ``order`` (≥ 1 for a non-empty order)."""
    best = run = 1 if order else 0
    for a, b in zip(order, order[1:]):
        run = run + 1 if b == a + 1 else 1
        best = max(best, run)
    return best


def tau_vs_listing(order: list[int]) -> float:
    """Kendall tau between ``order`` and the listing order rotated to start at ``order[0]``."""
    n = len(order)
    rotated = np.roll(np.arange(n), -order[0])
    return kendall_tau(np.asarray(order), rotated)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("parts", nargs="+")
    ap.add_argument("--slates", help="the slates file the parts together must cover, in order")
    ap.add_argument("--examples", type=int, default=3, help="raw outputs to keep (first 200 characters)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    rows = [r for p in a.parts for r in read_jsonl(p)]
    ids = [r["slate_id"] for r in rows]
    dup = [k for k, c in collections.Counter(ids).items() if c > 1]
    if dup:
        raise SystemExit(f"slate id {dup[0]} appears in more than one row of the parts")
    listing_hist = None
    if a.slates:
        slates = read_slates(a.slates)
        want = [s["slate_id"] for s in slates]
        clicked = [i for s in slates for i, y in enumerate(s.get("labels") or []) if y]
        listing_hist = np.bincount(np.asarray(clicked, dtype=np.int64) // 10).tolist() if clicked else []
        if ids != want:
            i = next((i for i, (x, y) in enumerate(zip(ids, want)) if x != y), min(len(ids), len(want)))
            raise SystemExit(f"parts do not cover {a.slates} in order: {len(ids)} rows vs {len(want)} slates, "
                             f"first difference at row {i}")
    fields = ArResult.__dataclass_fields__
    results = [ArResult(**{k: r[k] for k in fields}) for r in rows]
    runs = np.array([longest_ascending_run(r.order) for r in results])
    taus = np.array([tau_vs_listing(r.order) for r in results])
    firsts = collections.Counter(r.order[0] + 1 for r in results)
    out = {
        "parts": a.parts,
        "slates_file": a.slates,
        **summarize(results),
        "wall_s_total": round(sum(r.wall_s for r in results), 1),
        "ascending_run_median": float(np.median(runs)),
        "slates_with_ascending_run_ge_10": int((runs >= 10).sum()),
        "slates_with_ascending_run_ge_40": int((runs >= 40).sum()),
        "tau_vs_listing_mean": round(float(taus.mean()), 4),
        "clicked_listing_index_per_10": listing_hist,
        "first_ordinal_top5": [[k, c] for k, c in firsts.most_common(5)],
        "raw_text_examples": [{"slate_id": r.slate_id, "raw_text": r.raw_text[:200]} for r in results[: a.examples]],
    }
    atomic_write_json(a.out, envelope("teacher_outputs", out))
    print(json.dumps({k: v for k, v in out.items() if k != "raw_text_examples"}, indent=1))


if __name__ == "__main__":
    main()
