#!/usr/bin/env bash
# The training recipe on the CPU, as a niced background job that accumulates across runs: every step keeps
# its progress on disk, so stopping it (kill, reboot, end of a session) loses at most SAVE_EVERY optimizer
# steps, and starting it again continues. Run from the repository root:
#
#   scripts/cpu_train.sh start    # start or continue in the background (nohup nice -n 19; log $WORK/cpu_train.log)
#   scripts/cpu_train.sh status   # slates cached / trained, rate and ETA (hllm train-status, from the files)
#   scripts/cpu_train.sh run      # the job itself in the foreground (what start runs)
#
# Steps (each resumes where the last run stopped):
#   1. teacher order of the train slates (`hllm teacher minilm --kind embedding --agg max`, needs
#      `pip install 'hllm[teacher]'`; skipped when TEACHER exists or OBJECTIVE=clicks; written once)
#   2. the frozen layers 0..LAYER-1 of every slate, once (`hllm features --precision $PRECISION`): one file
#      per slate, written atomically, so the cache accumulates (3 MB per slate at SmolLM2's layer 28)
#   3. LoRA r=RANK on every linear projection of the top LORA_LAYERS layers + the head from that cache
#      (`hllm train --features --resume`): checkpoint + AdamW state every SAVE_EVERY steps. The cached
#      states are read per batch, so memory holds one batch, not the cache.
#   LORA_LAYERS=all runs the paper's setting instead (every layer adapted, no cache: each step runs the
#   whole backbone forward and backward; still resumable).
# Variables: BACKBONE TRAIN TEACHER LIMIT VAL RANK LORA_LAYERS BATCH EPOCHS STEPS LR SAVE_EVERY PRECISION THREADS
# OBJECTIVE WORK PYTHON. Only one job per WORK runs at a time (flock on $WORK/cpu_train.lock). LIMIT VAL RANK
# BATCH STEPS SAVE_EVERY THREADS are whole numbers (LORA_LAYERS too, or 'all') within `hllm train`'s bounds, EPOCHS
# a positive number (≤ 1000, ≤ 10^7 steps), LR in (0, 1], PRECISION and OBJECTIVE one of hllm train's choices; WORK
# neither is, holds nor lies inside BACKBONE, TRAIN or a given TEACHER, nor is or holds the checkout, the working
# directory or HOME. All checked before any use or work, exit 2 naming the variable (scripts/args.sh).
# Costs on this project's 2 shared cores: docs/training.md ("Where training is fast"), from
# results/quality/train-precision-speed-cpu.json.
set -euo pipefail

MODE=${1:-}
(( $# <= 1 )) || { echo "cpu_train: give one of start, status or run, nothing else (got: $*)" >&2; exit 2; }
case "$MODE" in start|status|run) ;; *) echo "cpu_train: give start, status or run (got '${MODE}')" >&2; exit 2 ;; esac
PY=${PYTHON:-.venv/bin/python}
BACKBONE=${BACKBONE:-work/smollm2}
TRAIN=${TRAIN:-../shared/data/amazon-beauty/train.jsonl.gz}
WORK=${WORK:-work/cpu_train}
GIVEN_TEACHER=${TEACHER:-}   # an input where given; by default the script makes it inside WORK
TEACHER=${TEACHER:-$WORK/teacher.jsonl}
OBJECTIVE=${OBJECTIVE:-clicks+teacher}
LIMIT=${LIMIT:-12000}
VAL=${VAL:-200}
RANK=${RANK:-64}
LORA_LAYERS=${LORA_LAYERS:-2}
BATCH=${BATCH:-8}
EPOCHS=${EPOCHS:-1}
LR=${LR:-5e-4}
SAVE_EVERY=${SAVE_EVERY:-10}
PRECISION=${PRECISION:-auto}
THREADS=${THREADS:-2}
HLLM=("$PY" -m hllm)

PROG=cpu_train
REPO=$(cd "$(dirname "$0")/.." && pwd)
. "$(dirname "${BASH_SOURCE[0]}")/args.sh"   # die, count, real, one_of, steps_of, apart and the bounds
count LIMIT; count RANK 1 "$MAX_RANK"; count BATCH 1 "$MAX_BATCH"; count SAVE_EVERY 1 "$MAX_SAVE_EVERY"
count THREADS 1 "$(max_threads)"
count VAL 0 "$MAX_VAL"
(( VAL < LIMIT )) || die "VAL ($VAL validation slates) must be below LIMIT ($LIMIT)"
[[ -z ${STEPS:-} ]] || count STEPS 1 "$MAX_STEPS"
[[ $LORA_LAYERS == all ]] || count LORA_LAYERS
real EPOCHS "$MAX_EPOCHS"; real LR "$MAX_LR"
one_of PRECISION auto fp32 bf16
one_of OBJECTIVE clicks teacher clicks+teacher
if [[ -z ${STEPS:-} ]]; then   # EPOCHS passes over the LIMIT-VAL training slates
  STEPS=$(steps_of "$LIMIT" "$VAL" "$EPOCHS" "$BATCH")
  [[ $STEPS =~ ^[0-9]{1,9}$ ]] && (( STEPS <= MAX_STEPS )) \
    || die "EPOCHS=$EPOCHS over $(( LIMIT - VAL )) slates in batches of $BATCH makes $STEPS steps, over $MAX_STEPS"
