#!/usr/bin/env python3
"""Joins fa_bench's CSV, the measured ceilings and PyTorch SDPA's CSV into one markdown report.

Tables: (1) TFLOP/s of every kernel and every PyTorch backend per sweep point; (2) each
chapter's best kernel vs the chapter before it and vs PyTorch (same dtype where one exists: fp32
chapters against SDPA's fp32 EFFICIENT and MATH backends; every chapter also against FLASH bf16,
the speed the tutorial is working towards); (2b) the fastest 16-bit kernel against SDPA's bf16
FLASH and cuDNN, FP8 apart; (3) the ceilings, with each chapter's best fraction;
(4) the peak device memory of every forward call without the mask, and with --decode of every
decode step; (5) with --backward, chapter 07's backward kernels against SDPA's FLASH and cuDNN
backward.
"""
import argparse
import csv
import os
import sys
from collections import defaultdict

from report_io import is_step_kernel


def read(path):
    if not path or not os.path.exists(path):
        return []
    with open(path) as f:
        return list(csv.DictReader(f))


def point_key(seq, dim, causal):
    return (int(dim), int(causal), int(seq))


def fmt(x, digits=1):
    return "-" if x is None else f"{x:.{digits}f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ours", required=True)
    parser.add_argument("--torch", default="")
    parser.add_argument("--ceilings", default="")
    parser.add_argument("--out", required=True)
    parser.add_argument("--note", default="", help="a paragraph printed under the title (where the numbers come from)")
    parser.add_argument("--backward", default="", help="fa_bench --backward's CSV")
    parser.add_argument("--torch-backward", default="", help="bench_torch.py --pass backward's CSV")
    parser.add_argument("--decode", default="", help="fa_bench --decode's CSV (for its peak device memory)")
    parser.add_argument("--torch-decode", default="", help="bench_torch.py --pass decode's CSV")
    args = parser.parse_args()

    ours = [r for r in read(args.ours) if r["tflops"]]
    torch_rows = [r for r in read(args.torch) if r["status"] == "ok"]
    ceilings = {r["ceiling"]: float(r["value"]) for r in read(args.ceilings)}

    kernels = []
    for r in ours:
        if r["kernel"] not in kernels:
            kernels.append(r["kernel"])
    backends = []
    for r in torch_rows:
        label = f"torch {r['backend']} {r['dtype']}"
        if label not in backends:
            backends.append(label)

    tflops = defaultdict(dict)  # point -> column -> TFLOP/s
    chapter_of = {}
    gbps = {}
    for r in ours:
        key = point_key(r["seq_q"], r["head_dim"], r["causal"])
        tflops[key][r["kernel"]] = float(r["tflops"])
        gbps[(key, r["kernel"])] = float(r["gbps"])
        chapter_of[r["kernel"]] = int(r["chapter"])
        if r["status"] != "ok":
            tflops[key][r["kernel"] + "!"] = r["status"]
    for r in torch_rows:
        key = point_key(r["seq"], r["head_dim"], r["causal"])
        tflops[key][f"torch {r['backend']} {r['dtype']}"] = float(r["tflops"])

    lines = ["# Benchmark report", ""]
    if args.note:
        lines += [args.note, ""]
    lines.append("Forward TFLOP/s (4·B·H·N²·d, halved when causal) on the standard sweep: 16k tokens, hidden 2048 "
                 "(batch = 16384/seq, heads = 2048/d). A `!` marks a point whose oracle check did not pass.")
    lines.append("")
    cols = kernels + backends
    lines.append("| d | causal | seq | " + " | ".join(cols) + " |")
    lines.append("|---|---|---|" + "---|" * len(cols))
    for key in sorted(tflops):
        cells = []
        for c in cols:
            v = tflops[key].get(c)
            mark = "!" if (c + "!") in tflops[key] else ""
            cells.append(fmt(v, 2 if v is not None and v < 10 else 1) + mark)
        lines.append(f"| {key[0]} | {'yes' if key[1] else 'no'} | {key[2]} | " + " | ".join(cells) + " |")
    lines.append("")

    # Best kernel per chapter at each point, and the ratios.
    chapters = sorted(set(chapter_of.values()))
    best = defaultdict(dict)  # point -> chapter -> (tflops, kernel)
    for key, row in tflops.items():
        for k in kernels:
            if k in row and (k + "!") not in row and not is_step_kernel(k):
                ch = chapter_of[k]
                if ch not in best[key] or row[k] > best[key][ch][0]:
                    best[key][ch] = (row[k], k)
    ref_cols = [c for c in ("torch efficient fp32", "torch math fp32", "torch flash bf16", "torch cudnn bf16") if c in backends]
    lines.append("Each chapter's best kernel: speed-up over the previous chapter's best, and ratio to PyTorch SDPA "
                 "(> 1 means ours is faster). Chapter 06's best can be an FP8 kernel, whose ratios to the bf16 "
                 "backends are not like for like; the table after this one compares 16-bit kernels only.")
    lines.append("")
    header = ["d", "causal", "seq"]
    for ch in chapters:
        header += [f"ch{ch:02d} best", f"ch{ch:02d} TFLOP/s"]
        if ch != chapters[0]:
            header.append(f"ch{ch:02d}/ch{ch - 1:02d}" if (ch - 1) in chapters else f"ch{ch:02d}/prev")
        header += [f"ch{ch:02d}/{c.replace('torch ', '')}" for c in ref_cols]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    for key in sorted(best):
        cells = [str(key[0]), "yes" if key[1] else "no", str(key[2])]
        prev = None
        for ch in chapters:
            entry = best[key].get(ch)
            cells += [entry[1] if entry else "-", fmt(entry[0], 2) if entry else "-"]
            if ch != chapters[0]:
                cells.append(f"{entry[0] / prev:.2f}x" if entry and prev else "-")
            for c in ref_cols:
                t = tflops[key].get(c)
                cells.append(f"{entry[0] / t:.3f}" if entry and t else "-")
            prev = entry[0] if entry else None
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines += equal_precision_section(ours, torch_rows)

    if ceilings:
        lines.append("Measured ceilings on this GPU, and the best fraction of each any chapter reached on the sweep:")
        lines.append("")
        lines.append("| ceiling | value | best kernel | fraction |")
        lines.append("|---|---|---|---|")
        if "copy" in ceilings:
            top = max(((v, k) for (p, k), v in gbps.items()), default=None)
            lines.append(f"| device copy (read + write) | {ceilings['copy']:.0f} GB/s | "
                         f"{top[1] if top else '-'} (min bytes/time) | {top[0] / ceilings['copy']:.3f} |" if top else
                         f"| device copy | {ceilings['copy']:.0f} GB/s | - | - |")
        for name, label in (("gemm_fp32", "fp32 GEMM (FMA units)"), ("gemm_bf16", "bf16 GEMM (tensor cores)")):
            if name in ceilings:
                dtype = "fp32" if name == "gemm_fp32" else "bf16"
                # FP8 kernels write bf16 but multiply in e4m3, at twice the bf16 tensor-core rate:
                # measured against the bf16 GEMM they would read above 1.
                cands = [(v, k) for row in tflops.values() for k, v in row.items()
                         if k in chapter_of and isinstance(v, float) and "fp8" not in k and
                         any(r["kernel"] == k and r["dtype"] == dtype for r in ours)]
                top = max(cands, default=None)
                lines.append(f"| {label} | {ceilings[name]:.1f} TFLOP/s | {top[1] if top else '-'} | "
                             f"{(top[0] / ceilings[name]) if top else 0:.3f} |")
        lines.append("")

    lines += memory_section(ours, torch_rows)
    lines += decode_memory_section(read(args.decode), read(args.torch_decode))
    lines += backward_section(read(args.backward), read(args.torch_backward))

    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


