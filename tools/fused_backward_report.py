#!/usr/bin/env python3
"""Chapter 07's fused-backward table: variants 4, 5 and 6 against PyTorch SDPA's FLASH and cuDNN backwards.

    python3 tools/fused_backward_report.py FA_CSV TORCH_CSV --out docs/results/h200/fused_backward.csv \\
        --line "NVIDIA H200, driver ..., CUDA ..., PyTorch ..., 2026-11-28: the commands"

FA_CSV: `fa_bench --backward --kernels ch07_wgmma_bf16,ch07_fused` (the standard sweep, head_dim
64 and 128); TORCH_CSV: `tools/bench_torch.py --pass backward --backends flash_bf16,cudnn_bf16` on
the same sweep, in the same call. One row per (head_dim, causal, seq): each variant's TFLOP/s,
SDPA's two, and variant 6 over variant 5, variant 4, FLASH and cuDNN. The first line of the output
is the '# ' line saying where it was measured (tools/tables.py needs it).
"""
import sys

from report_io import ratio, report_args, report_writer, sdpa_tflops_by_point, tflops_by_point

OURS = ("ch07_wgmma_bf16", "ch07_fused_bf16", "ch07_fused_bulk_bf16")
BACKENDS = ("flash", "cudnn")


def main():
    args = report_args(__doc__)
    points, ours = tflops_by_point(args.fa_csv, OURS)
    torch = sdpa_tflops_by_point(args.torch_csv, "bf16", BACKENDS)
    if not any(k == "ch07_fused_bulk_bf16" for k, _ in ours):
        sys.exit(f"fused_backward_report: no row of ch07_fused_bulk_bf16 in {args.fa_csv}")

    with report_writer(args.out, args.line) as w:
        w.writerow(["head_dim", "causal", "seq", "batch", "heads", "wgmma", "fused", "fused_bulk", *BACKENDS,
                    "bulk_over_fused", "bulk_over_wgmma", "bulk_over_flash", "bulk_over_cudnn"])
        for key in sorted(points):
            d, causal, seq = key
            wgmma, fused, bulk = (ours.get((k, key)) for k in OURS)
            flash, cudnn = (torch.get((b, key)) for b in BACKENDS)
            w.writerow([d, causal, seq, 16384 // seq, 2048 // d,
                        *[f"{v:.1f}" if v is not None else "" for v in (wgmma, fused, bulk, flash, cudnn)],
                        ratio(bulk, fused), ratio(bulk, wgmma), ratio(bulk, flash), ratio(bulk, cudnn)])


if __name__ == "__main__":
    main()
