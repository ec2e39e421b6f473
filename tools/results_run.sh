#!/usr/bin/env bash
# Every file of a docs/results/<gpu>/ run, made on one GPU machine (docs/results/h200/README.md
# says which page reads which file). A run is too long for one sitting of some lending services,
# so it comes in parts; each part writes its files into OUT and adds its command to OUT/commands.txt,
# and a part may run in a later call on the same machine:
#
#   bash tools/results_run.sh BUILD OUT PART ...        e.g. bash tools/results_run.sh build /tmp/run forward
#
# Parts, in the order a full run takes them (all: every one):
#   tour      make run's chapter tour                                     tour.csv, tour.txt
#   forward   make bench's forward phase                                  fa_bench.csv, ceilings.csv, torch.csv
#   backward  make bench's backward phase                                 backward.csv, torch_backward.csv
#   decode    make bench's decode phase, then its report and plots        decode.csv, torch_decode.csv, decode.md,
#                                                                         report.md, progression.png, roofline.png
#   features  chapter 09 against FlexAttention and SDPA                   fa_features.csv, flex_features.csv, features.csv
#   features_backward  the same for the backward                         fa_features_backward.csv,
#                                                                         flex_features_backward.csv, features_backward.csv
#   head_dims chapter 06 at head_dim 64-256 against SDPA (64, 128: forward's) head_dims.csv
#   exp2      MUFU.EX2 and exp2_fma against 2^x (chapter 06's variant 8)   exp2_accuracy.csv
#   dims      chapter 07's wgmma backward at head_dim 96 and 256          backward_d96.csv, backward_d256.csv (+ torch_)
#   fused     chapter 07's variants 4-6 at head_dim 64, 96, 128 (64, 128:  backward_fused.csv, torch_backward_fused.csv
#             backward's)
#   bulk      variants 4-6 against SDPA, from backward's files            backward_bulk.csv, torch_backward_bulk.csv,
#                                                                         fused_backward.csv
#   memory    fused against materialized attention (chapter 04)          memory.csv
#   fp32      chapter 04's fp32 table, from forward's files                fp32.csv
#   python    the pytest suite's closeness to flash-attention's rule      python_errors.csv
#   overhead  a call from PyTorch against SDPA FLASH, per call             python_overhead.csv
#   train     examples/train_gpt.py, then with --features gemma2           train_runs.csv, train_losses.csv,
#                                                                         train_loss_curves.png (train_gemma2_*)
#   stamp     run.txt: the GPU, driver, CUDA, PyTorch, date and the parts' commands (FA_RUN_NOTE: a
#             line on how the parts were spread over the machine's GPUs, if they were)
# FA_BUDGET_MS (default 150): the timing budget per point of make bench's phases. Each part says
# how long it took. To replace the committed run: copy OUT's files into docs/results/<gpu>/, then
# python3 tools/tables.py, and commit the files with the regenerated pages.
set -euo pipefail
build=${1:?usage: results_run.sh BUILD OUT PART ...}
out=${2:?usage: results_run.sh BUILD OUT PART ...}
shift 2
parts=("$@")
all=(tour forward backward decode features features_backward head_dims exp2 dims fused bulk memory fp32 python overhead
  train stamp)
