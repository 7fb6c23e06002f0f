#!/usr/bin/env bash
# Reproduce the benchmark figures of the README (docs/benchmarks.md) into results/bench/:
#   lapjv.json      LAP solvers vs the runtime's decode path (N = 10, 50, 150; 3 matrix families)
#                   + the real score matrices of the ONNX export on MODEL_SLATES real slates (N = 10, 50)
#   stages.json     per-stage latency, PyTorch and each ONNX Runtime graph, N = 10, 25, 50 (batch 1) + batch 2 at N = 50
#   scaling.json    engine time at S = 400, 800, 1350, 2600 prompt tokens (N = 50): PyTorch eager vs each graph
#   versus_ar.json  hLLM single pass (PyTorch) vs greedy autoregressive (constrained + unconstrained), N = 50
#   stages.png      chart of the two (needs matplotlib: pip install 'hllm[bench]')
# About 5 minutes on a quiet 2-core machine; 25-30 minutes when its cores are shared with other work.
# The defaults are the configuration of the committed figures; raise RUNS / AR_SLATES for tighter ones.
#
# Inputs (environment variables, defaults in brackets):
#   CKPT [checkpoints/smollm2-beauty]  hLLM checkpoint (PyTorch)   EXPORT [work/demo/export]  its ONNX export (fused ort-cpu)
#   EXTRA []  more exports of the same checkpoint to race (space-separated: the standard-ONNX flavour, INT8 graphs)
#   SCALING_RUNS [5]  interleaved rounds per prompt length
#   AR [work/smollm2]        the same backbone as a causal LM     SLATES [examples/beauty-eval-sample.jsonl.gz]
#   OUT [results/bench]      output folder                        THREADS []  intra-op threads (default: engine's)
#   MACHINE [--quiet-machine] or --shared: recorded in the JSON   NOTE []  free text recorded in the JSON
#   RUNS [2]  measured calls per configuration   AR_SLATES [2]  measured slates of the AR comparison
#   LARGE_BATCH [2]  the batch size > 1 measured at N = 50     MODEL_SLATES [4]  real slates for solver timing
#   LAPJV_EXTRA_PATH []  PYTHONPATH holding extra solvers to compare (e.g. src-d `lapjv` built from sdist)
#   TRAINED []    a trained hLLM checkpoint: its real score matrices → lapjv_trained.json
#   LAPX_PATH []  a `pip install --target DIR lapx==0.11.1` folder: lapx replaces lap → lapjv_lapx.json
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python )}
CKPT=${CKPT:-checkpoints/smollm2-beauty}
EXPORT=${EXPORT:-work/demo/export}
AR=${AR:-work/smollm2}
SLATES=${SLATES:-examples/beauty-eval-sample.jsonl.gz}
OUT=${OUT:-results/bench}
MACHINE=${MACHINE:---quiet-machine}
RUNS=${RUNS:-2}
AR_SLATES=${AR_SLATES:-2}
LARGE_BATCH=${LARGE_BATCH:-2}
MODEL_SLATES=${MODEL_SLATES:-4}
SCALING_RUNS=${SCALING_RUNS:-5}
read -r -a EXTRA_MODELS <<< "${EXTRA:-}"
THREADS_OPT=()
[ -n "${THREADS:-}" ] && THREADS_OPT=(--threads "$THREADS")
NOTE_OPT=()
[ -n "${NOTE:-}" ] && NOTE_OPT=(--note "$NOTE")

for p in "$CKPT" "$EXPORT" "$AR" "$SLATES"; do
  [ -e "$p" ] || { echo "error: $p not found (see docs/benchmarks.md for how to make it)" >&2; exit 2; }
done
mkdir -p "$OUT"
hllm() { "$PY" -m hllm "$@"; }

echo "== LAP solvers" >&2
PYTHONPATH=${LAPJV_EXTRA_PATH:-} hllm bench lapjv -n 10,50,150 --families gaussian,planted,rank1 --matrices 200 \
  --model "$EXPORT" --model-slates "$MODEL_SLATES" -s "$SLATES" -o "$OUT/lapjv.json" "$MACHINE" "${NOTE_OPT[@]}"

if [ -n "${TRAINED:-}" ]; then
  hllm bench lapjv -n 10,50 --families planted,rank1 --matrices 200 --model "$TRAINED" \
    --model-slates "$MODEL_SLATES" -s "$SLATES" -o "$OUT/lapjv_trained.json" "$MACHINE" "${NOTE_OPT[@]}"
fi
if [ -n "${LAPX_PATH:-}" ]; then
  PYTHONPATH=$LAPX_PATH hllm bench lapjv -n 10,50,150 --families gaussian,planted,rank1 --matrices 200 \
    -o "$OUT/lapjv_lapx.json" "$MACHINE" "${NOTE_OPT[@]}"
fi

echo "== per-stage latency (PyTorch + ONNX Runtime, interleaved)" >&2
hllm bench stages "$CKPT" "$EXPORT" "${EXTRA_MODELS[@]}" -s "$SLATES" -n 10,25,50 -b 1 --large-batch "$LARGE_BATCH" \
  --runs "$RUNS" --warmup 1 "${THREADS_OPT[@]}" -o "$OUT/stages.json" "$MACHINE" "${NOTE_OPT[@]}"

echo "== engine time against prompt length (PyTorch first: the reference of the ratios)" >&2
hllm bench scaling "$CKPT" "$EXPORT" "${EXTRA_MODELS[@]}" --seq-lens 400,800,1350,2600 -n 50 \
  --runs "$SCALING_RUNS" --warmup 1 "${THREADS_OPT[@]}" -o "$OUT/scaling.json" "$MACHINE" "${NOTE_OPT[@]}"

echo "== single pass vs autoregressive (interleaved per slate)" >&2
hllm bench versus-ar "$CKPT" --ar "$AR" -s "$SLATES" -n 50 --count "$AR_SLATES" \
  "${THREADS_OPT[@]}" -o "$OUT/versus_ar.json" "$MACHINE" "${NOTE_OPT[@]}"

if "$PY" -c "import matplotlib" 2>/dev/null; then
  SCALING_OPT=()
  [ -f "$OUT/scaling.json" ] && SCALING_OPT=(--scaling "$OUT/scaling.json")
  hllm bench chart --stages "$OUT/stages.json" --versus "$OUT/versus_ar.json" "${SCALING_OPT[@]}" -n 50 -o "$OUT/stages.png"
else
  echo "matplotlib not installed: no chart (pip install 'hllm[bench]')" >&2
fi
