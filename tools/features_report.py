#!/usr/bin/env python3
"""Chapter 09's comparison table: fa_bench --features and tools/bench_flex.py, one row per point.

    python3 tools/features_report.py FA_CSV FLEX_CSV --out docs/results/h200/features.csv \\
        --line "NVIDIA H200, driver ..., CUDA ..., PyTorch ..., 2026-11-28: the commands"

Each row: the feature, the point, our best bf16 kernel there (TFLOP/s counting only the pairs the
mask leaves), FlexAttention's, SDPA's best backend where SDPA takes the feature, the ratios, and
the sm_80 path's (ch09_ampere_bf16) figure. The same for the backward: fa_bench --features
--backward and tools/bench_flex.py --pass backward (the sm_80 path: ch09_ampere_backward_bf16). The
first line of the output is the '# ' line saying where it was measured (tools/tables.py needs it).

--plain CSV (fa_bench's standard sweep from the same run: the forward's fa_bench.csv, or the
backward's backward.csv) adds what the features cost: the best bf16 kernel of the chapter the
features extend (06 for the forward, 07 for the backward) at the same shape without features
(a packed batch of N sequences of length L: N x L, causal), and ours over it.
"""
import csv
import sys

from report_io import is_step_kernel, report_args, report_writer

# fa_bench's feature column -> bench_flex.py's feature name
FEATURE_NAMES = {"": "causal", "window 1023,0": "window 1024", "window 4095,0": "window 4096",
                 "softcap 50": "softcap 50", "alibi": "alibi", "bias": "bias"}


# The chapter whose kernels chapter 09's extend, by pass.
PLAIN_CHAPTER = {"forward": "6", "backward": "7"}


def plain_best(path, chapter):
    """{(head_dim, causal, seq, batch, heads): (kernel, TFLOP/s)}: the best bf16 kernel of `chapter`
    at each point of fa_bench's CSV `path` (step kernels left out)."""
    best = {}
    for r in csv.DictReader(open(path, newline="")):
        if (r["chapter"] != chapter or r["status"] != "ok" or not r["tflops"] or r.get("dtype", "bf16") != "bf16"
                or is_step_kernel(r["kernel"])):
            continue
        key = (int(r["head_dim"]), int(r["causal"]), int(r["seq_q"]), int(r["batch"]), int(r["heads_q"]))
        if key not in best or float(r["tflops"]) > best[key][1]:
            best[key] = (r["kernel"], float(r["tflops"]))
    return best


def plain_columns(best, tflops):
    """The plain kernel, its TFLOP/s and ours over it, or blanks where the sweep has no such point."""
    if best is None:
        return ["", "", ""]
    return [best[0], f"{best[1]:.1f}", f"{tflops / best[1]:.2f}"]


def main():
    args = report_args(__doc__, second="flex_csv", extra=[(("--plain",), {"help": "fa_bench's standard sweep CSV"})])
    ours, ampere, causal = {}, {}, {}
    rows = csv.DictReader(open(args.fa_csv, newline=""))
    backward = "dq_rel" in (rows.fieldnames or [])  # fa_bench --backward's CSV has the gradients' errors
    for r in rows:
        if r["status"] != "ok" or not r["tflops"] or r.get("dtype", "bf16") != "bf16":
            continue  # FlexAttention runs bf16: so do the kernels compared with it
        # A packed batch is "varlen N": N sequences in a batch of 1 (older files: "varlen" with
        # the sequences in the batch column).
        words = r["features"].split()
        packed = bool(words) and words[0] == "varlen"
        feature = "packed" if packed else FEATURE_NAMES.get(r["features"])
        if feature is None:
            sys.exit(f"features_report: unknown features column {r['features']!r} in {args.fa_csv}")
        batch = (int(words[1]) if len(words) > 1 else int(r["batch"])) if packed else int(r["batch"])
        seq = int(r["seq_q"]) // batch if packed else int(r["seq_q"])
        key = (feature, int(r["head_dim"]), seq)
        causal[key] = int(r["causal"])
        if r["kernel"] in ("ch09_ampere_bf16", "ch09_ampere_backward_bf16"):
            ampere[key] = float(r["tflops"])
        if key not in ours or float(r["tflops"]) > ours[key][1]:
            ours[key] = (r["kernel"], float(r["tflops"]), float(r["time_ms"]), batch, int(r["heads_q"]))
    flex, sdpa = {}, {}
    for r in csv.DictReader(open(args.flex_csv, newline="")):
        if r["status"] != "ok":
            continue
        key = (r["feature"], int(r["head_dim"]), int(r["seq"]))
        if r["backend"] == "flex":
            flex[key] = float(r["tflops"])
        elif key not in sdpa or float(r["tflops"]) > sdpa[key][1]:
            sdpa[key] = (r["backend"].replace("sdpa_", ""), float(r["tflops"]))
    plain = plain_best(args.plain, PLAIN_CHAPTER["backward" if backward else "forward"]) if args.plain else {}
    order = list(FEATURE_NAMES.values()) + ["packed"]
    with report_writer(args.out, args.line, lineterminator="\r\n") as out:  # csv's default ending
        out.writerow(["feature", "head_dim", "seq", "batch", "heads", "kernel", "time_ms", "tflops", "flex_tflops",
                      "over_flex", "sdpa_backend", "sdpa_tflops", "over_sdpa", "ampere_tflops"] +
                     (["plain_kernel", "plain_tflops", "over_plain"] if args.plain else []))
        for key in sorted(ours, key=lambda k: (k[1], order.index(k[0]), k[2])):
            kernel, tflops, ms, batch, heads = ours[key]
            fx = flex.get(key)
            backend, st = sdpa.get(key, ("", None))
            out.writerow([key[0], key[1], key[2], batch, heads, kernel, f"{ms:.4g}", f"{tflops:.1f}",
                          f"{fx:.1f}" if fx else "", f"{tflops / fx:.2f}" if fx else "", backend,
                          f"{st:.1f}" if st else "", f"{tflops / st:.2f}" if st else "",
                          f"{ampere[key]:.1f}" if key in ampere else ""] +
                         (plain_columns(plain.get((key[1], causal[key], key[2], batch, heads)), tflops)
                          if args.plain else []))
    print(f"features_report: {len(ours)} points -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
