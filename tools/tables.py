#!/usr/bin/env python3
"""One source for every measured number: the docs' tables, generated from docs/results/h200/.

A page asks for a table with two marker lines:

    <!-- table: ch05 -->
    <!-- /table -->

and `python3 tools/tables.py` writes the table between them, from the result files of one run on
one H200 (`make run`'s tour and `make bench`, see docs/results/h200/README.md). `--check` (a CTest
test, run in CI) rewrites nothing and fails, naming the page and the table, when a table differs
from what the result files give, or when a page asks for a table that does not exist. After a new
run: copy its files into docs/results/h200/, update run.txt, run this script, commit.

Tables: tour, progression, ceilings, ch01 ... ch06, ch06_fp8, ch07, ch08, ch04_steps and
ch05_steps (the kernels registered to time one change of a chapter's `tuned` each); python_errors, python_overhead,
train_gpt and train_gemma2 (from the pytest suite's FA_RULE_CSV, tools/bench_python.py and
examples/train_gpt.py, plain and --features gemma2), features (chapter 09 against
FlexAttention, tools/features_report.py), head_dims (chapters 05 and 06 at head_dim 64 to 256
against SDPA, tools/head_dims_report.py) and memory (fused against materialized attention, time
and peak device memory, tools/memory_report.py), fp32 (chapter 04's tuned kernel against chapters
01-03 and SDPA EFFICIENT, tools/fp32_report.py), fused_backward (chapter 07's variants 4 to 6 against
SDPA's backwards, tools/fused_backward_report.py), each of these files naming its own run in its
first line, which the table's "Measured on" sentence repeats with the commands in code font.
"""
import argparse
import csv
import os
import re
import sys

import figures
from check_snippets import doc_pages
from report_io import is_step_kernel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The run the pages cite: one folder, named in figures.py.
RESULTS = figures.RESULTS
RESULTS_REL = os.path.relpath(RESULTS, ROOT) + "/"
MARKER = re.compile(r"(<!-- table: (\w+) -->\n)(.*?)(<!-- /table -->)", re.S)
# The sweep points the chapter tables show: (head_dim, seq, causal).
POINTS = [(64, 4096, False), (128, 4096, False), (128, 16384, True)]
KEY_POINT = (128, 4096, False)


def load(name):
    path = os.path.join(RESULTS, name)
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def run_line():
    """The one sentence that says where every number of the tables comes from (run.txt)."""
    info = {}
    for line in open(os.path.join(RESULTS, "run.txt")):
        if ":" in line:
            key, value = line.split(":", 1)
            info[key.strip()] = value.strip()
    return (f"{info['gpu']}, driver {info['driver']}, CUDA {info['cuda']}, PyTorch {info['pytorch']}, "
            f"{info['date']}, by `tools/results_run.sh` (its parts, machines and files: `{RESULTS_REL}README.md`).")


def fmt(x):
    if x is None:
        return "–"
    return f"{x:.0f}" if x >= 1000 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def ratio(a, b):
    return f"{a / b:.2f}×" if a is not None and b else "–"


def table(header, rows, align=None):
    align = align or ["---"] * len(header)
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


class Forward:
    """fa_bench.csv and torch.csv of the standard sweep: TFLOP/s by (kernel, d, seq, causal)."""

    def __init__(self):
        self.ours, self.chapter, self.order = {}, {}, []
        for r in load("fa_bench.csv"):
            if r["status"] != "ok" or not r["tflops"]:
                continue
            key = (int(r["head_dim"]), int(r["seq_q"]), r["causal"] == "1")
            self.ours[(r["kernel"], *key)] = float(r["tflops"])
            if r["kernel"] not in self.chapter:
                self.chapter[r["kernel"]] = int(r["chapter"])
                self.order.append(r["kernel"])
        self.torch = {}
        for r in load("torch.csv"):
            if r["status"] == "ok":
                self.torch[(f"{r['backend']}_{r['dtype']}", int(r["head_dim"]), int(r["seq"]), r["causal"] == "1")] = \
                    float(r["tflops"])

    def get(self, kernel, point):
        return self.ours.get((kernel, *point))

    def kernels(self, chapter):
        """The chapter's variants (the kernels that time one step of a variant have their own table)."""
        return [k for k in self.order if self.chapter[k] == chapter and not is_step_kernel(k)]

    def best(self, chapter, point, exclude=("fp8",)):
        """The chapter's fastest variant at a point (FP8 is its own comparison)."""
        cands = [(self.get(k, point) or 0, k) for k in self.kernels(chapter)
                 if not any(e in k for e in exclude) and not k.endswith("_fp16")]
        value, kernel = max(cands)
        return kernel, value


def point_name(point):
    d, seq, causal = point
    return f"d{d}, {seq // 1024}k{' causal' if causal else ''}"


