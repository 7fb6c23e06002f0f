#!/usr/bin/env bash
# GPU check of the TensorRT FP16 path (see docs/tensorrt.md §4). Run from the repository root on a machine
# with an NVIDIA GPU:
#
#   scripts/gpu_check.sh                      # TensorRT mode if `import tensorrt, polygraphy` works, else proxy mode
#   scripts/gpu_check.sh --proxy              # force the PyTorch-CUDA proxy (no TensorRT needed)
#   scripts/gpu_check.sh --plan               # print and check the plan of the run (no GPU needed)
#   scripts/gpu_check.sh --fetch-wheels       # on a machine WITH network: put the wheels the GPU image lacks
#                                             # (lap, gguf, hllm) into $WHEELS for the GPU run to carry
#   CKPT=checkpoints/smollm2-beauty SLATES=path/eval.jsonl.gz LIMIT=100 RUNS=50 scripts/gpu_check.sh
#
# Sized for a GPU machine lent for 15 minutes whose image has torch (CUDA), onnxruntime (CPU), transformers,
# peft, onnx, tokenizers, typer, rich but no TensorRT, lap or gguf: the proxy mode needs ≤ 8 minutes wall on
# an H200 (two checkpoint loads per precision, 100 slates × 3 precisions, 2 × 60 timed forwards at the paper
# shape). It installs the carried wheels from $WHEELS offline (pip --no-index) and imports hllm from this
# checkout (PYTHONPATH), so it needs no network.
#
# TensorRT mode: GPU tests (pytest -m "gpu or tensorrt"); tiny model → FP16 export → `hllm build` →
# `hllm parity`; real checkpoint → FP16 export → `hllm build --target a100` (timing cache reused by a
# second build) → `hllm parity` on LIMIT slates → `hllm bench stages` at N=50, B=1.
# Proxy mode: the reference model in FP16 and BF16 with the same FP32 islands vs FP32, all on the GPU
# (ranking parity on LIMIT real slates: top-1, Kendall tau, max|ΔM|; latency at N=50), then the latency
# at the paper's shape (Qwen3-0.6B-shaped random weights, 28 layers, hidden 1024, N=50, S≈1,350) against
# the paper's 28 ms. Either way it ends with one summary table; JSON results go to $OUT (results/gpu).
set -euo pipefail

MODE=auto
case "${1:-}" in
  --proxy) MODE=proxy ;;
  --plan) MODE=plan ;;
  --fetch-wheels) MODE=fetch ;;
  "") ;;
  *) echo "gpu_check: unknown option ${1} (use --proxy, --plan or --fetch-wheels)" >&2; exit 2 ;;
esac
PY=${PYTHON:-python}
CKPT=${CKPT:-checkpoints/smollm2-beauty}
SLATES=${SLATES:-examples/beauty-eval-sample.jsonl.gz}
LIMIT=${LIMIT:-100}
RUNS=${RUNS:-50}
WARMUP=${WARMUP:-10}
OUT=${OUT:-results/gpu}
WORK=${WORK:-work/gpu_check}
WHEELS=${WHEELS:-work/gpu_wheels}
ATOL=${ATOL:-1.0}   # fp16 scores differ by ~1e-2; the pass criteria are ranking-level (top-1, Kendall tau)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if [[ $MODE == fetch ]]; then   # CPU machine with network; pins from constraints.txt
  mkdir -p "$WHEELS"
  pins=$(grep -E '^(lap|gguf)==' constraints.txt)
  for v in 3.10 3.11 3.12 3.13; do
    $PY -m pip download --no-deps --only-binary=:all: --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
      --python-version "$v" -d "$WHEELS" $pins
  done
  $PY -m pip wheel --no-deps --no-build-isolation -w "$WHEELS" .
  ls -l "$WHEELS"; exit 0
fi
if [[ $MODE == plan ]]; then
  exec $PY scripts/gpu_check.py plan --checkpoint "$CKPT" --slates "$SLATES" --limit "$LIMIT" --runs "$RUNS" \
    --warmup "$WARMUP" --out-dir "$OUT"
fi

