#!/usr/bin/env python3
"""Joins fa_bench --decode's CSV and bench_torch.py --pass decode's CSV into one markdown table.

One row per (dtype, head_dim, batch, context): effective K/V bandwidth (K and V bytes read / time,
GB/s) of chapter 08's variants 1 and 2 and of PyTorch SDPA's FLASH and cuDNN backends on the same
K/V stored contiguously (the faster of its two GQA forms), and the ratios of our best to each.
"""
import argparse
import csv
import sys


def read(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ours", required=True, help="fa_bench --decode --csv output")
    parser.add_argument("--torch", required=True, help="bench_torch.py --pass decode --csv output")
    parser.add_argument("--copy-gbps", type=float, default=0, help="the device copy ceiling, for a %% column")
    args = parser.parse_args()

    ours = {}
    for r in read(args.ours):
        if r["status"] != "ok":
            continue
        variant = "v2" if "split_kv" in r["kernel"] else "v1"
        ours[(r["dtype"], int(r["head_dim"]), int(r["num_seqs"]), int(r["context"]), variant)] = float(r["kv_gbps"])
    torch = {}
    for r in read(args.torch):
        if r["status"] != "ok":
            continue
        key = (r["dtype"], int(r["head_dim"]), int(r["batch"]), int(r["context"]), r["backend"])
        torch[key] = max(torch.get(key, 0.0), float(r["kv_gbps"]))

    points = sorted({k[:4] for k in ours}, key=lambda k: (k[0], -k[1], -k[2] * k[3], k[2]))
    head = "| dtype | d | batch x context | v1 GB/s | v2 GB/s | v2/v1 | flash GB/s | cuDNN GB/s | best/flash | best/cuDNN |"
    if args.copy_gbps:
        head += " best/copy |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for dtype, dim, batch, context in points:
        v1 = ours.get((dtype, dim, batch, context, "v1"))
        v2 = ours.get((dtype, dim, batch, context, "v2"))
        best = max(x for x in (v1, v2) if x is not None)
        flash = torch.get((dtype, dim, batch, context, "flash"))
        cudnn = torch.get((dtype, dim, batch, context, "cudnn"))

        def f(x, fmt="{:.0f}"):
            return "-" if x is None else fmt.format(x)

        row = (f"| {dtype} | {dim} | {batch} x {context} | {f(v1)} | {f(v2)} | {f(v2 / v1 if v1 and v2 else None, '{:.2f}')} | "
               f"{f(flash)} | {f(cudnn)} | {f(best / flash if flash else None, '{:.2f}')} | "
               f"{f(best / cudnn if cudnn else None, '{:.2f}')} |")
        if args.copy_gbps:
            row += f" {best / args.copy_gbps:.2f} |"
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