def forward_chapter(fw, chapter, kernels, reference):
    """A chapter's kernels at POINTS, with ratios at KEY_POINT to the previous chapter and PyTorch."""
    header = ["variant"] + [f"{point_name(p)}: TFLOP/s" for p in POINTS]
    prev = None
    if chapter > 1:
        prev = fw.best(chapter - 1, KEY_POINT)
        header.append(f"× {prev[0]} ({point_name(KEY_POINT)})")
    header += [f"× {label} ({point_name(KEY_POINT)})" for label, _ in reference]
    rows = []
    for k in kernels:
        row = [f"`{k}`"] + [fmt(fw.get(k, p)) for p in POINTS]
        value = fw.get(k, KEY_POINT)
        if prev:
            row.append(ratio(value, prev[1]))
        row += [ratio(value, fw.torch.get((backend, *KEY_POINT))) for _, backend in reference]
        rows.append(row)
    for label, backend in reference:
        rows.append([f"PyTorch {label}"] + [fmt(fw.torch.get((backend, *p))) for p in POINTS] +
                    ([""] if prev else []) + [""] * len(reference))
    note = ("TFLOP/s = 4·B·H·N²·d / time (halved when causal), on the standard sweep: 16k tokens per batch, "
            "hidden 2048 (batch = 16384 / seq, heads = 2048 / d).")
    return table(header, rows) + "\n\n" + note


FP32_REF = [("SDPA EFFICIENT fp32", "efficient_fp32")]
BF16_REF = [("SDPA FLASH", "flash_bf16"), ("SDPA cuDNN", "cudnn_bf16")]


def chapter_table(fw, chapter):
    if chapter <= 4:
        return forward_chapter(fw, chapter, fw.kernels(chapter), FP32_REF)
    kernels = [k for k in fw.kernels(chapter) if k.endswith("_bf16")]
    return forward_chapter(fw, chapter, kernels, BF16_REF)


# Chapter 04's `tuned` built up one change at a time (each row adds one change to the row above),
# and chapter 05's `tuned` with one change taken back at a time (each row against `tuned`). The
# words say what each registered kernel changes (the registration in the chapter's *_tuned.cu).
CH04_STEPS = [("ch04_registers", "variant 3, the starting point"),
              ("ch04_tuned_step1", "+ 8 × 4 register patches (4 × 8 at d = 64; one float per shared-memory load)"),
              ("ch04_tuned_step2", "+ float4 loads from swizzled rows"),
              ("ch04_tuned_step3", "+ the row update by shuffles, in registers"),
              ("ch04_tuned", "+ K/V copies that overlap the math (`tuned`)")]
CH05_UNDONE = [("ch05_tuned_undo_rows_bf16", "16 rows per warp (64 per block), not 32"),
               ("ch05_tuned_undo_keys_bf16", "64-key tiles at d = 64, not 128 (d = 128: the same kernel)"),
               ("ch05_tuned_undo_waits_bf16", "K and V copied together after P V, one wait"),
               ("ch05_tuned_undo_copies_bf16", "copy addresses computed per row"),
               ("ch05_tuned_undo_scale_bf16", "the scale multiplied in before the max"),
               ("ch05_tuned_undo_order_bf16", "the Q tiles in launch order, not the last first"),
               ("ch05_tuned_undo_stores_bf16", "O stored from the registers, not through shared memory")]


def steps_table(fw, chapter):
    """Chapter 04: each step against the row above. Chapter 05: `tuned` against each undone change."""
    header = ["kernel", "change"] + [f"{point_name(p)}: TFLOP/s" for p in POINTS]
    rows = []
    if chapter == 4:
        header += [f"× the row above ({point_name(p)})" for p in POINTS]
        for i, (k, change) in enumerate(CH04_STEPS):
            cells = [fmt(fw.get(k, p)) for p in POINTS]
            above = [ratio(fw.get(k, p), fw.get(CH04_STEPS[i - 1][0], p)) if i else "" for p in POINTS]
            rows.append([f"`{k}`", change] + cells + above)
    else:
        header += [f"`tuned` ÷ this ({point_name(p)})" for p in POINTS]
        rows.append(["`ch05_tuned_bf16`", "every change"] + [fmt(fw.get("ch05_tuned_bf16", p)) for p in POINTS] +
                    [""] * len(POINTS))
        for k, change in CH05_UNDONE:
            rows.append([f"`{k}`", f"undone: {change}"] + [fmt(fw.get(k, p)) for p in POINTS] +
                        [ratio(fw.get("ch05_tuned_bf16", p), fw.get(k, p)) for p in POINTS])
    return table(header, rows)


def fp8_table(fw):
    points = [(64, 4096, False), (128, 4096, False), (128, 16384, False), (128, 16384, True)]
    header = ["variant"] + [f"{point_name(p)}" for p in points]
    rows = []
    for k in ["ch06_fp8", "ch06_fp8_plain", "ch06_pingpong_bf16"]:
        rows.append([f"`{k}`"] + [fmt(fw.get(k, p)) for p in points])
    rows.append(["PyTorch SDPA cuDNN bf16"] + [fmt(fw.torch.get(("cudnn_bf16", *p))) for p in points])
    for k in ["ch06_fp8", "ch06_fp8_plain"]:
        rows.append([f"`{k}` ÷ `ch06_pingpong_bf16`"] +
                    [ratio(fw.get(k, p), fw.get("ch06_pingpong_bf16", p)) for p in points])
    return (table(header, rows) + "\n\nTFLOP/s counted as for bf16 (4·B·H·N²·d, halved when causal); the FP8 time "
            "includes the quantization kernels.")


