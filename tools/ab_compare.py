#!/usr/bin/env python3
"""The ratios of an A/B made by tools/ab_bench.sh: for each (pass, kernel, head_dim, seq, causal)
timed on both sides, the best time of each side over its rounds, and B's speed over A's (A's time
over B's). Prints one line per kernel (points, lowest ratio and where, geometric mean) and one for
all points.

  ab_compare.py OUTDIR A B [--min 0.98]
"""
import argparse
import csv
import glob
import math
import os
import sys


def best_times(outdir):
    best = {}
    for path in glob.glob(os.path.join(outdir, "*_*_*.csv")):
        parts = os.path.basename(path)[:-len(".csv")].split("_")
        if len(parts) != 3:
            continue
        pass_name, tree, _ = parts
        for r in csv.DictReader(open(path, newline="")):
            if r["status"] != "ok" or not r["time_ms"]:
                continue
            key = (pass_name, r["kernel"], int(r["head_dim"]), int(r["seq_q"]), int(r["causal"]), r.get("features", ""))
            best[(tree, key)] = min(best.get((tree, key), math.inf), float(r["time_ms"]))
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir")
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--min", type=float, default=0.98, help="count the points below this ratio")
    args = parser.parse_args()
    best = best_times(args.outdir)
    keys = sorted({k for t, k in best if t == args.a} & {k for t, k in best if t == args.b})
    if not keys:
        sys.exit(f"ab_compare: no point timed by both {args.a} and {args.b} in {args.outdir}")
    by_kernel = {}
    for k in keys:
        by_kernel.setdefault(k[:2], []).append((k[2:5], best[(args.a, k)] / best[(args.b, k)]))
    print(f"pass,kernel,points,lowest,at,geomean   ({args.b} / {args.a}: speed ratio, best of each side's rounds)")
    logs = []
    for (pass_name, kernel), points in sorted(by_kernel.items()):
        ratios = [r for _, r in points]
        logs += [math.log(r) for r in ratios]
        (d, seq, causal), low = min(points, key=lambda p: p[1])
        geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        print(f"{pass_name},{kernel},{len(ratios)},{low:.3f},d{d} s{seq}{' causal' if causal else ''},{geo:.3f}")
    below = sum(1 for points in by_kernel.values() for _, r in points if r < args.min)
    print(f"all,{len(logs)} points,lowest {min(math.exp(x) for x in logs):.3f},"
          f"geomean {math.exp(sum(logs) / len(logs)):.3f},{below} below {args.min}")


if __name__ == "__main__":
    main()
