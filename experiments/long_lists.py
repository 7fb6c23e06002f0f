"""[experiment] last run at commit 676ff59; output: results/longlists/summary.json. Kept for provenance, not maintained (experiments/README.md).
Long lists (docs/long-lists.md): block ranking vs one pass on the real Beauty export.

    PYTHONPATH=$PWD nice python experiments/long_lists.py EXPORT EVAL.jsonl.gz OUTDIR [--phase a|b|c]
        [--minutes M] [--limit N]

Phases (each checkpoints one JSON line per slate to OUTDIR/<phase>.jsonl and resumes from it):

* a — every N = 50 eval slate ranked (1) in one pass and (2) forced into two blocks + 5 anchors by a head
  limited to K' = 28 positions (blocks of 5 anchors + 22/23 candidates; round B ranks the best 28), and
  round A alone;
* b — lists of N = 100 and 200 built from eval slates: the user's 50 candidates (clicked item kept) +
  negatives drawn from other slates (``numpy.random.default_rng(slate index)``), shuffled with that seed;
  methods: anchors (shipped: round A + round B), anchors round A alone, jointrank (win rate), jointrank +
  round B, random order (same seed);
* c — latency, engine rows and calls by N (50, 100, 200, 500, 1000) through ``Ranker.rank_batch``, and
  peak RSS (``resource.getrusage``).

``summarise OUTDIR`` writes OUTDIR/summary.json from the checkpoints; ``tables OUTDIR`` prints its markdown tables.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np

from hllm.runtime import Ranker, read_slates
from hllm.runtime import blocks as blk
from hllm.runtime.decode import decode
from hllm.runtime.prompt import PromptBuilder
from hllm.runtime.ranker import slate_scores


def _done(path: Path) -> set:
    if not path.exists():
        return set()
    return {json.loads(line)["key"] for line in path.read_text().splitlines() if line.strip()}


def _append(path: Path, rec: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")


def _rows(ranker: Ranker, rows) -> list[np.ndarray]:
    return slate_scores(ranker.engine, ranker.builder.collate(list(rows)))


def blocked_orders(ranker: Ranker, builder: PromptBuilder, slate: dict, opts: blk.BlockOptions) -> dict:
    """Round A alone and round A + B orders of one slate → {"round_a", "final", "blocks", "rows"}."""
    b = blk.encode(builder, slate, opts)
    assert isinstance(b, blk.BlockedSlate), "slate fits one prompt"
    mats = _rows(ranker, b.rows)
    a = blk.round_a_scores(b, mats)
    hidx, hrow = blk.head(builder, b, a)
    hm = _rows(ranker, [hrow])[0]
    fin = blk.finish(b, mats, a, hidx, hm)
    return {"round_a": blk.by_score(a).tolist(), "final": fin.order, "blocks": len(b.blocks), "rows": b.work}


def phase_a(ranker, slates, out: Path, deadline: float) -> None:
    done = _done(out)
    small = PromptBuilder(ranker.builder.tokenizer, ranker.builder.spec, max_items=28)
    for s in slates:
        if s["slate_id"] in done:
            continue
        if time.time() > deadline:
            break
        one = decode(_rows(ranker, [ranker.builder.encode_one(s)])[0]).tolist()
        res = blocked_orders(ranker, small, s, blk.BlockOptions())
        _append(out, {"key": s["slate_id"], "labels": s["labels"], "single": one, **res})


def long_list(slates: list[dict], i: int, n: int) -> dict:
    """Slate i's 50 candidates + n − 50 negatives from other slates, shuffled (seed i)."""
    rng = np.random.default_rng(i)
    s = slates[i]
    have = {c["item_id"] for c in s["candidates"]}
    cands, labels = list(s["candidates"]), list(s["labels"])
    while len(cands) < n:
        j = int(rng.integers(len(slates)))
        if j == i:
            continue
        c = slates[j]["candidates"][int(rng.integers(len(slates[j]["candidates"])))]
        if c["item_id"] not in have:
            have.add(c["item_id"])
            cands.append(c)
            labels.append(0)
    p = rng.permutation(n)
    return dict(s, slate_id=f"{s['slate_id']}@{n}", candidates=[cands[k] for k in p], labels=[labels[k] for k in p])


