#!/usr/bin/env python3
"""Chapter 04's fp32 table: the tuned fused kernel against chapters 01-03 and PyTorch's fp32 EFFICIENT.

    python3 tools/fp32_report.py FA_CSV TORCH_CSV --out docs/results/h200/fp32.csv \\
        --line "NVIDIA H200, driver ..., CUDA ..., PyTorch ..., 2026-11-28: the commands"

FA_CSV: `fa_bench --kernels ch01_tiled,ch02_block,ch03_online,ch04_registers,ch04_tuned` (the
standard sweep); TORCH_CSV: `tools/bench_torch.py --backends efficient_fp32` on the same sweep, in
the same call. One row per (head_dim, causal, seq): each kernel's TFLOP/s, the best of chapters
01-03, SDPA EFFICIENT's, and `tuned` over the best of 01-03, over `registers` and over EFFICIENT.
The first line of the output is the '# ' line saying where it was measured (tools/tables.py
needs it).
"""
import sys

from report_io import ratio, report_args, report_writer, sdpa_tflops_by_point, tflops_by_point

EARLIER = ("ch01_tiled", "ch02_block", "ch03_online")
OURS = EARLIER + ("ch04_registers", "ch04_tuned")


def main():
    args = report_args(__doc__)
    points, ours = tflops_by_point(args.fa_csv, OURS)
    efficient = sdpa_tflops_by_point(args.torch_csv, "fp32", ("efficient",))
    if not any(k == "ch04_tuned" for k, _ in ours):
        sys.exit(f"fp32_report: no row of ch04_tuned in {args.fa_csv}")

    with report_writer(args.out, args.line) as w:
        w.writerow(["head_dim", "causal", "seq", "batch", "heads", *[k.split("_", 1)[1] for k in OURS],
                    "best_01_03", "efficient", "tuned_over_best_01_03", "tuned_over_registers",
                    "tuned_over_efficient"])
        for key in sorted(points):
            d, causal, seq = key
            values = [ours.get((k, key)) for k in OURS]
            earlier = [v for v in values[:len(EARLIER)] if v is not None]
            best = max(earlier) if earlier else None
            tuned, registers, eff = ours.get(("ch04_tuned", key)), ours.get(("ch04_registers", key)), efficient.get(("efficient", key))
            w.writerow([d, causal, seq, 16384 // seq, 2048 // d, *[f"{v:.1f}" if v is not None else "" for v in values],
                        f"{best:.1f}" if best is not None else "", f"{eff:.1f}" if eff is not None else "",
                        ratio(tuned, best), ratio(tuned, registers), ratio(tuned, eff)])


if __name__ == "__main__":
    main()
