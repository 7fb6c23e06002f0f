# Argument checks shared by scripts/cpu_train.sh and scripts/gpu_train.sh (sourced, never run): each refuses a bad
# value with one line naming the variable and exit 2, before the value is used anywhere (no arithmetic evaluation
# of unchecked text) and before any work starts. The sourcing script sets PROG, its name in messages. Upper bounds
# are those of `hllm train` (docs/cli.md), so a value it would refuse stops the script before the features step.
die() { echo "$PROG: $*" >&2; exit 2; }
count() {   # NAME [min [max]]: a whole number min..max (default 1..999999999), normalised to base 10
  local v=${!1} lo=${2:-1} hi=${3:-999999999}
  [[ $v =~ ^[0-9]{1,9}$ ]] || die "$1 must be a whole number (got '$v')"
  v=$((10#$v)); (( v >= lo )) || die "$1 must be at least $lo (got $v)"
  (( v <= hi )) || die "$1 must be at most $hi (got $v)"
  printf -v "$1" %d "$v"
}
real() {    # NAME [max]: a positive decimal number (EPOCHS, LR), at most max where given
  [[ ${!1} =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$ && ! ${!1} =~ ^[0.]*([eE].*)?$ ]] \
    && awk 'BEGIN { exit !(ARGV[1] + 0 > 0) }' "${!1}" \
    || die "$1 must be a positive number (got '${!1}')"   # awk: 1e-999 underflows to 0, which hllm train refuses
  [[ -z ${2:-} ]] || awk 'BEGIN { exit !(ARGV[1] + 0 <= ARGV[2] + 0) }' "${!1}" "$2" \
    || die "$1 must be at most $2 (got ${!1})"
}
one_of() {  # NAME CHOICE...: one of the given words
  local name=$1 c; shift
  for c in "$@"; do [[ ${!name} == "$c" ]] && return 0; done
  die "$name must be one of $* (got '${!name}')"
}
steps_of() {  # LIMIT VAL EPOCHS BATCH: optimizer steps of EPOCHS passes over LIMIT-VAL slates, ceil, ≥ 1 (checked values)
  awk 'BEGIN { x = (ARGV[1] - ARGV[2]) * ARGV[3] / ARGV[4]; s = int(x); if (s < x) s++; if (s < 1) s = 1;
               printf "%.0f\n", s }' "$@"
}
MAX_STEPS=10000000       # hllm train --steps
MAX_SAVE_EVERY=1000000   # hllm train --save-every; the scripts validate every 10 × SAVE_EVERY steps (--val-every ≤ 10^7)
MAX_VAL=1000000          # hllm train --val-slates
MAX_RANK=4096            # hllm train --lora-rank
MAX_BATCH=1024           # hllm train --batch-size
MAX_EPOCHS=1000
MAX_LR=1                 # AdamW's peak learning rate: (0, 1]
max_threads() { echo $(( 4 * $(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1) )); }   # hllm's --threads: 4 × cores
apart() {   # VAR INPUTS OTHERS: the folder VAR must not be, hold or lie inside any input (variables named in INPUTS),
            # nor be or hold any of OTHERS (the checkout, the working directory, HOME: a work folder may lie in them)
  local d name p
  d=$(realpath -m -- "${!1}")
  for name in $2 $3; do
    [[ -n ${!name:-} ]] || continue
    p=$(realpath -m -- "${!name}")
    # ${d%/}: "/" holds everything ("$d"/* was "//*", which nothing matched)
    [[ $p == "$d" || $p == "${d%/}"/* ]] && die "$1=${!1} holds $name (${!name}); choose a folder of its own"
    [[ " $2 " == *" $name "* && $d == "${p%/}"/* ]] && die "$1=${!1} is inside $name (${!name}); choose a folder of its own"
  done
  return 0
}