[ ${#parts[@]} -eq 0 ] && { echo "results_run: name the parts to run (or all): ${all[*]}" >&2; exit 2; }
[ "${parts[*]}" = all ] && parts=("${all[@]}")
for p in "${parts[@]}"; do
  [[ " ${all[*]} " == *" $p "* ]] || { echo "results_run: unknown part '$p'; allowed: ${all[*]} or all" >&2; exit 2; }
done
budget=${FA_BUDGET_MS:-150}
bench="$build/bin/fa_bench"
[ -x "$bench" ] || { echo "results_run: $bench not found; run 'make build' first" >&2; exit 2; }
mkdir -p "$out"
log="$out/commands.txt"
# Each part's line names the GPU it ran on (its UUID), so run.txt shows the parts shared one machine.
gpu_id() { local d=${CUDA_VISIBLE_DEVICES:-0}; nvidia-smi -i "${d%%,*}" --query-gpu=uuid --format=csv,noheader 2>/dev/null | head -n 1; }
note() { echo "$1: $2 [$(gpu_id)]" >> "$log"; }

part() {
  local start=$SECONDS
  echo "==== results_run: $1"
  case $1 in
    tour)
      python3 tools/tour.py --build-dir "$build" --csv "$out/tour.csv" | tee "$out/tour.txt"
      note tour "make run (tools/tour.py --build-dir $build --csv tour.csv)" ;;
    forward|backward|decode)
      FA_PHASES=$1 FA_BUDGET_MS=$budget bash tools/bench.sh "$build"
      case $1 in
        forward) cp "$build"/bench/{fa_bench,ceilings,torch}.csv "$out/" ;;
        backward) cp "$build"/bench/{backward,torch_backward}.csv "$out/" ;;
        decode) cp "$build"/bench/{decode,torch_decode}.csv "$build"/bench/{decode,report}.md "$out/"
                cp "$build"/bench/{progression,roofline}.png "$out/" 2>/dev/null || true ;;
      esac
      note "$1" "make bench with FA_BUDGET_MS=$budget, FA_PHASES=$1" ;;
    features)
      need_forward features  # the same shapes without features: chapter 06's kernels in fa_bench.csv
      "$bench" --features --dims 128 --csv "$out/fa_features.csv"
      python3 tools/bench_flex.py --csv "$out/flex_features.csv"
      python3 tools/features_report.py "$out/fa_features.csv" "$out/flex_features.csv" --out "$out/features.csv" \
        --plain "$out/fa_bench.csv" \
        --line "$(line "build/bin/fa_bench --features --dims 128 and python3 tools/bench_flex.py in the same call, merged by tools/features_report.py (the plain columns: the forward part's fa_bench.csv)")"
      note features "fa_bench --features --dims 128; tools/bench_flex.py; tools/features_report.py" ;;
    exp2)
      "$build/bin/fa_exp2_accuracy" --csv "$out/exp2_accuracy.csv"
      note exp2 "build/bin/fa_exp2_accuracy --csv exp2_accuracy.csv" ;;
    features_backward)
      need_part backward features_backward backward.csv  # chapter 07's kernels at the same shapes
      "$bench" --features --backward --dims 128 --budget-ms "$budget" --csv "$out/fa_features_backward.csv"
      python3 tools/bench_flex.py --pass backward --budget-ms "$budget" --csv "$out/flex_features_backward.csv"
      python3 tools/features_report.py "$out/fa_features_backward.csv" "$out/flex_features_backward.csv" \
        --out "$out/features_backward.csv" --plain "$out/backward.csv" \
        --line "$(line "build/bin/fa_bench --features --backward --dims 128 and python3 tools/bench_flex.py --pass backward in the same call, merged by tools/features_report.py (the plain columns: the backward part's backward.csv)")"
      note features_backward "fa_bench --features --backward --dims 128; tools/bench_flex.py --pass backward; tools/features_report.py" ;;
    head_dims)
      # head_dim 64 and 128 are the forward part's points (fa_bench.csv, torch.csv): only 96 and 256
      # are measured here, so a point has one figure in the whole run.
      need_forward head_dims
      local k=ch05_tuned_bf16,ch06_pingpong_bf16,ch06_persistent_bf16,ch06_fp8
      "$bench" --dims 96,256 --kernels $k --budget-ms "$budget" --warmup 1 --csv "$out/hd_fa.csv"
      python3 tools/bench_torch.py --dims 96,256 --backends flash_bf16,cudnn_bf16 --budget-ms "$budget" \
        --csv "$out/hd_torch.csv"
      { cat "$out/fa_bench.csv"; tail -n +2 "$out/hd_fa.csv"; } > "$out/hd_fa_all.csv"
      { cat "$out/torch.csv"; tail -n +2 "$out/hd_torch.csv"; } > "$out/hd_torch_all.csv"
      python3 tools/head_dims_report.py "$out/hd_fa_all.csv" "$out/hd_torch_all.csv" --out "$out/head_dims.csv" \
        --line "$(line "make bench's forward phase at head_dim 64 and 128 (fa_bench.csv, torch.csv); build/bin/fa_bench --dims 96,256 --kernels $k --budget-ms $budget --warmup 1 and python3 tools/bench_torch.py --dims 96,256 --backends flash_bf16,cudnn_bf16 --budget-ms $budget in the same call; merged by tools/head_dims_report.py")"
      rm -f "$out"/hd_{fa,torch}{,_all}.csv
      note head_dims "forward's files at d 64, 128; fa_bench --dims 96,256 --kernels $k; tools/bench_torch.py --dims 96,256; tools/head_dims_report.py" ;;
    dims)
      for d in 96 256; do
        "$bench" --backward --dims $d --kernels ch07_wgmma_bf16 --budget-ms "$budget" --csv "$out/backward_d$d.csv"
        python3 tools/bench_torch.py --pass backward --dims $d --backends flash_bf16,cudnn_bf16 --budget-ms "$budget" \
          --csv "$out/torch_backward_d$d.csv"
      done
      note dims "fa_bench --backward --dims 96 (then 256) --kernels ch07_wgmma_bf16; tools/bench_torch.py --pass backward" ;;
    fused)
      # head_dim 64 and 128 are the backward part's points (backward.csv, torch_backward.csv): only
      # 96 is measured here, so a point has one figure in the whole run.
      need_part backward fused backward.csv torch_backward.csv
      "$bench" --backward --kernels ch07_wgmma_bf16,ch07_fused_bf16 --dims 96 --budget-ms "$budget" --warmup 1 \
        --csv "$out/bf_96.csv"
      python3 tools/bench_torch.py --pass backward --dims 96 --budget-ms "$budget" --backends flash_bf16,cudnn_bf16 \
        --csv "$out/tbf_96.csv"
      { head -n 1 "$out/backward.csv"; grep -E '^[0-9]+,ch07_(wgmma|fused)_bf16,' "$out/backward.csv"; tail -n +2 "$out/bf_96.csv"; } \
        > "$out/backward_fused.csv"
      { cat "$out/torch_backward.csv"; tail -n +2 "$out/tbf_96.csv"; } > "$out/torch_backward_fused.csv"
      rm -f "$out"/bf_96.csv "$out"/tbf_96.csv
      note fused "the backward part's ch07_wgmma_bf16 and ch07_fused_bf16 rows at d 64, 128; fa_bench --backward --kernels ch07_wgmma_bf16,ch07_fused_bf16 --dims 96; tools/bench_torch.py --pass backward --dims 96" ;;
    bulk)
      # Variants 4-6 against SDPA: the backward part's figures, not a second measurement.
      need_part backward bulk backward.csv torch_backward.csv
      { head -n 1 "$out/backward.csv"; grep -E '^[0-9]+,ch07_(wgmma|fused)' "$out/backward.csv"; } > "$out/backward_bulk.csv"
      cp "$out/torch_backward.csv" "$out/torch_backward_bulk.csv"
      python3 tools/fused_backward_report.py "$out/backward_bulk.csv" "$out/torch_backward_bulk.csv" \
        --out "$out/fused_backward.csv" \
        --line "$(line "make bench's backward phase (backward.csv, torch_backward.csv: the rows of ch07_wgmma and ch07_fused), merged by tools/fused_backward_report.py")"
      note bulk "the backward part's backward.csv and torch_backward.csv; tools/fused_backward_report.py" ;;
    memory)
      "$bench" --sweep memory --dims 64 --kernels ch01_naive,ch04_tuned,ch05_tuned_bf16 --budget-ms 100 --warmup 1 \
        --csv "$out/mem_fa.csv"
      python3 tools/bench_torch.py --sweep memory --dims 64 --backends math_fp32,efficient_fp32,math_bf16,flash_bf16 \
        --budget-ms 100 --csv "$out/mem_torch.csv"
      python3 tools/memory_report.py "$out/mem_fa.csv" "$out/mem_torch.csv" --out "$out/memory.csv" \
        --line "$(line "build/bin/fa_bench --sweep memory --dims 64 --kernels ch01_naive,ch04_tuned,ch05_tuned_bf16 --budget-ms 100 --warmup 1 and python3 tools/bench_torch.py --sweep memory --dims 64 --backends math_fp32,efficient_fp32,math_bf16,flash_bf16 --budget-ms 100 in the same call, merged by tools/memory_report.py")"
      rm -f "$out"/mem_{fa,torch}.csv
      note memory "fa_bench --sweep memory; tools/bench_torch.py --sweep memory; tools/memory_report.py" ;;
    fp32)
      # Chapter 04's fp32 comparison is the forward part's figures (fa_bench.csv, torch.csv, which
      # holds SDPA EFFICIENT in fp32), not a second measurement of the same points.
      need_forward fp32
      python3 tools/fp32_report.py "$out/fa_bench.csv" "$out/torch.csv" --out "$out/fp32.csv" \
        --line "$(line "make bench's forward phase (fa_bench.csv, torch.csv), merged by tools/fp32_report.py")"
      note fp32 "the forward part's fa_bench.csv and torch.csv; tools/fp32_report.py" ;;
    python)
      PYTHONPATH="$(abs "$build")/python" FA_BENCH="$(abs "$build")/bin/fa_bench" FA_RULE_CSV="$(abs "$out")/python_errors.csv" \
        python3 -m pytest -q tests/python/test_forward.py tests/python/test_backward.py tests/python/test_decode.py
      note python "FA_RULE_CSV=python_errors.csv pytest tests/python (test_forward, test_backward, test_decode)" ;;
    overhead)
      PYTHONPATH="$(abs "$build")/python" python3 tools/bench_python.py --csv "$out/python_overhead.csv"
      note overhead "tools/bench_python.py (a call from PyTorch against SDPA FLASH, wall time per call)" ;;
    train)
      PYTHONPATH="$build/python" python3 examples/train_gpt.py --out "$out"
      PYTHONPATH="$build/python" python3 examples/train_gpt.py --out "$out" --features gemma2
      note train "examples/train_gpt.py (its defaults), then the same with --features gemma2" ;;
    stamp)
      {
        echo "gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)"
        echo "driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1)"
        echo "cuda: $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
        echo "pytorch: $(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)"
        echo "date: $(date -u +%F)"
        echo "commands: \`bash tools/results_run.sh\` with FA_BUDGET_MS=$budget, every part from one build of one tree${FA_RUN_NOTE:+; $FA_RUN_NOTE}"
        [ -f "$log" ] && sed 's/^/  /' "$log"
      } > "$out/run.txt"
      cat "$out/run.txt" ;;
  esac
  echo "==== results_run: $1 done in $((SECONDS - start)) s"
}

abs() { (cd "$1" && pwd); }
# Parts that read the forward part's files (in OUT) instead of measuring the same points again.
need_part() {  # need_part PART WHO FILE...: WHO reads PART's files in OUT
  local part=$1 who=$2
  shift 2
  for f in "$@"; do
    [ -f "$out/$f" ] || { echo "results_run: $who reads the $part part's $f in $out; run $part first" >&2; exit 2; }
  done
}
need_forward() { need_part forward "$1" fa_bench.csv torch.csv; }
# A report's first line: the GPU, driver, CUDA, PyTorch and date of this machine, then the commands.
line() {
  local gpu driver cuda torch
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1)
  cuda=$(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
  torch=$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)
  echo "$gpu, driver $driver, CUDA $cuda, PyTorch $torch, $(date -u +%F): $1"
}

for p in "${parts[@]}"; do part "$p"; done