def tour_table():
    rows = []
    base = None
    shape = None
    for r in load("tour.csv"):
        if r["status"] != "ok":
            continue
        ms = float(r["time_ms"])
        base = base or ms
        shape = shape or (f"batch {r['batch']}, {r['heads_q']} heads, {r['seq_q']} queries and keys, "
                          f"head_dim {r['head_dim']}{', causal' if r['causal'] == '1' else ''}")
        where = r["phases"] or "one kernel"
        rows.append([f"{int(r['chapter']):02d}", f"`{r['kernel']}`", f"{float(r['rel_err']):.1e}", f"{ms:.3g}",
                     fmt(float(r["tflops"])), fmt(base / ms) + "×", where])
    return (f"Every chapter program at its default shape ({shape}; `make run`):\n\n" +
            table(["chapter", "kernel", "rel. error", "time (ms)", "TFLOP/s", "× ch01_naive", "where the time goes"],
                  rows) +
            "\n\nKernels named `_stepN` or `_undo_*` are chapters 04 and 05's `tuned` with one change made or "
            "undone, each timed alone: the step tables of chapters 04 and 05.")


def progression_table(fw):
    header = ["chapter", "best variant"] + [point_name(p) + ": TFLOP/s (× SDPA FLASH)" for p in POINTS]
    rows = []
    for chapter in range(1, 7):
        best = fw.best(chapter, KEY_POINT)[0]
        cells = []
        for p in POINTS:
            v = fw.get(best, p)
            cells.append(f"{fmt(v)} ({ratio(v, fw.torch.get(('flash_bf16', *p)))})")
        rows.append([f"{chapter:02d}", f"`{best}`"] + cells)
    for label, backend in [("SDPA FLASH bf16", "flash_bf16"), ("SDPA cuDNN bf16", "cudnn_bf16"),
                           ("SDPA EFFICIENT fp32", "efficient_fp32")]:
        rows.append(["PyTorch", label] + [fmt(fw.torch.get((backend, *p))) for p in POINTS])
    return table(header, rows)


def ceilings_table():
    rows = [[r["ceiling"], f"{float(r['value']):.1f} {r['unit']}", r["detail"]] for r in load("ceilings.csv")]
    return table(["ceiling", "measured", "how"], rows)


def backward_table():
    ours, order = {}, []
    for r in load("backward.csv"):
        if r["status"] == "ok" and r["tflops"]:
            ours[(r["kernel"], int(r["head_dim"]), int(r["seq_q"]), r["causal"] == "1")] = float(r["tflops"])
            if r["kernel"] not in order:
                order.append(r["kernel"])
    torch = {(r["backend"], int(r["head_dim"]), int(r["seq"]), r["causal"] == "1"): float(r["tflops"])
             for r in load("torch_backward.csv") if r["status"] == "ok"}
    header = ["variant"] + [f"{point_name(p)}: TFLOP/s" for p in POINTS] + \
        [f"× SDPA FLASH ({point_name(KEY_POINT)})", f"× SDPA cuDNN ({point_name(KEY_POINT)})"]
    rows = []
    for k in order:
        if k.endswith("_fp16"):
            continue
        v = ours.get((k, *KEY_POINT))
        rows.append([f"`{k}`"] + [fmt(ours.get((k, *p))) for p in POINTS] +
                    [ratio(v, torch.get(("flash", *KEY_POINT))), ratio(v, torch.get(("cudnn", *KEY_POINT)))])
    for label, backend in [("SDPA FLASH bf16", "flash"), ("SDPA cuDNN bf16", "cudnn")]:
        rows.append([f"PyTorch {label}"] + [fmt(torch.get((backend, *p))) for p in POINTS] + ["", ""])
    return (table(header, rows) + "\n\nBackward TFLOP/s = 2.5 × the forward's FLOPs / time (dQ, dK, dV from "
            "O, dO and LSE), on the standard sweep.")


