#!/usr/bin/env python3
"""make bench's plots: the chapters' progression and a roofline, as PNG (matplotlib).

Usage: python3 tools/bench_plots.py --ours fa_bench.csv [--torch torch.csv] [--ceilings ceilings.csv]
                                    --out-dir DIR [--title "..."]

progression.png  TFLOP/s against sequence length, one panel per (head_dim, causal): a solid line
                 per chapter (its best variant over the sweep: the highest geometric mean of
                 TFLOP/s over the points it ran and passed), PyTorch SDPA's FLASH and cuDNN
                 backends (bf16) dashed.
roofline.png     every kernel at one sweep point (head_dim 128, not causal, seq 4096 or the
                 nearest it ran), placed by arithmetic intensity: FLOP / device-memory bytes. The
                 bytes are the kernel's own count where its note gives one (chapter 01-03's S and
                 P passes, chapter 04's tile traffic), else the minimum (Q, K, V read, O and LSE
                 written: fa_bench's GB/s column); under the roofs measured on the same GPU
                 (device copy; cuBLAS fp32 and bf16 GEMM).
Points whose oracle check failed are left out. Without matplotlib: a one-line message, exit 2.
"""
import argparse
import csv
import math
import os
import re
import sys
from collections import defaultdict

from report_io import is_step_kernel


def read(path):
    if not path or not os.path.exists(path):
        return []
    with open(path) as f:
        return list(csv.DictReader(f))


def ok(row):
    return row.get("status", "ok") == "ok" and row.get("tflops") not in ("", None)


def device_bytes(row):
    """Device-memory bytes of one launch: the note's count if it has one, else the minimum."""
    note = row.get("note", "")
    m = re.search(r"= ([\d.]+) GiB, vs ([\d.]+) GiB", note)
    if m:
        return (float(m.group(1)) + float(m.group(2))) * 2**30
    m = re.search(r"([\d.]+) GiB through device memory", note)
    if m:
        return float(m.group(1)) * 2**30
    return float(row["gbps"]) * 1e9 * float(row["time_ms"]) / 1e3


def best_variants(ours):
    """{chapter: kernel name} with the highest geometric-mean TFLOP/s over its passing points."""
    by_kernel = defaultdict(list)
    for r in ours:
        if ok(r) and r["device"] == "gpu" and not is_step_kernel(r["kernel"]):
            by_kernel[(int(r["chapter"]), r["kernel"])].append(float(r["tflops"]))
    best = {}
    for (chapter, name), values in by_kernel.items():
        score = (math.exp(sum(math.log(max(v, 1e-9)) for v in values) / len(values)), len(values))
        if chapter not in best or score > best[chapter][0]:
            best[chapter] = (score, name)
    return {c: name for c, (_, name) in sorted(best.items())}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ours", required=True)
    parser.add_argument("--torch", default="")
    parser.add_argument("--ceilings", default="")
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--title", default="")
    args = parser.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench_plots: matplotlib is not importable here (Debian: python3-matplotlib); no plots", file=sys.stderr)
        return 2
    ours = [r for r in read(args.ours) if ok(r)]
    if not ours:
        print(f"bench_plots: no results in {args.ours}", file=sys.stderr)
        return 1
    torch = [r for r in read(args.torch) if r.get("status") == "ok"]
    ceilings = {r["ceiling"]: float(r["value"]) for r in read(args.ceilings)}
    os.makedirs(args.out_dir, exist_ok=True)
    best = best_variants(ours)
    colors = plt.get_cmap("tab10")

    # ---- progression -----------------------------------------------------------------------
    panels = sorted({(int(r["head_dim"]), int(r["causal"])) for r in ours})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.4), sharey=True, squeeze=False)
    for ax, (dim, causal) in zip(axes[0], panels):
        for chapter, name in best.items():
            pts = sorted((int(r["seq_q"]), float(r["tflops"])) for r in ours
                         if r["kernel"] == name and int(r["head_dim"]) == dim and int(r["causal"]) == causal)
            if pts:
                ax.plot(*zip(*pts), marker="o", ms=3, color=colors(chapter - 1), label=f"ch{chapter:02d} {name}")
        for backend, style in (("flash", "--"), ("cudnn", ":")):
            pts = sorted((int(r["seq"]), float(r["tflops"])) for r in torch
                         if r["backend"] == backend and r["dtype"] == "bf16" and int(r["head_dim"]) == dim
                         and int(r["causal"]) == causal)
            if pts:
                ax.plot(*zip(*pts), style, color="black", label=f"PyTorch SDPA {backend} bf16")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"head_dim {dim}, {'causal' if causal else 'not causal'}", fontsize=10)
        ax.set_xlabel("sequence length")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("TFLOP/s")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle(args.title or "Forward attention: each chapter's best variant", fontsize=11)
    fig.tight_layout(rect=(0, 0.12, 1, 0.95))
    fig.savefig(os.path.join(args.out_dir, "progression.png"), dpi=110)
    plt.close(fig)

    # ---- roofline --------------------------------------------------------------------------
    fig, ax = plt.subplots(figsize=(8.5, 5.5))
    chosen = {}
    for r in ours:
        if (int(r["head_dim"]) != 128 or int(r["causal"]) != 0 or r["device"] != "gpu" or not r.get("gbps")
                or is_step_kernel(r["kernel"])):
            continue
        seq = int(r["seq_q"])
        have = chosen.get(r["kernel"])
        if have is None or abs(math.log2(seq / 4096)) < abs(math.log2(int(have["seq_q"]) / 4096)):
            chosen[r["kernel"]] = r
    xs = []
    for name, r in sorted(chosen.items()):
        tflops, bytes_moved = float(r["tflops"]), device_bytes(r)
        if bytes_moved <= 0:
            continue
        intensity = tflops * 1e12 * float(r["time_ms"]) / 1e3 / bytes_moved
        xs.append(intensity)
        chapter = int(r["chapter"])
        ax.scatter(intensity, tflops, color=colors(chapter - 1), s=22, zorder=3)
        ax.annotate(name, (intensity, tflops), fontsize=6.5, xytext=(3, 2), textcoords="offset points")
    if xs:
        lo, hi = min(xs) / 4, max(xs) * 4
        copy = ceilings.get("copy")
        grid = [lo * (hi / lo) ** (i / 100) for i in range(101)]
        for key, label, style in (("gemm_bf16", "cuBLAS bf16 GEMM", "-"), ("gemm_fp32", "cuBLAS fp32 SGEMM", "--")):
            if key in ceilings and copy:
                roof = [min(ceilings[key], x * copy / 1000.0) for x in grid]
                ax.plot(grid, roof, style, color="grey", label=f"roof: {label} {ceilings[key]:.0f} TFLOP/s, "
                                                                f"copy {copy / 1000:.2f} TB/s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte of device memory moved)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title((args.title + ": " if args.title else "") + "roofline, head_dim 128, not causal, seq 4096", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out_dir, "roofline.png"), dpi=110)
    plt.close(fig)
    print(f"bench_plots: progression.png and roofline.png in {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
