#!/usr/bin/env python3
"""The chapter tour (`make run`): every built chapter program at its default shape, then one table.

Each program prints its own output as it goes; it also appends its result rows to a CSV, which
this script joins into one table: chapter, kernel, device, rel. error vs the fp64 oracle, time,
GFLOP/s, and the speed-up over chapter 01 on the same device. Extra arguments are passed to every
program (e.g. `tools/tour.py --build-dir build -- --iters 5`).
"""
import argparse
import csv
import glob
import os
import shutil
import subprocess
import sys
import tempfile


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", default="build")
    parser.add_argument("--csv", help="also keep every program's result rows in this CSV (docs/results/)")
    parser.add_argument("program_args", nargs="*", help="passed to every chapter program (after --)")
    args = parser.parse_args()

    programs = sorted(p for p in glob.glob(os.path.join(args.build_dir, "bin", "ch[0-9][0-9]_*")) if os.access(p, os.X_OK))
    if not programs:
        print(f"tour: no chapter programs in {args.build_dir}/bin; run `make build` first", file=sys.stderr)
        return 2

    with tempfile.TemporaryDirectory() as tmp:
        csv_path = os.path.join(tmp, "tour.csv")
        failed = []
        for program in programs:
            name = os.path.basename(program)
            print(f"\n===== {name} =====", flush=True)
            status = subprocess.call([program, "--csv", csv_path, *args.program_args])
            if status != 0:
                failed.append(f"{name} (exit {status})")
        rows = list(csv.DictReader(open(csv_path))) if os.path.exists(csv_path) else []
        if args.csv and os.path.exists(csv_path):
            shutil.copyfile(csv_path, args.csv)

    print("\n===== tour =====")
    if rows:
        shapes = sorted({(r["device"], f"b{r['batch']} h{r['heads_q']}/{r['heads_kv']} q{r['seq_q']} k{r['seq_kv']} "
                          f"d{r['head_dim']}{' causal' if r['causal'] == '1' else ''}") for r in rows})
        for device, shape in shapes:
            print(f"{device}: {shape}")
        print()
    header = ["chapter", "kernel", "device", "status", "rel err", "time ms", "GFLOP/s", "vs ch01"]
    table = [header]
    baseline = {}  # device -> chapter 01's time
    for r in rows:
        if r["chapter"] == "1" and r["time_ms"] and r["device"] not in baseline:
            baseline[r["device"]] = float(r["time_ms"])
    for r in rows:
        ms = float(r["time_ms"]) if r["time_ms"] else None
        gflops = f"{float(r['tflops']) * 1000:.1f}" if r["tflops"] else "-"
        speedup = f"{baseline[r['device']] / ms:.2f}x" if ms and r["device"] in baseline else "-"
        rel = f"{float(r['rel_err']):.1e}" if r["rel_err"] else "-"
        table.append([f"{int(r['chapter']):02d}", r["kernel"], r["device"], r["status"], rel,
                      f"{ms:.3f}" if ms else "-", gflops, speedup])
    widths = [max(len(row[c]) for row in table) for c in range(len(header))]
    for i, row in enumerate(table):
        print("  ".join(cell.ljust(w) if c < 4 else cell.rjust(w) for c, (cell, w) in enumerate(zip(row, widths))))
        if i == 0:
            print("-" * (sum(widths) + 2 * (len(widths) - 1)))
    phases = [r for r in rows if r.get("phases")]
    if phases:
        print("\nwhere the time goes (one launch):")
        for r in phases:
            print(f"  {r['kernel']}: {r['phases']}")
    for r in rows:
        if r["status"] not in ("ok",):
            print(f"  {r['kernel']} ({r['device']}): {r['status']} {r['note']}")
    if failed:
        print("programs that reported a failure: " + ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
