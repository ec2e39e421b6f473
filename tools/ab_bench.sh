#!/usr/bin/env bash
# An A/B of two or more fa_bench binaries (two trees, or two variants of one) on one GPU, in one
# run: each round times every binary over the same forward and backward sweep, and the order
# alternates between rounds, so a drift of the card's clocks falls on both sides.
#
#   bash tools/ab_bench.sh OUTDIR ROUNDS NAME=FA_BENCH ... [-- FA_BENCH_FLAGS ...]
#   e.g. bash tools/ab_bench.sh /tmp/ab 2 old=/tmp/old/bin/fa_bench new=build/bin/fa_bench -- --kernels ch05,ch06
#
# Writes OUTDIR/{fwd,bwd}_NAME_ROUND.csv (fa_bench's CSV); tools/ab_compare.py OUTDIR A B gives
# the ratios. Flags after -- go to every fa_bench call (default: the quick sweep, no oracle
# check, 120 ms a point). AB_PASSES (default "fwd bwd") times one pass only, e.g. AB_PASSES=fwd:
# the forward quick sweep of every kernel takes about 100 s a binary on an H200, so two rounds
# of two binaries fill most of one device call.
set -u
passes=${AB_PASSES:-fwd bwd}
for p in $passes; do
  case $p in fwd|bwd) ;; *) echo "ab_bench: unknown pass '$p' in AB_PASSES; allowed: fwd, bwd" >&2; exit 2;; esac
done
out=$1
rounds=$2
shift 2
trees=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  trees+=("$1")
  shift
done
[ $# -gt 0 ] && shift
flags=("$@")
[ ${#flags[@]} -eq 0 ] && flags=(--sweep quick --no-check --budget-ms 120 --warmup 2)
mkdir -p "$out"
for ((round = 1; round <= rounds; round++)); do
  order=("${trees[@]}")
  if ((round % 2 == 0)); then
    order=()
    for ((i = ${#trees[@]} - 1; i >= 0; i--)); do order+=("${trees[i]}"); done
  fi
  for pair in "${order[@]}"; do
    name=${pair%%=*}
    bin=${pair#*=}
    for pass in $passes; do
      extra=()
      [ "$pass" = bwd ] && extra=(--backward)
      "$bin" "${extra[@]}" "${flags[@]}" --csv "$out/${pass}_${name}_${round}.csv" >"$out/${pass}_${name}_${round}.log" 2>&1
      echo "$pass $name round $round: $(tail -n1 "$out/${pass}_${name}_${round}.log")"
    done
  done
done