def phase_b(ranker, slates, out: Path, deadline: float, limit: int) -> None:
    done = _done(out)
    for i in range(limit):
        for n in (100, 200):
            s = long_list(slates, i, n)
            if s["slate_id"] in done:
                continue
            if time.time() > deadline:
                return
            t = time.perf_counter()
            anc = blocked_orders(ranker, ranker.builder, s, blk.BlockOptions())
            t1 = time.perf_counter()
            jr = blocked_orders(ranker, ranker.builder, s, blk.BlockOptions(method="jointrank"))
            t2 = time.perf_counter()
            rnd = np.random.default_rng(i).permutation(n).tolist()
            _append(out, {"key": s["slate_id"], "n": n, "labels": s["labels"], "anchors": anc["final"],
                          "anchors_round_a": anc["round_a"], "jointrank": jr["round_a"], "jointrank_refined": jr["final"],
                          "random": rnd, "rows": {"anchors": anc["rows"], "jointrank": jr["rows"]},
                          "seconds": {"anchors": round(t1 - t, 2), "jointrank": round(t2 - t1, 2)}})


def phase_c(ranker, slates, out: Path) -> None:
    done = _done(out)
    for n in (50, 100, 200, 500, 1000):
        if str(n) in done:
            continue
        s = long_list(slates, 0, n) if n > 50 else slates[0]
        t = time.perf_counter()
        res = ranker.rank_batch([s])
        sec = time.perf_counter() - t
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        _append(out, {"key": str(n), "n": n, "seconds": round(sec, 2), "engine_calls": res.calls,
                      "engine_rows": blk.work(ranker.encode(s)), "blocks": res[0].blocks,
                      "times_ms": {k: round(v, 1) for k, v in vars(res.times).items()}, "peak_rss_mib": round(rss, 1)})


