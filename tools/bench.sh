#!/usr/bin/env bash
# make bench: fa_bench over a sweep (FA_SWEEP, default standard) with the measured ceilings,
# PyTorch SDPA on the same sweep when `import torch` works, then one report joining both.
# Then chapter 08's decode kernels (fa_bench --decode) and SDPA's decode on the same K/V.
# Output: $BUILD/bench/{fa_bench.csv, ceilings.csv, torch.csv, report.md, progression.png, roofline.png,
#         decode.csv, torch_decode.csv, decode.md}.
set -euo pipefail
build=${1:-build}
sweep=${FA_SWEEP:-standard}
out="$build/bench"
mkdir -p "$out"
rm -f "$out/fa_bench.csv" "$out/ceilings.csv" "$out/torch.csv" "$out/report.md" "$out/decode.csv" "$out/torch_decode.csv" "$out/decode.md"
status=0
"$build/bin/fa_bench" --sweep "$sweep" --csv "$out/fa_bench.csv" --ceilings "$out/ceilings.csv" ${FA_BENCH_ARGS:-} || status=$?
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  python3 tools/bench_torch.py --sweep "$sweep" --csv "$out/torch.csv" || status=$?
else
  echo "bench: PyTorch with CUDA not importable here; skipping the SDPA comparison"
fi
# Chapter 08's decode kernels: K/V bandwidth, and SDPA on the same K/V stored contiguously.
"$build/bin/fa_bench" --decode --csv "$out/decode.csv" || status=$?
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  python3 tools/bench_torch.py --pass decode --backends flash_bf16,cudnn_bf16,flash_fp16,cudnn_fp16 \
    --csv "$out/torch_decode.csv" || status=$?
  python3 tools/decode_report.py --ours "$out/decode.csv" --torch "$out/torch_decode.csv" > "$out/decode.md" || status=$?
fi
if [ -f "$out/fa_bench.csv" ]; then
  python3 tools/bench_report.py --ours "$out/fa_bench.csv" --torch "$out/torch.csv" --ceilings "$out/ceilings.csv" \
    --out "$out/report.md"
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
exit $status
