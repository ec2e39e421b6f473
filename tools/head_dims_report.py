#!/usr/bin/env python3
"""The head_dim table: chapters 05 and 06 against PyTorch SDPA at head_dim 64, 96, 128 and 256.

    python3 tools/head_dims_report.py FA_CSV TORCH_CSV --out docs/results/h200/head_dims.csv \\
        --line "NVIDIA H200, driver ..., CUDA ..., PyTorch ..., 2026-11-28: the commands"

FA_CSV: `fa_bench --dims 64,96,128,256 --kernels
ch05_tuned_bf16,ch06_pingpong_bf16,ch06_persistent_bf16,ch06_fp8`;
TORCH_CSV: `tools/bench_torch.py --dims 64,96,128,256 --backends flash_bf16,cudnn_bf16` on the same
sweep. One row per (head_dim, causal, seq): the kernels' TFLOP/s (FP8 where it runs: 64, 128 and
256), SDPA's FLASH and cuDNN backends', and the ratios of chapter 06's bf16 (variants 4 and 7)
and FP8 kernels to cuDNN's. The first line of the output is the '# ' line saying
where it was measured (tools/tables.py needs it).
"""
import sys

from report_io import ratio, report_args, report_writer, sdpa_tflops_by_point, tflops_by_point

OURS = ("ch05_tuned_bf16", "ch06_pingpong_bf16", "ch06_persistent_bf16", "ch06_fp8")


def main():
    args = report_args(__doc__)
    points, ours = tflops_by_point(args.fa_csv, OURS)
    torch = sdpa_tflops_by_point(args.torch_csv, "bf16", ("flash", "cudnn"))
    if not points:
        sys.exit(f"head_dims_report: no row of {', '.join(OURS)} in {args.fa_csv}")

    def value(table, name, key):
        x = table.get((name, key))
        return f"{x:.1f}" if x is not None else ""

    with report_writer(args.out, args.line) as w:
        w.writerow(["head_dim", "causal", "seq", "batch", "heads", "tuned_tflops", "pingpong_tflops",
                    "persistent_tflops", "fp8_tflops", "flash_tflops", "cudnn_tflops", "pingpong_over_flash",
                    "pingpong_over_cudnn", "persistent_over_cudnn", "fp8_over_cudnn"])
        for key in sorted(points):
            d, causal, seq = key
            ping, fp8 = ours.get(("ch06_pingpong_bf16", key)), ours.get(("ch06_fp8", key))
            persistent, cudnn = ours.get(("ch06_persistent_bf16", key)), torch.get(("cudnn", key))
            w.writerow([d, causal, seq, 16384 // seq, 2048 // d, value(ours, "ch05_tuned_bf16", key),
                        value(ours, "ch06_pingpong_bf16", key), value(ours, "ch06_persistent_bf16", key),
                        value(ours, "ch06_fp8", key), value(torch, "flash", key), value(torch, "cudnn", key),
                        ratio(ping, torch.get(("flash", key))), ratio(ping, cudnn), ratio(persistent, cudnn),
                        ratio(fp8, cudnn)])


if __name__ == "__main__":
    main()
