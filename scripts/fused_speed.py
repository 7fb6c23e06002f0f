"""Side-by-side CPU speed of the hLLM engines on one real slate: PyTorch eager vs ONNX Runtime on each
given export (today's graph, the cleaned standard graph, the fused ort-cpu graph).

Every engine is loaded once and timed interleaved on the same encoded slate (round r runs each engine
once, rotating the order: :func:`hllm.measure.time_interleaved`), warm-up rounds discarded, so
the ratios are fair on cores shared with other work. Same intra-op threads for all. Prints the median
engine time, the speed ratio vs PyTorch eager (> 1 = faster), GFLOP/s and the fraction of the fp32
GEMM peak measured in the same run, max |ΔM| vs eager and whether the LAPJV permutation is identical;
writes everything (with CPU flags and library versions) to a JSON file.

``--attention`` adds a micro-benchmark of one layer's attention core alone at the slate's length
(ONNX Runtime, same threads, interleaved): the fused causal ``GroupQueryAttention`` against the same
op with ``causal=0`` (every key: full S×S work), ``MultiHeadAttention`` without mask and with an
additive causal bias, and the standard-graph decomposition (MatMul, mask Add, Softmax, MatMul). If
GQA does only the causal (lower) half, it takes about half the time of ``causal=0``.

    PYTHONPATH=$PWD python scripts/fused_speed.py --torch CKPT --onnx today=DIR --onnx standard=DIR \\
        --onnx fused=DIR --slates examples/beauty-eval-sample.jsonl.gz --out results/bench/attention_causal.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np


def _contenders(args) -> dict[str, str]:
    out = {"pytorch_eager": args.torch}
    for spec in args.onnx:
        name, _, path = spec.partition("=")
        if not path:
            sys.exit(f"--onnx wants NAME=EXPORT_DIR, got {spec!r}")
        out[name] = path
    return out


def _slate(path: str, index: int, items: int) -> dict:
    from hllm.runtime.slates import read_slates, subslate

    slates = [s for s in read_slates(path) if len(s["candidates"]) >= items]
    return subslate(slates[index], items)


def engines_side_by_side(args) -> dict:
    """Interleaved engine timings on one slate, with agreement vs PyTorch eager."""
    from hllm.bench.peak import matmul_peak
    from hllm.bench.stages import model_dims
    from hllm.measure import prefill_flops, summarize, time_interleaved
    from hllm.runtime.decode import decode
    from hllm.verify.reference import cpu_ranker

    paths = _contenders(args)
    rankers = {k: cpu_ranker(p, threads=args.threads) for k, p in paths.items()}
    batch = rankers["pytorch_eager"].builder.encode([_slate(args.slates, args.slate, args.items)])
    n, seq = int(batch.n_items[0]), int(batch.lengths[0])
    for r in rankers.values():
        r.engine.activate()
    try:
        scores = {k: r.scores(batch)[0, :n] for k, r in rankers.items()}
        calls = {k: (lambda i, r=r: r.scores(batch)) for k, r in rankers.items()}
        samples = time_interleaved(calls, rounds=args.rounds, warmup=args.warmup, unit=1.0)
    finally:
        for r in rankers.values():
            r.engine.deactivate()
    peak = matmul_peak()
    dims = model_dims(args.torch)
    flop = prefill_flops(dims, seq) if dims else None
    ref, ref_perm = scores["pytorch_eager"], decode(scores["pytorch_eager"], n)
    eager = float(np.median(samples["pytorch_eager"]))
    rows = {}
    for k, v in samples.items():
        med = float(np.median(v))
        rows[k] = {
            "path": paths[k],
            "flavour": getattr(rankers[k].engine, "sidecar", {}).get("flavour") if k != "pytorch_eager" else None,
            "seconds": summarize(v),
            "speed_vs_eager": round(eager / med, 3),
            "gflops": round(flop / med / 1e9, 1) if flop else None,
            "fraction_of_gemm_peak": round(flop / med / 1e9 / peak["peak_gflops"], 3) if flop else None,
            "max_abs_diff_vs_eager": float(np.abs(scores[k] - ref).max()),
            "same_permutation": bool((decode(scores[k], n) == ref_perm).all()),
        }
    return {"items": n, "seq_len": seq, "threads": args.threads, "rounds": args.rounds, "warmup": args.warmup,
            "prefill_gflop": round(flop / 1e9, 2) if flop else None, "gemm_peak": peak, "engines": rows}


def _attention_graph(kind: str, h: int, hkv: int, dh: int):
    """One attention core as an ONNX model: ``gqa`` (causal, com.microsoft), ``gqa_full`` (the same op
    with ``causal=0``: every key), ``mha`` (no mask),
    ``mha_causal_bias`` (additive [1,1,S,S] bias), ``decomposed`` (standard ops, float causal mask)."""
    from onnx import TensorProto as T
    from onnx import helper as oh

    f = lambda name, shape: oh.make_tensor_value_info(name, T.FLOAT, shape)  # noqa: E731
    q, k, v = f("q", ["B", "S", h * dh]), f("k", ["B", "S", h * dh]), f("v", ["B", "S", h * dh])
    if kind in ("gqa", "gqa_full"):
        k, v = f("k", ["B", "S", hkv * dh]), f("v", ["B", "S", hkv * dh])
        ins = [q, k, v, oh.make_tensor_value_info("seqlens_k", T.INT32, ["B"]),
               oh.make_tensor_value_info("total", T.INT32, [])]
        nodes = [oh.make_node("GroupQueryAttention", ["q", "k", "v", "", "", "seqlens_k", "total"], ["o", "pk", "pv"],
                              domain="com.microsoft", num_heads=h, kv_num_heads=hkv, causal=int(kind == "gqa"))]
    elif kind in ("mha", "mha_causal_bias"):
        ins = [q, k, v] + ([f("bias", [1, 1, "S", "S"])] if kind == "mha_causal_bias" else [])
        inputs = ["q", "k", "v"] + (["", "", "bias"] if kind == "mha_causal_bias" else [])
        nodes = [oh.make_node("MultiHeadAttention", inputs, ["o"], domain="com.microsoft", num_heads=h)]
    else:  # the standard graph's SDPA: [B,H,S,Dh] tensors, scaled q and kᵀ, float mask, Softmax
        ins = [f("q", ["B", h, "S", dh]), f("kt", ["B", h, dh, "S"]), f("v", ["B", h, "S", dh]), f("bias", ["S", "S"])]
        nodes = [oh.make_node("MatMul", ["q", "kt"], ["s"]), oh.make_node("Add", ["s", "bias"], ["m"]),
                 oh.make_node("Softmax", ["m"], ["p"], axis=-1), oh.make_node("MatMul", ["p", "v"], ["o"])]
    g = oh.make_graph(nodes, kind, ins, [oh.make_tensor_value_info("o", T.FLOAT, None)])
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 20), oh.make_opsetid("com.microsoft", 1)])


def attention_alone(args, seq: int) -> dict:
    """Interleaved timings of one attention core (see :func:`_attention_graph`) at ``seq`` tokens, B=1."""
    import onnxruntime as ort

    from hllm.bench.stages import model_dims
    from hllm.measure import summarize, time_interleaved

    d = model_dims(args.torch)
    h, hkv, dh = d.num_heads, d.num_kv_heads, d.head_dim
    rng = np.random.default_rng(0)
    r = lambda *s: rng.standard_normal(s, dtype=np.float32)  # noqa: E731
    causal = np.triu(np.full((seq, seq), np.finfo(np.float32).min, np.float32), 1)
    feeds = {
        "gqa": {"q": r(1, seq, h * dh), "k": r(1, seq, hkv * dh), "v": r(1, seq, hkv * dh),
                "seqlens_k": np.array([seq - 1], np.int32), "total": np.array(seq, np.int32)},
        "gqa_full": None,
        "mha": {"q": r(1, seq, h * dh), "k": r(1, seq, h * dh), "v": r(1, seq, h * dh)},
        "mha_causal_bias": {"q": r(1, seq, h * dh), "k": r(1, seq, h * dh), "v": r(1, seq, h * dh),
                            "bias": causal[None, None]},
        "decomposed": {"q": r(1, h, seq, dh) / dh**0.5, "kt": r(1, h, dh, seq), "v": r(1, h, seq, dh), "bias": causal},
    }
    feeds["gqa_full"] = feeds["gqa"]
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    sess = {k: ort.InferenceSession(_attention_graph(k, h, hkv, dh).SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"]) for k in feeds}
    calls = {k: (lambda i, k=k: sess[k].run(None, feeds[k])) for k in feeds}
    samples = time_interleaved(calls, rounds=args.attention_rounds, warmup=2, unit=1e3)
    med = {k: float(np.median(v)) for k, v in samples.items()}
    return {"seq_len": seq, "heads": h, "kv_heads": hkv, "head_dim": dh,
            "ms": {k: summarize(v) for k, v in samples.items()},
            "gqa_causal_over_gqa_full": round(med["gqa"] / med["gqa_full"], 3),
            "gqa_causal_over_mha_full": round(med["gqa"] / med["mha"], 3),
            "mha_causal_bias_over_mha_full": round(med["mha_causal_bias"] / med["mha"], 3),
            "decomposed_over_gqa": round(med["decomposed"] / med["gqa"], 3)}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--torch", required=True, help="merged checkpoint (PyTorch eager reference)")
    p.add_argument("--onnx", action="append", default=[], help="NAME=EXPORT_DIR, repeatable")
    p.add_argument("--slates", default="examples/beauty-eval-sample.jsonl.gz")
    p.add_argument("--slate", type=int, default=0, help="index among the slates with ≥ --items candidates")
    p.add_argument("--items", type=int, default=50)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--attention", action="store_true", help="also time one attention core alone")
    p.add_argument("--attention-rounds", type=int, default=15)
    p.add_argument("--out", required=True, help="JSON file to write")
    args = p.parse_args(argv)

    from hllm.formats.provenance import library_versions
    from hllm.formats.report import envelope
    from hllm.measure import describe_machine

    t0 = time.time()
    machine = describe_machine(shared=True, note="2 shared cores, background jobs running")
    res = engines_side_by_side(args)
    doc = {"script": "scripts/fused_speed.py", "argv": sys.argv[1:], "machine": machine,
           "libraries": library_versions(), **res}
    if args.attention:
        doc["attention_alone"] = attention_alone(args, res["seq_len"])
    doc["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    doc["wall_seconds"] = round(time.time() - t0, 1)
    with open(args.out, "w") as fh:
        json.dump(envelope("fused_speed", doc), fh, indent=1)

    flags = [f for f in machine["cpu_flags"] if f.startswith(("avx", "amx", "fma"))]
    print(f"{machine['cpu']} ({machine['usable_cpus']} usable CPUs), flags: {' '.join(flags)}; "
          f"load {machine['load_avg_1m']} → {doc['load_avg_1m_after']}")
    print(f"slate: N={res['items']}, {res['seq_len']} tokens; {args.threads} threads; {args.rounds} rounds "
          f"(+{args.warmup} warm-up); fp32 GEMM peak {res['gemm_peak']['peak_gflops']} GFLOP/s")
    print(f"{'engine':<16}{'median s':>10}{'vs eager':>10}{'GFLOP/s':>9}{'of peak':>9}{'max|ΔM|':>10}  same perm")
    for k, r in res["engines"].items():
        print(f"{k:<16}{r['seconds']['median']:>10.3f}{r['speed_vs_eager']:>9.2f}×{r['gflops'] or 0:>9.1f}"
              f"{r['fraction_of_gemm_peak'] or 0:>9.2f}{r['max_abs_diff_vs_eager']:>10.1e}  {r['same_permutation']}")
    if args.attention:
        a = doc["attention_alone"]
        print(f"attention core alone (S={a['seq_len']}, H={a['heads']}, Hkv={a['kv_heads']}, Dh={a['head_dim']}), "
              "median ms: " + ", ".join(f"{k} {v['median']:.1f}" for k, v in a["ms"].items()))
        print(f"  GQA causal / GQA causal=0 = {a['gqa_causal_over_gqa_full']}; GQA causal / MHA full = "
              f"{a['gqa_causal_over_mha_full']}; MHA+causal bias / MHA full = "
              f"{a['mha_causal_bias_over_mha_full']}; decomposed / GQA = {a['decomposed_over_gqa']}")
    print(f"→ {args.out}")


if __name__ == "__main__":
    main()
