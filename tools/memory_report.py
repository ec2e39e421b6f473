#!/usr/bin/env python3
"""The memory table: fused against materialized attention, time and peak device memory, seq 128 to 16k.

    python3 tools/memory_report.py FA_CSV TORCH_CSV --out docs/results/h200/memory.csv \\
        --line "NVIDIA H200, driver ..., CUDA ..., PyTorch ..., 2026-11-28: the commands"

FA_CSV: `fa_bench --sweep memory --dims 64 --kernels ch01_naive,ch04_tuned,ch05_tuned_bf16`;
TORCH_CSV: `tools/bench_torch.py --sweep memory --dims 64 --backends math_fp32,efficient_fp32,
math_bf16,flash_bf16`, in the same call. One row per (dtype, seq), without the causal mask: in fp32
chapter 01's kernel (S and P in device memory) against chapter 04's fused `tuned`, and
PyTorch's MATH (unfused) and EFFICIENT (fused) backends; in bf16 PyTorch's MATH against chapter
05's `tuned` and PyTorch's FLASH. Each with its time (ms) and peak device memory (MiB, the
`device_mib` both benchmarks report), and the speed-up and memory saving of the fused kernel
over the materialized one: the FlashAttention-1 paper's headline. The first line of the output
is the '# ' line saying where it was measured (tools/tables.py needs it).
"""
import csv
import sys

from report_io import report_args, report_writer

FP32 = ("ch01_naive", "ch04_tuned")
BF16 = ("ch05_tuned_bf16",)


def number(text):
    return float(text) if text not in ("", None) else None


def main():
    args = report_args(__doc__)
    ours, torch = {}, {}
    for r in csv.DictReader(open(args.fa_csv, newline="")):
        if r["kernel"] in FP32 + BF16 and r["causal"] == "0" and r["status"] == "ok":
            ours[r["kernel"], int(r["seq_q"])] = (number(r["time_ms"]), number(r["device_mib"]))
    for r in csv.DictReader(open(args.torch_csv, newline="")):
        if r["causal"] == "0":
            key = (f"{r['backend']}_{r['dtype']}", int(r["seq"]))
            torch[key] = (number(r["time_ms"]), number(r["device_mib"])) if r["status"] == "ok" else (None, None)
    seqs = sorted({seq for _, seq in ours})
    if not seqs:
        sys.exit(f"memory_report: no row of {', '.join(FP32 + BF16)} in {args.fa_csv}")

    def cells(table, name, seq):
        ms, mib = table.get((name, seq), (None, None))
        return [f"{ms:.4g}" if ms else "", f"{mib:.1f}" if mib else ""]

    def over(a, b):
        return f"{a / b:.2f}" if a and b else ""

    with report_writer(args.out, args.line) as w:
        w.writerow(["dtype", "seq", "batch", "unfused", "unfused_ms", "unfused_mib", "fused", "fused_ms", "fused_mib",
                    "torch_math_ms", "torch_math_mib", "torch_fused", "torch_fused_ms", "torch_fused_mib", "speedup",
                    "memory_saving", "speedup_vs_math", "memory_saving_vs_math"])
        for dtype, unfused, fused, math, torch_fused in (("fp32", "ch01_naive", "ch04_tuned", "math_fp32",
                                                          "efficient_fp32"),
                                                         ("bf16", "", "ch05_tuned_bf16", "math_bf16", "flash_bf16")):
            for seq in seqs:
                u = ours.get((unfused, seq), (None, None))
                fu = ours.get((fused, seq), (None, None))
                m = torch.get((math, seq), (None, None))
                w.writerow([dtype, seq, 16384 // seq, unfused, *cells(ours, unfused, seq), fused, *cells(ours, fused, seq),
                            *cells(torch, math, seq), torch_fused, *cells(torch, torch_fused, seq),
                            over(u[0], fu[0]), over(u[1], fu[1]), over(m[0], fu[0]), over(m[1], fu[1])])


if __name__ == "__main__":
    main()