def decode_table():
    ours = {}
    for r in load("decode.csv"):
        if r["status"] == "ok" and r["dtype"] == "bf16":
            variant = "v1" if "block_table" in r["kernel"] else "v2"
            ours[(variant, int(r["head_dim"]), int(r["num_seqs"]), int(r["context"]))] = float(r["kv_gbps"])
    torch = {}
    for r in load("torch_decode.csv"):
        if r["status"] == "ok" and r["dtype"] == "bf16":  # the faster of SDPA's two ways to call GQA
            key = (r["backend"], int(r["head_dim"]), int(r["batch"]), int(r["context"]))
            torch[key] = max(torch.get(key, 0), float(r["kv_gbps"]))
    shapes = sorted({k[1:] for k in ours}, key=lambda s: (-s[0], -s[1] * s[2], -s[1]))
    rows = []
    for d, n, ctx in shapes:
        v1, v2 = ours.get(("v1", d, n, ctx)), ours.get(("v2", d, n, ctx))
        flash, cudnn = torch.get(("flash", d, n, ctx)), torch.get(("cudnn", d, n, ctx))
        best = max(x for x in (v1, v2) if x is not None)
        rows.append([d, f"{n} × {ctx}", fmt(v1), fmt(v2), fmt(flash), fmt(cudnn), ratio(best, flash), ratio(best, cudnn)])
    return (table(["d", "sequences × context", "`block_table` GB/s", "`split_kv` GB/s", "SDPA FLASH GB/s",
                   "SDPA cuDNN GB/s", "best ÷ FLASH", "best ÷ cuDNN"], rows) +
            "\n\nbf16, 32 query heads over 8 K/V heads, one query token per sequence; GB/s = K/V bytes read / time. "
            "SDPA reads the same K/V stored contiguously (it has no block table), called the faster of two ways "
            "(K/V heads repeated, or `enable_gqa`).")


# A command in a run's line: a program (a path, `pytest`, or `python3`/`bash` and a script) and its
# arguments: flags, each flag's value, paths. Outside code font Doxygen prints `--budget-ms` with
# an en dash, so code_commands() puts each command, and each file name, in backticks.
ARG = r"(?:[^\s;,()`]|,(?=\S))+"  # a word of a command: "64,128" is one, "a, b" two
PROGRAM = r"(?:(?:python3|bash) )?(?:pytest|(?:[\w.-]+/)+[\w.-]+\w|[\w-]+\.(?:py|sh|csv|txt|md|png))"
COMMAND = re.compile(rf"(?<![\w./-]){PROGRAM}(?: -{{1,2}}\w[\w-]*(?: (?!-){ARG})?| (?!-){ARG}/{ARG})*(?![\w/])")


def code_commands(text):
    """The text with each command and file name it names in code font; what is already code stays."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(part if part.startswith("`") else COMMAND.sub(lambda m: f"`{m.group(0)}`", part) for part in parts)


def measured_on(line):
    """A result file's '# ' line as a sentence: where it was measured, then its commands in code font."""
    where, sep, how = line.partition(": ")
    return f"Measured on {where}{sep}{code_commands(how)}"


def load_with_line(name):
    """(the file's first line, a '# ' comment saying where it was measured; its CSV rows)."""
    with open(os.path.join(RESULTS, name), newline="") as f:
        line = f.readline()
        if not line.startswith("# "):
            raise SystemExit(f"tables: {name} must start with a '# ' line saying where it was measured")
        return line[2:].strip(), list(csv.DictReader(f))


def python_errors_table():
    line, rows = load_with_line("python_errors.csv")
    body = table(["kernel", "tensors compared", "median of ours ÷ PyTorch", "largest use of the bound"],
                 [[f"`{r['kernel']}`", r["checks"], r["median_ours_over_pytorch"] or "–", r["max_ours_over_bound"]]
                  for r in rows])
    return (body + "\n\nOurs ÷ PyTorch: our largest error against the fp64 reference over PyTorch's own in the same "
            "dtype, per compared tensor (O, or dQ, dK, dV). Use of the bound: our error over 2 × PyTorch's + the "
            "rounding; the test fails above 1. FP8 kernels are held to their own tolerance instead and are not "
            f"listed.\n\n{measured_on(line)}.\n")


def train_table(name, baseline, baseline_name, note):
    """A training example's runs (examples/train_gpt.py): loss, tokens/s against `baseline`'s, and
    each run's largest gap to its curve."""
    line, rows = load_with_line(name)
    gap = next(c for c in rows[0] if c.startswith("gap_to_"))
    base = next(float(r["tokens_per_s"]) for r in rows if r["run"] == baseline)
    body = table(["run", "attention (forward + backward)", "final train loss", "validation loss", "tokens/s",
                  f"× {baseline_name}", f"largest gap to {baseline_name}"],
                 [[r["run"], r["attention"], r["final_train_loss"], r["val_loss"], f"{float(r['tokens_per_s']):,.0f}",
                   f"{float(r['tokens_per_s']) / base:.2f}×", r[gap] if r["run"] != baseline else "–"]
                  for r in rows])
    return body + f"\n\n{note}\n\n{measured_on(line)}.\n"


def train_gpt_table():
    return train_table("train_runs.csv", "sdpa-flash", "SDPA FLASH",
                       "The gap is the largest difference between two runs' training-loss curves (20-step means) "
                       "over the second half of training.")


def train_gemma2_table():
    return train_table("train_gemma2_runs.csv", "flex", "FlexAttention",
                       "Eager PyTorch: the scores materialized in fp32, the window as a mask and the softcap as a "
                       "tanh. The gap is measured as in the table above.")


