# Argument checks shared by scripts/cpu_train.sh and scripts/gpu_train.sh (sourced, never run): each refuses a bad
# value with one line naming the variable and exit 2, before the value is used anywhere (no arithmetic evaluation
# of unchecked text). The sourcing script sets PROG, its name in messages.
die() { echo "$PROG: $*" >&2; exit 2; }
count() {   # NAME [min]: a whole number >= min (default 1), normalised to base 10
  local v=${!1}
  [[ $v =~ ^[0-9]{1,9}$ ]] || die "$1 must be a whole number (got '$v')"
  v=$((10#$v)); (( v >= ${2:-1} )) || die "$1 must be at least ${2:-1} (got $v)"
  printf -v "$1" %d "$v"
}
real() {    # NAME: a positive decimal number (EPOCHS, LR)
  [[ ${!1} =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$ && ! ${!1} =~ ^[0.]*([eE].*)?$ ]] \
    || die "$1 must be a positive number (got '${!1}')"
}