def equal_precision_section(ours, torch_rows):
    """The fastest 16-bit kernel of any chapter against SDPA's bf16 FLASH and cuDNN forward at each
    point, with the fastest FP8 kernel beside it (e4m3 products run at twice the bf16 rate)."""
    sdpa = {(point_key(r["seq"], r["head_dim"], r["causal"]), r["backend"]): float(r["tflops"])
            for r in torch_rows if r["dtype"] == "bf16" and r["backend"] in ("flash", "cudnn")}
    if not sdpa:
        return []
    best16, best8 = {}, {}
    for r in ours:
        if r["status"] != "ok" or r["dtype"] not in ("bf16", "fp16"):
            continue
        key, t = point_key(r["seq_q"], r["head_dim"], r["causal"]), float(r["tflops"])
        table = best8 if "fp8" in r["kernel"] else best16
        if key not in table or t > table[key][0]:
            table[key] = (t, r["kernel"])
    lines = ["At equal precision: the fastest bf16 or fp16 kernel of any chapter against SDPA's bf16 FLASH and "
             "cuDNN forward, and the fastest FP8 kernel beside it (its products run at twice the bf16 rate).", "",
             "| d | causal | seq | best 16-bit kernel | TFLOP/s | × FLASH bf16 | × cuDNN bf16 | best FP8 kernel | TFLOP/s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(best16):
        t, kernel = best16[key]
        ratios = [f"{t / sdpa[key, b]:.2f}" if (key, b) in sdpa else "-" for b in ("flash", "cudnn")]
        t8, k8 = best8.get(key, (None, "-"))
        lines.append(f"| {key[0]} | {'yes' if key[1] else 'no'} | {key[2]} | {kernel} | {t:.1f} | "
                     + " | ".join(ratios) + f" | {k8} | {fmt(t8)} |")
    return lines + [""]


def memory_section(ours, torch_rows):
    """Peak device memory (device_mib) of every kernel and backend without the mask, one column per
    sequence length; nothing when the CSVs predate the column."""
    rows = [r for r in ours if r.get("device_mib") and r["causal"] == "0"]
    rows += [dict(r, kernel=f"torch {r['backend']} {r['dtype']}", seq_q=r["seq"]) for r in torch_rows
             if r.get("device_mib") and r["causal"] == "0"]
    if not rows:
        return []
    mib = defaultdict(dict)  # (d, kernel) -> seq -> MiB
    for r in rows:
        mib[int(r["head_dim"]), r["kernel"]][int(r["seq_q"])] = float(r["device_mib"])
    seqs = sorted({seq for row in mib.values() for seq in row})
    lines = ["Peak device memory of one forward call, MiB, without the mask (inputs, outputs and workspace; "
             "PyTorch: torch.cuda.max_memory_allocated over the call, with Q, K and V):", "",
             "| d | kernel | " + " | ".join(f"seq {s}" for s in seqs) + " |", "|---|---|" + "---|" * len(seqs)]
    for (d, kernel), row in sorted(mib.items()):
        lines.append(f"| {d} | {kernel} | " + " | ".join(fmt(row.get(s)) for s in seqs) + " |")
    return lines + [""]


def decode_memory_section(ours, torch_rows):
    """Peak device memory (device_mib) of one decode step, every kernel and backend, one column per
    batch x context point in the sweep's order; nothing when the CSVs predate the column."""
    rows = [dict(r, batch=r["num_seqs"]) for r in ours if r.get("device_mib")]
    rows += [dict(r, kernel=f"torch {r['backend']} {r['dtype']} {r['form']}") for r in torch_rows
             if r.get("device_mib")]
    if not rows:
        return []
    mib = defaultdict(dict)  # (d, kernel) -> (batch, context) -> MiB
    points = []
    for r in rows:
        point = (int(r["batch"]), int(r["context"]))
        mib[int(r["head_dim"]), r["kernel"]][point] = float(r["device_mib"])
        if point not in points:
            points.append(point)
    lines = ["Peak device memory of one decode step, MiB (ours: Q, the paged K/V cache with its block tables "
             "and context lengths, O, LSE and workspace; PyTorch: torch.cuda.max_memory_allocated over the call, "
             "with Q, K and V stored contiguously):", "",
             "| d | kernel | " + " | ".join(f"{b} x {c}" for b, c in points) + " |", "|---|---|" + "---|" * len(points)]
    for (d, kernel), row in sorted(mib.items()):
        lines.append(f"| {d} | {kernel} | " + " | ".join(fmt(row.get(p)) for p in points) + " |")
    return lines + [""]


def backward_section(ours, torch_rows):
    """Chapter 07's kernels at every point, the best of them against SDPA's backward."""
    if not ours:
        return []
    kernels = []
    for r in ours:
        if r["kernel"] not in kernels:
            kernels.append(r["kernel"])
    cell = defaultdict(dict)  # point -> kernel -> text
    speed = defaultdict(dict)  # point -> kernel -> TFLOP/s (passed points only)
    checked = {}
    for r in ours:
        key = point_key(r["seq_q"], r["head_dim"], r["causal"])
        checked[key] = r["check"]
        if r["tflops"]:
            cell[key][r["kernel"]] = fmt(float(r["tflops"])) + ("" if r["status"] == "ok" else "!")
            if r["status"] == "ok":
                speed[key][r["kernel"]] = float(r["tflops"])
        else:
            cell[key][r["kernel"]] = "skip"
    ref = defaultdict(dict)
    for r in torch_rows:
        if r["status"] == "ok" and r["dtype"] == "bf16":
            ref[point_key(r["seq"], r["head_dim"], r["causal"])][r["backend"]] = float(r["tflops"])
    lines = ["Backward TFLOP/s (2.5x the forward's flops), chapter 07's kernels and SDPA's backward (bf16), "
             "same sweep. `check`: the fp64 oracle on the first K/V head of batch 0, or (longer sequences) "
             "gradients written and finite; `!` a point that failed; `skip` too slow for the sweep or not supported.",
             ""]
    header = ["d", "causal", "seq", "check"] + kernels + ["FLASH bwd", "cuDNN bwd", "best", "best/FLASH", "best/cuDNN"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    for key in sorted(cell):
        top = max(((v, k) for k, v in speed[key].items()), default=None)
        flash, cudnn = ref[key].get("flash"), ref[key].get("cudnn")
        cells = [str(key[0]), "yes" if key[1] else "no", str(key[2]), checked[key]]
        cells += [cell[key].get(k, "-") for k in kernels]
        cells += [fmt(flash), fmt(cudnn), top[1] if top else "-",
                  f"{top[0] / flash:.2f}" if top and flash else "-", f"{top[0] / cudnn:.2f}" if top and cudnn else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    return lines


if __name__ == "__main__":
    sys.exit(main())