def python_overhead_table():
    line, rows = load_with_line("python_overhead.csv")
    what = {"sdpa_flash": "SDPA FLASH", "ours": "ours", "ours_python": "the same from Python",
            "ours_launch": "the launch alone (ctypes)"}
    call = {"bhsd": "`ak.attention`", "bshd": "`ak.flash_attn_func`"}
    body = table(["shape (b × h × s × d, causal)", "pass", "layout", "call", "µs per call", "× SDPA FLASH"],
                 [[f"{r['batch']} × {r['heads']} × {r['seq']} × {r['head_dim']}", r["pass_"], r["layout"],
                   "SDPA FLASH" if r["variant"] == "sdpa_flash" else
                   (call[r["layout"]] if r["variant"] == "ours" else what[r["variant"]]),
                   r["us_per_call"], f"{r['over_sdpa']}×"] for r in rows])
    return (body + "\n\nWall time per call: calls back to back, one synchronize, divided by the calls; the median of "
            "7 rounds in which the calls of a shape take turns. bf16. Ours runs `ch06_pingpong_bf16` forward and "
            "`ch07_wgmma_bf16` backward; in the bshd layout both read the transposed views in place (both "
            "kernels take strided tensors). `ak.attention` and `ak.flash_attn_func` go through the C++ operator "
            "(libfa_torch.so); \"the same from Python\" is the path taken without it.\n\n"
            f"{measured_on(line)}.\n")


def feature_rows(rows, ampere, plain):
    """features_report.py's rows as table rows; with the plain columns (--plain) when the file has them."""
    has_plain = bool(rows) and "over_plain" in rows[0]
    head = ["feature", "seq × batch", "ours (kernel)", "TFLOP/s", "FlexAttention", "× Flex", "SDPA (backend)", "× SDPA",
            ampere] + ([plain, "× it"] if has_plain else [])
    body = [[r["feature"], f"{int(r['seq']) // 1024}k × {r['batch']}", f"`{r['kernel']}`", r["tflops"],
             r["flex_tflops"] or "–", f"{r['over_flex']}×" if r["over_flex"] else "–",
             f"{r['sdpa_tflops']} ({r['sdpa_backend']})" if r["sdpa_tflops"] else "–",
             f"{r['over_sdpa']}×" if r["over_sdpa"] else "–", r["ampere_tflops"] or "–"] +
            ([f"{r['plain_tflops']} (`{r['plain_kernel']}`)" if r["plain_tflops"] else "–",
              f"{r['over_plain']}×" if r["over_plain"] else "–"] if has_plain else []) for r in rows]
    return table(head, body)


def features_table():
    line, rows = load_with_line("features.csv")
    body = feature_rows(rows, "`ch09_ampere_bf16`", "chapter 06, no feature")
    return (body + "\n\nhead_dim 128, 16 heads, bf16, 16k tokens per point; causal except the bias row. TFLOP/s count "
            "only the (query, key) pairs the mask leaves (half the square for causal, exact for windows). SDPA runs "
            "where it takes the feature: the plain causal mask, and ALiBi and the bias as a materialized bf16 mask. "
            "The `ch09_ampere_bf16` column is variant 1, the path for GPUs before Hopper, on the same points; the "
            "chapter 06 columns, where the run has them, chapter 06's fastest kernel at the same shape without the "
            "feature (the forward part's points) and ours over it. This table is "
            "the run's features part, on a machine of its own: its causal and SDPA figures differ by a few percent "
            "from the same points in chapter 06's tables (the forward part, another H200). "
            f"\n\n{measured_on(line)}.\n")


def features_backward_table():
    line, rows = load_with_line("features_backward.csv")
    body = feature_rows(rows, "`ch09_ampere_backward_bf16`", "chapter 07, no feature")
    return (body + "\n\nThe backward (dQ, dK, dV from O and the LSE of chapter 07's forward), head_dim 128, 16 heads, "
            "bf16, 16k tokens per point; causal except the bias row. TFLOP/s count 2.5 times the forward's operations "
            "on the (query, key) pairs the mask leaves. FlexAttention's backward is compiled by torch.compile, its "
            "gradients checked against float64 autograd on one head first. The last columns, where the run has them: "
            "chapter 07's fastest backward at the same shape without the feature (the backward part's points), "
            f"and ours over it.\n\n{measured_on(line)}.\n")


