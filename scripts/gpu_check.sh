#!/usr/bin/env bash
# GPU check of the TensorRT FP16 path (see docs/tensorrt.md). Run from the repository root on a machine
# with an NVIDIA GPU:
#
#   scripts/gpu_check.sh                      # TensorRT mode if `import tensorrt` works, else proxy mode
#   scripts/gpu_check.sh --proxy              # force the PyTorch-CUDA proxy (no TensorRT needed)
#   CKPT=checkpoints/smollm2-beauty SLATES=path/eval.jsonl.gz LIMIT=100 RUNS=50 scripts/gpu_check.sh
#
# TensorRT mode: GPU tests (pytest -m "gpu or tensorrt"); tiny model → FP16 export → `hllm build` →
# `hllm parity`; real checkpoint → FP16 export → `hllm build --target a100` (timing cache reused by a
# second build) → `hllm parity` on LIMIT slates → `hllm bench stages` at N=50, B=1.
# Proxy mode: the reference model in FP16 with the same FP32 islands vs FP32, both on the GPU (ranking
# parity on LIMIT slates, latency floor at N=50).
# Either way it ends with one summary table; JSON results go to $OUT (default results/fp16/gpu).
set -euo pipefail

MODE=auto
[[ "${1:-}" == "--proxy" ]] && MODE=proxy
PY=${PYTHON:-python}
CKPT=${CKPT:-checkpoints/smollm2-beauty}
SLATES=${SLATES:-examples/beauty-eval-sample.jsonl.gz}
LIMIT=${LIMIT:-100}
RUNS=${RUNS:-50}
WARMUP=${WARMUP:-10}
OUT=${OUT:-results/fp16/gpu}
WORK=${WORK:-work/gpu_check}
ATOL=${ATOL:-1.0}   # fp16 scores differ by ~1e-2; the pass criteria are ranking-level (top-1, Kendall tau)

command -v nvidia-smi >/dev/null || { echo "gpu_check: no NVIDIA GPU (nvidia-smi missing)" >&2; exit 2; }
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader
mkdir -p "$OUT" "$WORK"
if [[ $MODE == auto ]]; then
  if $PY -c "import tensorrt, cuda" 2>/dev/null; then MODE=tensorrt; else MODE=proxy; fi
fi
echo "gpu_check: mode $MODE"
FP16_GATE=(--atol "$ATOL" --min-perm-match 0 --min-top1 0.99 --min-tau 0.99)

if [[ $MODE == tensorrt ]]; then
  $PY -c "import tensorrt; print('TensorRT', tensorrt.__version__)"
  $PY -m pytest -q -m "gpu or tensorrt" tests/engines/test_tensorrt.py
  # 1. tiny model, end to end
  $PY scripts/gpu_check.py tiny "$WORK/tiny"
  hllm build "$WORK/tiny/export16" "$WORK/tiny/tiny.plan" --profile 1:1:4/8:128:512/1:8:8 \
    --timing-cache "$WORK/tiny.cache" --overwrite
  hllm parity "$WORK/tiny/merged" "$WORK/tiny/tiny.plan" --slates "$WORK/tiny/slates.jsonl" \
    "${FP16_GATE[@]}" -o "$OUT/tiny_trt_parity.json" || true
  # 2. real checkpoint
  [[ -f "$WORK/export16/export.json" ]] || hllm export "$CKPT" "$WORK/export16" --precision fp16
  hllm build "$WORK/export16" "$WORK/real.plan" --target a100 --profile 1:1:8/16:1536:2048/1:50:50 \
    --timing-cache "$WORK/real.cache" --opt-level 3 --overwrite
  hllm build "$WORK/export16" "$WORK/real2.plan" --target a100 --profile 1:1:8/16:1536:2048/1:50:50 \
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
  hllm parity "$CKPT" "$WORK/real.plan" --slates "$SLATES" --limit "$LIMIT" "${FP16_GATE[@]}" \
    -o "$OUT/real_trt_parity.json" || true
  hllm bench stages "$WORK/real.plan" --slates "$SLATES" -n 50 -b 1 --runs "$RUNS" --warmup "$WARMUP" \
    --peak-size 0 -o "$OUT/real_trt_bench.json"
else
  $PY scripts/gpu_check.py proxy --checkpoint "$CKPT" --slates "$SLATES" --limit "$LIMIT" --n-items 50 \
    --runs "$RUNS" --warmup "$WARMUP" --atol "$ATOL" -o "$OUT/proxy.json" || true
fi

echo
$PY scripts/gpu_check.py summary "$OUT"/*.json