fi
TEACHER_IN=; [[ -n $GIVEN_TEACHER ]] && TEACHER_IN=TEACHER
apart WORK "BACKBONE TRAIN $TEACHER_IN" "REPO PWD HOME"

[[ -f $BACKBONE/config.json ]] || { echo "cpu_train: backbone not found: $BACKBONE (hllm convert-gguf $BACKBONE)" >&2; exit 2; }
N_LAYERS=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['num_hidden_layers'])" "$BACKBONE/config.json") \
  || die "cannot read num_hidden_layers from $BACKBONE/config.json with $PY"
[[ $N_LAYERS =~ ^[0-9]{1,4}$ ]] || die "num_hidden_layers in $BACKBONE/config.json is not a whole number ($N_LAYERS)"
if [[ $LORA_LAYERS == all ]]; then LAYER=0; CACHE=""; else
  (( LORA_LAYERS < N_LAYERS )) || die "LORA_LAYERS ($LORA_LAYERS) must be below the backbone's $N_LAYERS layers (or 'all')"
  LAYER=$(( N_LAYERS - LORA_LAYERS )); CACHE=$WORK/feat-L$LAYER
fi
CKPT=$WORK/ckpt

if [[ $MODE == status ]]; then
  args=("$CKPT"); [[ -n $CACHE && -d $CACHE ]] && args+=(--features "$CACHE")
  [[ -d $CKPT || -n $CACHE && -d $CACHE ]] || { echo "cpu_train: nothing started under $WORK" >&2; exit 2; }
  exec "${HLLM[@]}" train-status "${args[@]}"
fi
if [[ $MODE == start ]]; then
  mkdir -p "$WORK"
  nohup nice -n 19 "$0" run >> "$WORK/cpu_train.log" 2>&1 < /dev/null &
  echo "cpu_train: started (pid $!), log $WORK/cpu_train.log; progress: $0 status"
  exit 0
fi

[[ -f $TRAIN ]] || { echo "cpu_train: train slates not found: $TRAIN" >&2; exit 2; }
mkdir -p "$WORK"
exec 9> "$WORK/cpu_train.lock"
flock -n 9 || { echo "cpu_train: another run holds $WORK/cpu_train.lock" >&2; exit 2; }
echo "cpu_train: $(date -u +%FT%TZ) run: $LIMIT slates, LoRA r=$RANK on ${LORA_LAYERS} layer(s), precision $PRECISION"
TEACH=()
if [[ $OBJECTIVE != clicks ]]; then
  [[ -f $TEACHER ]] || "${HLLM[@]}" teacher minilm -s "$TRAIN" -o "$TEACHER" --kind embedding --agg max --limit "$LIMIT"
  TEACH=(--teacher "$TEACHER")
fi
FEAT=(--lora-layers "$LORA_LAYERS")
if [[ -n $CACHE ]]; then
  "${HLLM[@]}" features "$BACKBONE" "$CACHE" -s "$TRAIN" --layer "$LAYER" --limit "$LIMIT" --precision "$PRECISION" \
    --threads "$THREADS"
  FEAT+=(--features "$CACHE")
else
  FEAT=()
fi
RESUME=(); [[ -f $CKPT/training_state.json ]] && RESUME=(--resume)
"${HLLM[@]}" train "$BACKBONE" "$CKPT" -s "$TRAIN" --limit "$LIMIT" --val-slates "$VAL" --val-every "$(( SAVE_EVERY * 10 ))" \
  --objective "$OBJECTIVE" "${TEACH[@]}" --lora-rank "$RANK" "${FEAT[@]}" --context-readout \
  --head self_attention --head-dim 256 --head-heads 4 --head-ff 512 --steps "$STEPS" --batch-size "$BATCH" --accum 1 \
  --lr "$LR" --lr-schedule cosine --warmup-steps "$(( STEPS / 20 ))" --weight-decay 0.01 --seed 0 \
  --save-every "$SAVE_EVERY" --precision "$PRECISION" --threads "$THREADS" "${RESUME[@]}"
echo "cpu_train: $(date -u +%FT%TZ) done: $CKPT"