def head_dims_table():
    line, rows = load_with_line("head_dims.csv")
    shown = [r for r in rows if int(r["seq"]) in (4096, 16384)]
    def x(v):
        return f"{v}×" if v else "–"

    body = table(["head_dim", "mask", "seq × batch", "heads", "`ch05_tuned_bf16`", "`ch06_pingpong_bf16`",
                  "`ch06_persistent_bf16`", "`ch06_fp8`", "SDPA FLASH", "SDPA cuDNN", "pingpong × FLASH",
                  "pingpong × cuDNN", "persistent × cuDNN", "fp8 × cuDNN"],
                 [[r["head_dim"], "causal" if r["causal"] == "1" else "none",
                   f"{int(r['seq']) // 1024}k × {r['batch']}", r["heads"], r["tuned_tflops"] or "–",
                   r["pingpong_tflops"] or "–", r["persistent_tflops"] or "–", r["fp8_tflops"] or "–",
                   r["flash_tflops"] or "–", r["cudnn_tflops"] or "–", x(r["pingpong_over_flash"]),
                   x(r["pingpong_over_cudnn"]), x(r["persistent_over_cudnn"]), x(r["fp8_over_cudnn"])]
                  for r in shown])
    return (body + "\n\nTFLOP/s, bf16 in and out (`ch06_fp8` computes in e4m3 inside, the time of its "
            "quantizing passes included), the standard sweep's 16k tokens (batch = 16384 / seq) and hidden 2048 "
            "(heads = 2048 / d, 21 at d = 96); seq 4k and 16k shown, 512 to 16k in `" + RESULTS_REL + "head_dims.csv`. "
            "FP8 runs at 64, 128 and 256. At d = 96 the FLOPs are counted at 96, though the Hopper kernel multiplies "
            "128 columns in P V. The rows of head_dim 64 and 128 come from the forward part of the run, those of 96 and "
            "256 from its head_dims part, on another H200 of the same kind: a ratio within a row compares figures of "
            "one call; across head_dims, of two machines."
            f"\n\n{measured_on(line)}.\n")


def memory_table():
    line, rows = load_with_line("memory.csv")

    def pair(r, prefix):
        ms, mib = r[f"{prefix}_ms"], r[f"{prefix}_mib"]
        return f"{ms} ms, {float(mib):,.0f} MiB" if ms and mib else "–"

    def x(v):
        return f"{v}×" if v else "–"

    body = table(["dtype", "seq × batch", "unfused (ours)", "fused (ours)", "SDPA MATH", "SDPA fused",
                  "unfused ÷ fused: time", "memory", "MATH ÷ fused: time", "memory"],
                 [[r["dtype"], f"{r['seq']} × {r['batch']}",
                   f"`{r['unfused']}`: {pair(r, 'unfused')}" if r["unfused"] else "–",
                   f"`{r['fused']}`: {pair(r, 'fused')}", pair(r, "torch_math"),
                   f"{r['torch_fused'].split('_')[0].upper()}: {pair(r, 'torch_fused')}", x(r["speedup"]),
                   x(r["memory_saving"]), x(r["speedup_vs_math"]), x(r["memory_saving_vs_math"])] for r in rows])
    return (body + "\n\nhead_dim 64, 32 heads, 16k tokens per point (batch = 16384 / seq), no mask. Memory is the "
            "peak device memory of one forward call: Q, K, V, O and the log-sum-exp (and the N × N scores, where they "
            "are kept), what `fa_bench` and `tools/bench_torch.py` report as `device_mib`. The ratios are the "
            "unfused figure over the fused one (time: speed-up; memory: how many times less)."
            + "".join(f" SDPA's MATH backend in {r['dtype']} ran out of memory at {r['seq']} tokens." for r in rows
                      if not r["torch_math_ms"])
            + " `unfused ÷ fused` compares chapter 01's kernel (fp32 only)."
            f"\n\n{measured_on(line)}.\n")


def fp32_table():
    line, rows = load_with_line("fp32.csv")
    body = table(["head_dim", "mask", "seq × batch", "`ch01_tiled`", "`ch02_block`", "`ch03_online`",
                  "`ch04_registers`", "`ch04_tuned`", "SDPA EFFICIENT", "tuned × best of 01–03",
                  "tuned × registers", "tuned × EFFICIENT"],
                 [[r["head_dim"], "causal" if r["causal"] == "1" else "none", f"{r['seq']} × {r['batch']}",
                   r["tiled"] or "–", r["block"] or "–", r["online"] or "–", r["registers"] or "–", r["tuned"] or "–",
                   r["efficient"] or "–", f"{r['tuned_over_best_01_03']}×", f"{r['tuned_over_registers']}×",
                   f"{r['tuned_over_efficient']}×"] for r in rows])
    return (body + "\n\nTFLOP/s in fp32, the standard sweep: 16k tokens (batch = 16384 / seq), hidden 2048 "
            "(heads = 2048 / d), FLOPs 4·B·H·N²·d, halved when causal. SDPA EFFICIENT is PyTorch's fused fp32 "
            "kernel (xformers' memory-efficient attention)."
            f"\n\n{measured_on(line)}.\n")


