#!/usr/bin/env python3
"""Grade a folder of submissions on one machine (a GPU machine grades the GPU exercises too).

    python3 tools/grade_batch.py SUBMISSIONS --out GRADES [--time-limit SECONDS] [--cpu-only]
                                 [--build-dir DIR] [--cmake-args "..."] [--timeout SECONDS]

SUBMISSIONS holds one entry per student: a folder (their tree, or just the files they edited)
or a .zip of it; the entry's name, less ".zip", names the student. Each is graded by
tools/grade.py in a process of its own, one after the other, with `--time-limit` seconds for the
whole grading (build included; default 1800): past it the student gets 0 and a line saying so.
GRADES/<student>/results.json is Gradescope's schema, GRADES/<student>/grade.log the grader's
log, and GRADES/gradebook.csv one row per student: the total, the points possible here, and
each exercise's score ("" for an exercise not graded on this machine). As root, each grading
builds and runs the student's code as a sandbox user of its own, which can read neither the
instructor's tree, nor SUBMISSIONS, nor GRADES (grade.py makes them so: mode 0700 on each).
"""
import argparse
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import grade  # noqa: E402
import handout  # noqa: E402


def students(folder):
    """(name, path) for each folder or .zip in `folder`, sorted by name; other entries are listed
    as skipped."""
    found, skipped = [], []
    for entry in sorted(os.listdir(folder)):
        path = os.path.join(folder, entry)
        if entry.startswith("."):
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            found.append((entry, path))
        elif entry.lower().endswith(".zip") and os.path.isfile(path):
            found.append((entry[:-4], path))
        else:
            skipped.append(entry)
    return found, skipped


def safe_name(name):
    """A student's folder name under GRADES: letters, digits, '.', '_', '-' only."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".")
    return cleaned or "student"


def failed_results(exercises, why, cpu_only):
    """results.json for a grading that did not finish: every exercise 0, with the reason (GPU
    exercises not graded here where there is no GPU)."""
    has_gpu = not cpu_only and grade.gpu_available()
    return grade.results_json(exercises, grade.refused_outcomes(exercises, has_gpu, why))


def grade_one(path, out_dir, args):
    """Runs grade.py on one submission within the time limit; returns its results dict."""
    os.makedirs(out_dir, exist_ok=True)
    results_path = os.path.join(out_dir, "results.json")
    if os.path.exists(results_path):
        os.remove(results_path)
    # Other students' submissions and results stay out of the sandbox user's reach.
    cmd = [sys.executable, os.path.join(ROOT, "tools", "grade.py"), "--submission", path, "--out", results_path,
           "--build-dir", args.build_dir, "--timeout", str(args.timeout), "--config", args.config,
           "--private", os.path.abspath(args.submissions), "--private", os.path.abspath(args.out)]
    if args.cpu_only:
        cmd.append("--cpu-only")
    if args.cmake_args:
        cmd.append("--cmake-args=" + args.cmake_args)
    exercises = handout.load_config(args.config)
    with open(os.path.join(out_dir, "grade.log"), "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
        try:
            proc.wait(timeout=args.time_limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            results = failed_results(exercises, f"grading stopped: it ran past the time limit of {args.time_limit} s "
                                                 "(build and every exercise together)", args.cpu_only)
            with open(results_path, "w") as f:
                json.dump(results, f, indent=1)
            return results
    try:
        with open(results_path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        results = failed_results(exercises, f"the grader stopped with status {proc.returncode} before writing a score; "
                                            "see grade.log", args.cpu_only)
        with open(results_path, "w") as f:
            json.dump(results, f, indent=1)
        return results


def gradebook_row(name, exercises, results):
    """One CSV row: the student, the total, the points possible here, then each exercise."""
    by_number = {t.get("number"): t for t in results.get("tests", [])}
    # A name a spreadsheet would read as a formula is written as text.
    row = ["'" + name if name[:1] in "=+-@\t\r" else name, f"{results.get('score', 0):g}"]
    possible = 0.0
    cells = []
    for number, ex in enumerate(exercises, 1):
        t = by_number.get(str(number))
        if t is None or t.get("max_score", 0) == 0:
            cells.append("")  # not graded on this machine
            continue
        possible += t["max_score"]
        cells.append(f"{t['score']:g}")
    return row + [f"{possible:g}"] + cells


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("submissions", help="a folder with one folder or .zip per student")
    parser.add_argument("--out", required=True, help="where results.json per student and gradebook.csv go")
    parser.add_argument("--time-limit", type=int, default=1800, help="seconds per student, build included (default 1800)")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per runner process (default 120)")
    parser.add_argument("--build-dir", default=None,
                        help="where CMake builds the GPU runners, reused from student to student (default: a new "
                             "folder only this user can enter)")
    parser.add_argument("--cmake-args", default="", help='passed to CMake, e.g. "-DFA_CUDA_ARCHITECTURES=90"')
    parser.add_argument("--cpu-only", action="store_true", help="grade the CPU exercises only, even with a GPU")
    parser.add_argument("--config", default=os.path.join(ROOT, "classroom", "exercises.json"))
    args = parser.parse_args()
    if not os.path.isdir(args.submissions):
        print(f"grade_batch: error: {args.submissions!r} is not a folder; give the folder that holds one folder or "
              ".zip per student", file=sys.stderr)
        return 2
    if args.time_limit < 60:
        print(f"grade_batch: error: --time-limit must be at least 60 seconds, got {args.time_limit}", file=sys.stderr)
        return 2
    found, skipped = students(args.submissions)
    for entry in skipped:
        print(f"grade_batch: skipping {entry!r}: neither a folder nor a .zip")
    if not found:
        print(f"grade_batch: error: {args.submissions!r} holds no folder or .zip to grade", file=sys.stderr)
        return 2
    exercises = handout.load_config(args.config)
    os.makedirs(args.out, exist_ok=True)
    own_build = None
    if args.build_dir is None:
        own_build = tempfile.mkdtemp(prefix="fa_grade_batch_")
        args.build_dir = os.path.join(own_build, "build")
    rows, used = [], set()
    for name, path in found:
        folder = safe_name(name)
        while folder in used:
            folder += "_"
        used.add(folder)
        print(f"grade_batch: grading {name} ...", flush=True)
        results = grade_one(os.path.abspath(path), os.path.join(args.out, folder), args)
        rows.append(gradebook_row(name, exercises, results))
        print(f"grade_batch: {name}: {results.get('output', '')}", flush=True)
    if own_build:
        shutil.rmtree(own_build, ignore_errors=True)
    book = os.path.join(args.out, "gradebook.csv")
    with open(book, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student", "score", "possible_here"] + [ex["id"] for ex in exercises])
        writer.writerows(rows)
    print(f"grade_batch: {len(rows)} submissions graded; {book}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