command -v nvidia-smi >/dev/null || { echo "gpu_check: no NVIDIA GPU (nvidia-smi missing)" >&2; exit 2; }
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader
mkdir -p "$OUT" "$WORK"
if [[ -d $WHEELS ]]; then   # the wheels the image lacks, carried with the checkout; never the network
  $PY -m pip install -q --no-index --no-deps --find-links "$WHEELS" lap gguf || { echo "gpu_check: cannot install lap/gguf from $WHEELS" >&2; exit 2; }
fi
$PY -c "import lap, hllm" 2>/dev/null || { echo "gpu_check: lap or hllm not importable (run --fetch-wheels where there is network; carry $WHEELS)" >&2; exit 2; }
if [[ $MODE == auto ]]; then
  if $PY -c "import tensorrt, polygraphy" 2>/dev/null; then MODE=tensorrt; else MODE=proxy; fi
fi
echo "gpu_check: mode $MODE"
FP16_GATE=(--atol "$ATOL" --min-perm-match 0 --min-top1 0.99 --min-tau 0.99)

if [[ $MODE == tensorrt ]]; then
  $PY -c "import tensorrt; print('TensorRT', tensorrt.__version__)"
  $PY -m pytest -q -m "gpu or tensorrt" tests/engines/test_tensorrt.py
  # 1. tiny model, end to end
  $PY scripts/gpu_check.py tiny "$WORK/tiny"
  $PY -m hllm build "$WORK/tiny/export16" "$WORK/tiny/tiny.plan" --profile 1:1:4/8:128:512/1:8:8 \
    --timing-cache "$WORK/tiny.cache" --overwrite
  $PY -m hllm parity "$WORK/tiny/merged" "$WORK/tiny/tiny.plan" --slates "$WORK/tiny/slates.jsonl" \
    "${FP16_GATE[@]}" -o "$OUT/tiny_trt_parity.json" || true
  # 2. real checkpoint
  [[ -f "$WORK/export16/export.json" ]] || $PY -m hllm export "$CKPT" "$WORK/export16" --precision fp16
  $PY -m hllm build "$WORK/export16" "$WORK/real.plan" --target a100 --profile 1:1:8/16:1536:2048/1:50:50 \
    --timing-cache "$WORK/real.cache" --opt-level 3 --overwrite
  $PY -m hllm build "$WORK/export16" "$WORK/real2.plan" --target a100 --profile 1:1:8/16:1536:2048/1:50:50 \
    --timing-cache "$WORK/real.cache" --opt-level 3 --overwrite   # second build reuses the timing cache
  $PY - "$WORK" "$OUT" <<'EOF'
import json, sys
from pathlib import Path
w, o = Path(sys.argv[1]), Path(sys.argv[2])
a, b = (json.loads((w / f"{n}.plan.json").read_text()) for n in ("real", "real2"))
rec = {k: a[k] for k in ("tensorrt_version", "gpu_name", "compute_capability", "hardware_compatibility", "precision",
                         "fp32_islands", "profiles", "plan_bytes", "onnx_sha256", "source_checkpoint")}
rec.update(build_seconds_cold=a["build_seconds"], build_seconds_cached=b["build_seconds"], timing_cache=b["timing_cache"])
(o / "real_trt_build.json").write_text(json.dumps(rec, indent=2))
print(f"build: {a['build_seconds']} s cold, {b['build_seconds']} s with the timing cache")
EOF
  $PY -m hllm parity "$CKPT" "$WORK/real.plan" --slates "$SLATES" --limit "$LIMIT" "${FP16_GATE[@]}" \
    -o "$OUT/real_trt_parity.json" || true
  $PY -m hllm bench stages "$WORK/real.plan" --slates "$SLATES" -n 50 -b 1 --runs "$RUNS" --warmup "$WARMUP" \
    --peak-size 0 -o "$OUT/real_trt_bench.json"
else
  $PY scripts/gpu_check.py proxy --checkpoint "$CKPT" --slates "$SLATES" --limit "$LIMIT" --n-items 50 \
    --runs "$RUNS" --warmup "$WARMUP" --atol "$ATOL" -o "$OUT/proxy.json" || true
  $PY scripts/gpu_check.py paper-latency --runs "$RUNS" --warmup "$WARMUP" -o "$OUT/paper_latency.json"
fi

echo
$PY scripts/gpu_check.py summary "$OUT"/*.json