def fused_backward_table():
    line, rows = load_with_line("fused_backward.csv")
    body = table(["head_dim", "mask", "seq × batch", "`wgmma` (4)", "`fused` (5)", "`fused_bulk` (6)", "SDPA FLASH",
                  "SDPA cuDNN", "6 × 5", "6 × 4", "6 × FLASH", "6 × cuDNN"],
                 [[r["head_dim"], "causal" if r["causal"] == "1" else "none", f"{r['seq']} × {r['batch']}",
                   r["wgmma"] or "–", r["fused"] or "–", r["fused_bulk"] or "–", r["flash"] or "–", r["cudnn"] or "–",
                   *[f"{r[c]}×" if r[c] else "–" for c in ("bulk_over_fused", "bulk_over_wgmma", "bulk_over_flash",
                                                          "bulk_over_cudnn")]] for r in rows])
    return (body + "\n\nBackward TFLOP/s (2.5 × the forward's FLOPs / time), bf16, the standard sweep: 16k tokens "
            "(batch = 16384 / seq), hidden 2048 (heads = 2048 / d). Ratios are of the unrounded figures."
            f"\n\n{measured_on(line)}.\n")


def context_parallel_table():
    """Chapter 10: ring attention on N ranks against one rank, the splits, the compute alone, and
    PyTorch's context parallelism on the same problem (each file naming its own run)."""
    line, ours = load_with_line("context_parallel.csv")
    torch_line, theirs = load_with_line("torch_context_parallel.csv")
    per_rank = int(next(r for r in ours if r["ranks"] == "1")["tokens"])

    def flops(seq):  # causal forward FLOPs of the benchmark's problem, per the first line's shape
        shape = dict(re.findall(r"--(batch|heads|dim) (\d+)", line))
        return 4.0 * int(shape["batch"]) * int(shape["heads"]) * seq * (seq + 1) / 2.0 * int(shape["dim"])

    rows, train = [], {}
    for r in ours:
        seq = int(r["tokens"])
        both = float(r["fwd_ms"]) + float(r["bwd_ms"])
        train[r["run"]] = 3.5 * flops(seq) / both / 1e9
        rows.append([r["run"], f"{seq:,}", f"{float(r['fwd_ms']):.2f}", r["fwd_tflops"],
                     f"{float(r['fwd_over_one_rank']):.2f}×", f"{float(r['bwd_ms']):.2f}", r["bwd_tflops"],
                     f"{float(r['bwd_over_one_rank']):.2f}×", f"{both:.2f}", f"{train[r['run']]:.1f}",
                     f"{float(r['hop_ms']):.2f} ms, {float(r['hop_gbps']):.0f} GB/s" if r["hop_ms"] else "–"])
    one_torch = next(r for r in theirs if r["run"].startswith("1 GPU"))
    for r in theirs:
        rows.append([f"PyTorch: {r['run']}", f"{int(r['tokens']):,}", r["fwd_ms"], r["fwd_tflops"],
                     f"{float(r['fwd_tflops']) / float(one_torch['fwd_tflops']):.2f}×", "–", "–", "–", r["fwd_bwd_ms"],
                     r["fwd_bwd_tflops"], "–"])
    body = table(["run", "tokens", "forward ms", "TFLOP/s", "× 1 rank", "backward ms", "TFLOP/s", "× 1 rank",
                  "forward + backward ms", "TFLOP/s", "one hop of K and V"], rows)
    n = next(int(r["ranks"]) for r in ours if r["ranks"] != "1")
    zig = next(r for r in ours if r["split"] == "zigzag" and r["ranks"] != "1" and r["transfer"] == "1")
    contig = next(r for r in ours if r["split"] == "contiguous" and r["ranks"] != "1")
    alone = next(r for r in ours if r["transfer"] == "0")
    best_torch = max((r for r in theirs if not r["run"].startswith("1 GPU")), key=lambda r: float(r["fwd_bwd_tflops"]))
    ratios = (f"At {per_rank:,} tokens per rank on {n} ranks, zigzag: the forward runs at "
              f"{float(zig['fwd_over_one_rank']):.2f}× one rank's TFLOP/s and the backward at "
              f"{float(zig['bwd_over_one_rank']):.2f}× (even work at one rank's speed is {n}×); a pass takes "
              f"{float(zig['fwd_ms']) / float(alone['fwd_ms']):.3f}× (forward) and "
              f"{float(zig['bwd_ms']) / float(alone['bwd_ms']):.3f}× (backward) the time of the compute alone (the "
              f"performance notes split the difference into slower kernels and waiting); "
              f"zigzag is {float(contig['fwd_ms']) / float(zig['fwd_ms']):.2f}× (forward) and "
              f"{float(contig['bwd_ms']) / float(zig['bwd_ms']):.2f}× (backward) as fast as the contiguous split; "
              f"forward + backward runs at {train[zig['run']] / float(best_torch['fwd_bwd_tflops']):.2f}× the TFLOP/s "
              f"of PyTorch's best context-parallel run ({best_torch['run']}), and the forward at "
              f"{float(zig['fwd_tflops']) / float(best_torch['fwd_tflops']):.2f}×.")
    return (body + "\n\nA time is the slowest rank's pass (a pass ends when its last rank does), the median "
            "of the passes run. The backward's TFLOP/s count 2.5 times the forward's FLOPs; forward + backward, 3.5 "
            "times. " + ratios + f"\n\n{measured_on(line)}.\n\n{measured_on(torch_line)}.\n")


