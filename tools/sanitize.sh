#!/usr/bin/env bash
# make sanitize (GPU machine): every registered kernel on small shapes under compute-sanitizer's
# four tools, memcheck, racecheck, synccheck and initcheck; one summary line per tool.
#
# The kernels run through the GPU tests themselves (fa_gpu_tests), filtered to the small shapes:
# every forward kernel on seq 17 and 127 (head_dim 32 to 256, causal and not, seq_q != seq_kv),
# every backward kernel on seq 17, 31 x 100, 257 and 257 x 130 (head_dim 96), every decode
# kernel on the paged cases (the long-context one left out), the cache kernels, the paged
# prefill check, the FP8 tests and chapter 09's kernels, forward and backward, on the short
# shapes of its list (packed batches included). The tests still compare against the oracle, so
# a kernel that is clean but wrong fails here too.
#
# Usage: bash tools/sanitize.sh [BUILD_DIR] [TOOL ...]     (default: build, all four tools)
# Exit status: 0 when every tool reports 0 errors and every test passes; logs in BUILD_DIR/sanitize/.
set -uo pipefail
build=${1:-build}
shift || true
tools=("$@")
[ ${#tools[@]} -eq 0 ] && tools=(memcheck racecheck synccheck initcheck)
bin="$build/bin/fa_gpu_tests"
if [ ! -x "$bin" ]; then
  echo "sanitize: $bin not found; run 'make build' first" >&2
  exit 2
fi
forward="All/ForwardKernelTest.MatchesOracle/*_q17_k17_*:All/ForwardKernelTest.MatchesOracle/*_q127_k127_*"
forward+=":All/ForwardKernelTest.MatchesOracle/*_q127_k1000_*:All/ForwardKernelTest.MatchesOracle/*_q17_k300_*"
backward="All/BackwardKernelTest.MatchesOracle/*_q17_k17_*:All/BackwardKernelTest.MatchesOracle/*_q31_k100_*"
backward+=":All/BackwardKernelTest.MatchesOracle/*_q257_k257_*:All/BackwardKernelTest.MatchesOracle/*_q257_k130_*"
others="All/DecodeKernelTest.*:PagedCache.*:PagedPrefill.*:Fp8OnTheGpu.*"
features="Features/FeatureKernelTest.MatchesOracle/*_q5_k7_*:Features/FeatureKernelTest.MatchesOracle/*_q130_k70_*"
features+=":Features/FeatureKernelTest.MatchesOracle/*_q129_k257_*:Features/FeatureKernelTest.MatchesOracle/*_q200_k200_*"
features+=":Features/FeatureKernelTest.MatchesOracle/*_q600_k600_*"
for cut in q5_k7 q130_k70 q129_k257 q200_k200; do features+=":All/BackwardKernelTest.MatchesOracle/ch09_*_${cut}_*"; done
filter="$forward:$backward:$others:$features-*long_d128*"

# Without a GPU every test skips: say so instead of reporting a clean run.
probe=$("$bin" --gtest_filter='PagedCache.*' 2>&1)
if echo "$probe" | grep -q "no GPU"; then
  echo "sanitize: needs a GPU; $(echo "$probe" | grep -m1 -o 'no GPU.*')" >&2
  exit 2
fi

sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ ! -x "$sanitizer" ]; then
  echo "sanitize: compute-sanitizer not found (it comes with the CUDA toolkit, in /usr/local/cuda/bin)" >&2
  exit 2
fi

mkdir -p "$build/sanitize"
status=0
printf "%-10s %6s %6s %6s %6s %8s  %s\n" tool tests passed failed skipped seconds "sanitizer says"
for tool in "${tools[@]}"; do
  case $tool in memcheck|racecheck|synccheck|initcheck) ;; *)
    echo "sanitize: unknown tool '$tool'; use memcheck, racecheck, synccheck or initcheck" >&2
    exit 2 ;;
  esac
  log="$build/sanitize/$tool.log"
  start=$(date +%s)
  "$sanitizer" --tool "$tool" --print-limit 20 "$bin" --gtest_filter="$filter" > "$log" 2>&1
  rc=$?
  seconds=$(( $(date +%s) - start ))
  run=$(grep -oE '^\[==========\] [0-9]+ tests? from [0-9]+ test suites? ran' "$log" | grep -oE '[0-9]+' | head -1)
  passed=$(grep -oE '^\[  PASSED  \] [0-9]+' "$log" | grep -oE '[0-9]+$')
  failed=$(grep -oE '^\[  FAILED  \] [0-9]+ tests?, listed below' "$log" | grep -oE '[0-9]+' | head -1)
  skipped=$(grep -oE '^\[  SKIPPED \] [0-9]+ tests?, listed below' "$log" | grep -oE '[0-9]+' | head -1)
  says=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -1 | sed 's/^========= //')
  [ -z "$says" ] && says="no summary (exit $rc): see $log"
  printf "%-10s %6s %6s %6s %6s %8s  %s\n" "$tool" "${run:-?}" "${passed:-0}" "${failed:-0}" "${skipped:-0}" \
    "$seconds" "$says"
  if [ $rc -ne 0 ] || ! echo "$says" | grep -qE "SUMMARY: 0 (errors|hazards)"; then status=1; fi
done
[ $status -ne 0 ] && echo "sanitize: not clean; logs in $build/sanitize/" >&2
exit $status
