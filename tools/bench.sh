#!/usr/bin/env bash
# make bench: every registered kernel over the standard sweep (FA_SWEEP, default standard), with
# PyTorch SDPA on the same points when `import torch` works, then one report and the plots.
#   1. forward: fa_bench (with the measured ceilings), then SDPA's forward
#   2. backward: fa_bench --backward (chapter 07), then SDPA's backward (FLASH and cuDNN, bf16)
#   3. decode: fa_bench --decode (chapter 08), then SDPA on the same K/V stored contiguously
#   4. report.md (forward, per-chapter best, the fastest 16-bit kernel against SDPA's bf16 backends,
#      ceilings, peak memory, backward), decode.md, progression.png, roofline.png
# Each point prints "[n/total] kernel shape ..." as it finishes. Timing: a budget per point
# (FA_BUDGET_MS, default 300 ms of repeats; 1 warm-up launch), and a kernel whose point took over
# FA_MAX_POINT_MS / 2 (default 1000) skips its longer points of that series, saying so: the
# teaching kernels of chapters 01-04 would otherwise take most of an hour at 16k tokens.
# Output in $BUILD/bench/. FA_BENCH_ARGS: extra fa_bench flags (e.g. --kernels ch05 --dims 128).
# FA_PHASES (default forward,backward,decode) runs some phases only; the files of the others
# already in $BUILD/bench/ are kept and go into the report.
set -euo pipefail
build=${1:-build}
sweep=${FA_SWEEP:-standard}
budget=${FA_BUDGET_MS:-300}
max_point=${FA_MAX_POINT_MS:-1000}
out="$build/bench"
mkdir -p "$out"
phases=",${FA_PHASES:-forward,backward,decode},"
for p in ${phases//,/ }; do
  case $p in forward|backward|decode) ;; *) echo "bench: unknown phase '$p' in FA_PHASES; allowed: forward, backward, decode" >&2; exit 2;; esac
done
runs() { [[ $phases == *",$1,"* ]]; }
runs forward && rm -f "$out"/{fa_bench,ceilings,torch}.csv
runs backward && rm -f "$out"/{backward,torch_backward}.csv
runs decode && rm -f "$out"/{decode,torch_decode}.csv "$out/decode.md"
rm -f "$out/report.md"
timing=(--budget-ms "$budget" --warmup 1 --max-point-ms "$max_point")
have_torch=0
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  have_torch=1
else
  echo "bench: PyTorch with CUDA not importable here; skipping the SDPA comparison"
fi
status=0
start=$SECONDS
phase() { echo; echo "==== bench: $1 ($((SECONDS - start)) s so far)"; }

if runs forward; then
  phase "1/3 forward: our kernels"
  "$build/bin/fa_bench" --sweep "$sweep" --csv "$out/fa_bench.csv" --ceilings "$out/ceilings.csv" "${timing[@]}" \
    ${FA_BENCH_ARGS:-} || status=$?
fi
if runs forward && [ $have_torch = 1 ]; then
  phase "1/3 forward: PyTorch SDPA"
  python3 tools/bench_torch.py --sweep "$sweep" --budget-ms "$budget" --csv "$out/torch.csv" \
    --backends flash_bf16,cudnn_bf16,flash_fp16,cudnn_fp16,efficient_fp32 || status=$?
fi

if runs backward; then
  phase "2/3 backward: our kernels"
  "$build/bin/fa_bench" --backward --sweep "$sweep" --csv "$out/backward.csv" "${timing[@]}" ${FA_BENCH_ARGS:-} || status=$?
fi
if runs backward && [ $have_torch = 1 ]; then
  phase "2/3 backward: PyTorch SDPA"
  python3 tools/bench_torch.py --pass backward --sweep "$sweep" --budget-ms "$budget" --backends flash_bf16,cudnn_bf16 \
    --csv "$out/torch_backward.csv" || status=$?
fi

if runs decode; then
  phase "3/3 decode: our kernels"
  "$build/bin/fa_bench" --decode --csv "$out/decode.csv" || status=$?
fi
if runs decode && [ $have_torch = 1 ]; then
  phase "3/3 decode: PyTorch SDPA"
  python3 tools/bench_torch.py --pass decode --backends flash_bf16,cudnn_bf16,flash_fp16,cudnn_fp16 \
    --csv "$out/torch_decode.csv" || status=$?
  python3 tools/decode_report.py --ours "$out/decode.csv" --torch "$out/torch_decode.csv" > "$out/decode.md" || status=$?
fi

phase "report"
if [ -f "$out/fa_bench.csv" ]; then
  python3 tools/bench_report.py --ours "$out/fa_bench.csv" --torch "$out/torch.csv" --ceilings "$out/ceilings.csv" \
    --backward "$out/backward.csv" --torch-backward "$out/torch_backward.csv" --decode "$out/decode.csv" \
    --torch-decode "$out/torch_decode.csv" --out "$out/report.md" || status=$?
  cat "$out/report.md"
  # PNG plots: the chapters' progression and a roofline (needs matplotlib; say so if it is missing).
  plots=(tools/bench_plots.py --ours "$out/fa_bench.csv" --torch "$out/torch.csv" --ceilings "$out/ceilings.csv"
         --out-dir "$out")
  if python3 -c 'import matplotlib' 2>/dev/null; then
    python3 "${plots[@]}" || status=$?
  else
    echo "bench: matplotlib not importable; for the plots run elsewhere: python3 ${plots[*]}"
  fi
fi
[ -f "$out/decode.md" ] && cat "$out/decode.md"
echo "bench: done in $((SECONDS - start)) s, exit $status; files in $out/"
exit $status