def context_parallel_model_table():
    with open(os.path.join(RESULTS, "context_parallel_model.csv"), newline="") as f:
        line = f.readline()[2:].strip()
        check = f.readline()[2:].strip()
        rows = list(csv.DictReader(f))
    shown = [r for r in rows if r["ranks"] in ("2", "8", "16", "64")]
    body = table(["tokens per GPU", "GPUs", "ring forward", "ring backward", "Ulysses forward", "Ulysses backward"],
                 [[f"{int(r['tokens_per_rank']):,}", r["ranks"], r["ring_fwd_eff"], r["ring_bwd_eff"],
                   r["ulysses_fwd_eff"] or "– (N > heads)", r["ulysses_bwd_eff"] or "– (N > heads)"] for r in shown])
    return (body + "\n\nEfficiency: the compute's time over the pass's (1 is the ideal). The model's "
            f"{check.replace('check: ', 'check against the measurement, ')}.\n\n"
            f"![the model's efficiency against the number of GPUs](../../{os.path.relpath(RESULTS, ROOT)}/context_parallel_model.png)"
            f"\n\nModel: {code_commands(line)}.\n")


def tables():
    fw = Forward()
    out = {"tour": tour_table(), "progression": progression_table(fw), "ceilings": ceilings_table(),
           "ch06_fp8": fp8_table(fw), "ch07": backward_table(), "ch08": decode_table(),
           "ch04_steps": steps_table(fw, 4), "ch05_steps": steps_table(fw, 5)}
    for chapter in range(1, 7):
        out[f"ch{chapter:02d}"] = chapter_table(fw, chapter)
    line = run_line()
    out = {name: f"{body}\n\nMeasured on {line}\n" for name, body in out.items()}
    out["python_errors"] = python_errors_table()
    out["train_gpt"] = train_gpt_table()
    out["train_gemma2"] = train_gemma2_table()
    out["python_overhead"] = python_overhead_table()
    out["features"] = features_table()
    if os.path.exists(os.path.join(RESULTS, "features_backward.csv")):
        out["features_backward"] = features_backward_table()
    out["head_dims"] = head_dims_table()
    out["memory"] = memory_table()
    out["fp32"] = fp32_table()
    out["fused_backward"] = fused_backward_table()
    if os.path.exists(os.path.join(RESULTS, "context_parallel.csv")):
        out["context_parallel"] = context_parallel_table()
        out["context_parallel_model"] = context_parallel_model_table()
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; fail if a table is not current")
    parser.add_argument("--page", action="append", help="only this page (repeatable; default: every page)")
    args = parser.parse_args()
    generated = tables()
    stale, wrong = [], []  # what rewriting fixes (a table or figure not current), what it does not
    count = figure_count = 0
    pages = [os.path.abspath(p) for p in args.page] if args.page else doc_pages(ROOT)
    for page in pages:
        with open(page, encoding="utf-8") as f:
            text = f.read()
        rel = os.path.relpath(page, ROOT)

        def fill(m):
            nonlocal count
            count += 1
            name = m.group(2)
            if name not in generated:
                wrong.append(f"{rel}: no table named '{name}'; known: {', '.join(sorted(generated))}")
                return m.group(0)
            body = "\n" + generated[name] + "\n"
            if m.group(3) != body:
                stale.append(f"{rel}: table '{name}' differs from {RESULTS_REL}")
            return m.group(1) + body + m.group(4)

        new = MARKER.sub(fill, text)
        if "/results/" not in rel.replace(os.sep, "/"):  # the result pages are bench.sh's own output
            with_figures, errors = figures.fill(new)
            wrong += [f"{rel}: {e}" for e in errors]
            if with_figures != new:
                changed = sum(a != b for a, b in zip(figures.FIGURE.findall(new), figures.FIGURE.findall(with_figures)))
                stale.append(f"{rel}: {changed} prose figures differ from {RESULTS_REL}")
            new = with_figures
            figure_count += len(figures.FIGURE.findall(new))
            wrong += [f"{rel}:{line}: '{t}' reads as a measured figure; give it by a figure marker "
                      "(tools/figures.py)" for line, t in figures.unmarked(rel, new)]
            wrong += [f"{rel}: a record names no GPU and date: '{r}'" for r in figures.bad_records(new)]
            wrong += [f"{rel}:{line}: {why}" for line, why in figures.bad_layout(new)]
        if not args.check and new != text:
            with open(page, "w", encoding="utf-8") as f:
                f.write(new)
    if not args.check:
        stale = []  # rewritten above
    if stale or wrong:
        print("\n".join(stale + wrong))
        if stale:
            print(f"tables: {len(stale)} pages or tables are not what {RESULTS_REL} gives; run python3 tools/tables.py")
        if wrong:
            print(f"tables: {len(wrong)} problems that rewriting does not fix")
        return 1
    print(f"tables: {count} tables and {figure_count} prose figures " +
          (f"match {RESULTS_REL}" if args.check else f"written from {RESULTS_REL}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