def _records(outdir: Path, phase: str) -> list[dict]:
    """The checkpointed records of a phase: OUTDIR/<phase>.jsonl, or its committed .jsonl.gz."""
    import gzip

    plain, packed = outdir / f"{phase}.jsonl", outdir / f"{phase}.jsonl.gz"
    text = plain.read_text() if plain.exists() else gzip.open(packed, "rt").read() if packed.exists() else ""
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def summarise(outdir: Path) -> dict:
    from hllm.verify.metrics import METRIC_KEYS, bootstrap_ci, evaluate, paired_rows
    from hllm.verify.parity import kendall_tau

    summary: dict = {"cores": "shared (2 CPU cores shared with other engineers)",
                     "model": "checkpoints/smollm2-beauty-lora merged and exported as `make demo` does (ort-cpu, fp32), "
                              "ONNX Runtime, 2 threads",
                     "slates": "../shared/data/amazon-beauty/eval.jsonl.gz (sha256 fb9db798…, 1,118 slates of 50)",
                     "script": "experiments/long_lists.py"}
    a = _records(outdir, "a")
    if a:
        labels = [r["labels"] for r in a]
        rep = {}
        for name in ("final", "round_a"):
            d = paired_rows([r["single"] for r in a], [r[name] for r in a], labels)
            ci = bootstrap_ci(d, resamples=2000, seed=0)
            rep[name] = {
                "tau_vs_single": round(float(np.mean([kendall_tau(np.array(r["single"]), np.array(r[name])) for r in a])), 4),
                "top1_agreement": round(float(np.mean([r["single"][0] == r[name][0] for r in a])), 4),
                "delta": {k: {"mean": round(float(d[:, j].mean()), 4), "ci95": [round(ci[j][0], 4), round(ci[j][1], 4)]}
                          for j, k in enumerate(METRIC_KEYS)},
                "metrics": evaluate([r[name] for r in a], labels).to_dict(),
            }
        rep["single"] = {"metrics": evaluate([r["single"] for r in a], labels).to_dict()}
        summary["a_two_blocks_vs_single"] = {"slates": len(a), "k_emulated": 28, "anchors": 5, **rep}
    b = _records(outdir, "b")
    if b:
        out = {}
        for n in (100, 200):
            rows = [r for r in b if r["n"] == n]
            if not rows:
                continue
            out[str(n)] = {"slates": len(rows), "engine_rows": {k: float(np.mean([r["rows"][k] for r in rows]))
                                                                 for k in ("anchors", "jointrank")},
                           "seconds_mean": {k: round(float(np.mean([r["seconds"][k] for r in rows])), 2)
                                            for k in ("anchors", "jointrank")}}
            for m in ("anchors", "anchors_round_a", "jointrank", "jointrank_refined", "random"):
                out[str(n)][m] = evaluate([r[m] for r in rows], [r["labels"] for r in rows]).to_dict()
            # the expectation over uniformly random orders (one clicked item): AUC 1/2, R@10 = 10/N,
            # NDCG@10 = (1/N) Σ_{p<10} 1/log2(p + 2)
            out[str(n)]["random_expected"] = {"auc": 0.5, "recall@10": 10 / n,
                                              "ndcg@10": sum(1 / np.log2(p + 2) for p in range(10)) / n}
        summary["b_long_lists"] = out
    c = _records(outdir, "c")
    if c:
        summary["c_latency_by_n"] = c
    (outdir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def tables(summary: dict) -> str:
    """The markdown tables of docs/long-lists.md from a summary."""
    out = []
    a = summary.get("a_two_blocks_vs_single")
    if a:
        out += [f"(a) {a['slates']} eval slates of N = 50, forced into 2 blocks + {a['anchors']} anchors (head limited to "
                f"K' = {a['k_emulated']}), against the one pass over all 50:", "",
                "| ranking | Kendall tau vs one pass | top-1 agreement | AUC | R@10 | NDCG@10 | ΔAUC [95% CI] | ΔR@10 [95% CI] | ΔNDCG@10 [95% CI] |",
                "|---|---|---|---|---|---|---|---|---|"]
        m = a["single"]["metrics"]
        out.append(f"| one pass (N = 50) | 1 | 1 | {m['auc']:.3f} | {m['recall@10']:.3f} | {m['ndcg@10']:.3f} | | | |")
        for name, label in (("final", "blocks + round B (shipped)"), ("round_a", "round A alone")):
            r = a[name]
            m, d = r["metrics"], r["delta"]
            ci = {k: f"{d[k]['mean']:+.3f} [{d[k]['ci95'][0]:+.3f}, {d[k]['ci95'][1]:+.3f}]" for k in ("auc", "recall@10", "ndcg@10")}
            out.append(f"| {label} | {r['tau_vs_single']:.3f} | {r['top1_agreement']:.3f} | {m['auc']:.3f} | "
                       f"{m['recall@10']:.3f} | {m['ndcg@10']:.3f} | {ci['auc']} | {ci['recall@10']} | {ci['ndcg@10']} |")
        out.append("")
    b = summary.get("b_long_lists")
    if b:
        out += ["(b) lists built from eval slates (the user's 50 + negatives from other slates, clicked item kept):", "",
                "| N | slates | method | engine prompts | s / list | AUC | R@10 | NDCG@10 |", "|---|---|---|---|---|---|---|---|"]
        names = (("anchors", "anchors + round B (shipped)", "anchors"), ("anchors_round_a", "anchors, round A alone", "anchors"),
                 ("jointrank", "JointRank (win rate)", "jointrank"), ("jointrank_refined", "JointRank + round B", "jointrank"),
                 ("random", "one seeded random order", None), ("random_expected", "random order, expectation", None))
        for n, v in b.items():
            for key, label, cost in names:
                m = v[key]
                final = key.endswith("refined") or key == "anchors"
                rows = f"{v['engine_rows'][cost] - (0 if final else 1):.1f}" if cost else "0"
                sec = f"{v['seconds_mean'][cost]:.1f}" if key in ("anchors", "jointrank_refined") else ""
                out.append(f"| {n} | {v['slates']} | {label} | {rows} | {sec} | {m['auc']:.3f} | {m['recall@10']:.3f} | {m['ndcg@10']:.3f} |")
        out.append("")
    c = summary.get("c_latency_by_n")
    if c:
        out += ["(c) one list through `Ranker.rank_batch` (ONNX Runtime, 2 threads, shared cores):", "",
                "| N | blocks | engine prompts | engine calls | wall s | peak RSS MiB (process max so far) |", "|---|---|---|---|---|---|"]
        for r in c:
            out.append(f"| {r['n']} | {r['blocks']} | {r['engine_rows']} | {r['engine_calls']} | {r['seconds']:.1f} | {r['peak_rss_mib']:.0f} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> None:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "summarise":
        print(json.dumps(summarise(Path(argv[1])), indent=2))
        return
    if argv and argv[0] == "tables":
        print(tables(json.loads((Path(argv[1]) / "summary.json").read_text())))
        return
    p = argparse.ArgumentParser()
    p.add_argument("export")
    p.add_argument("eval")
    p.add_argument("outdir", type=Path)
    p.add_argument("--phase", choices=["a", "b", "c"], required=True)
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    a.outdir.mkdir(parents=True, exist_ok=True)
    slates = read_slates(a.eval)
    deadline = time.time() + a.minutes * 60
    with Ranker.from_path(a.export, threads=a.threads) as ranker:
        if a.phase == "a":
            phase_a(ranker, slates, a.outdir / "a.jsonl", deadline)
        elif a.phase == "b":
            phase_b(ranker, slates, a.outdir / "b.jsonl", deadline, a.limit)
        else:
            phase_c(ranker, slates, a.outdir / "c.jsonl")


if __name__ == "__main__":
    main()
