#!/usr/bin/env python3
"""make grade: build, run the tests, and score the exercises of classroom/exercises.json.

Usage: python3 tools/grade.py [--build-dir build] [--out results.json] [--config FILE]
                              [--junit FILE] [--timeout SECONDS]

Writes Gradescope's results.json (tests[] with name, score, max_score, status, output; top-level
score, execution_time, output) and prints a summary. An exercise's score is its points times
the fraction of its tests that passed. It never crashes on a broken submission:
  * the build fails: every exercise scores 0 with the build log's tail as the reason;
  * a test crashes or runs past --timeout: that test fails, with CTest's reason;
  * an exercise's tests were skipped (no GPU, say): 0, with the skip reason.
With --junit FILE the tests are not run: FILE (CTest's --output-junit) is scored as it is.
With --submission DIR (a student's tree) the files holding the exercises' solution regions are
taken from DIR into a copy of this tree, so the student's code meets the instructor's tests.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_OUTPUT = 4000  # characters of test output kept per exercise


def overlay_submission(root, submission, work, exercises):
    """A copy of the instructor's tree `root` in `work`, with the files that hold the exercises'
    solution regions taken from `submission` (the student's tree): the student's code is graded
    by the instructor's tests. Returns the files taken; a missing one is an error."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import handout

    files = handout.exercise_files(root)
    wanted = sorted({f for ex in exercises for f in files.get(ex["id"], [])})
    missing = [f for f in wanted if not os.path.isfile(os.path.join(submission, f))]
    if missing:
        raise FileNotFoundError("the submission lacks " + ", ".join(missing))
    for rel in handout.tracked_files(root):
        src = os.path.join(submission if rel in wanted else root, rel)
        if os.path.isfile(src):
            os.makedirs(os.path.dirname(os.path.join(work, rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(work, rel))
    return wanted


def read_junit(path):
    """[(name, status, output)] with status passed / failed / skipped."""
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        failure = case.find("failure")
        skipped = case.find("skipped")
        if failure is not None:
            status = "failed"
        elif skipped is not None or case.get("status") in ("notrun", "disabled"):
            status = "skipped"
        else:
            status = "passed"
        output = "".join(e.text or "" for e in case.iter("system-out"))
        if failure is not None and failure.get("message"):
            output = failure.get("message") + "\n" + output
        cases.append((case.get("name"), status, output))
    return cases


def score(exercises, cases, build_error=None):
    """The results.json dictionary."""
    tests, total = [], 0.0
    for number, ex in enumerate(exercises, 1):
        entry = {"name": f"{ex['id']}: {ex['title']}", "number": str(number), "max_score": ex["points"]}
        if build_error is not None:
            entry.update(score=0, status="failed", output="the build failed, so nothing ran:\n" + build_error[-MAX_OUTPUT:])
            tests.append(entry)
            continue
        pattern = re.compile(ex["tests"])
        mine = [c for c in cases if pattern.search(c[0])]
        passed = [c for c in mine if c[1] == "passed"]
        failed = [c for c in mine if c[1] == "failed"]
        skipped = [c for c in mine if c[1] == "skipped"]
        lines = [f"{len(passed)} of {len(mine)} tests passed" + (f", {len(skipped)} skipped" if skipped else "")]
        if not mine:
            lines = ["no test matched this exercise's pattern: " + ex["tests"]]
        for name, status, output in failed + skipped:
            # GoogleTest's banner lines ("[ RUN ]", "Running main() ...") say nothing about why.
            reason = [l for l in output.strip().splitlines()
                      if l.strip() and not l.startswith(("[", "Running main()", "Note: Google Test filter"))]
            lines.append(f"{status.upper()}: {name}" + (f"\n  {reason[-1] if status == 'skipped' else chr(10).join(reason[:12])}" if reason else ""))
        value = round(ex["points"] * len(passed) / len(mine), 4) if mine else 0
        total += value
        entry.update(score=value, status="passed" if mine and len(passed) == len(mine) else "failed",
                     output="\n".join(lines)[:MAX_OUTPUT])
        tests.append(entry)
    possible = sum(ex["points"] for ex in exercises)
    return {"score": round(total, 4), "output": f"{round(total, 4):g} of {possible:g} points", "tests": tests,
            "visibility": "visible", "stdout_visibility": "visible"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    parser.add_argument("--out", default="results.json")
    parser.add_argument("--config", default=os.path.join(ROOT, "classroom", "exercises.json"))
    parser.add_argument("--junit", help="score this CTest JUnit file instead of building and running")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per test (default 300)")
    parser.add_argument("--submission", help="a student's tree: grade its exercise files in a copy of this tree")
    args = parser.parse_args()
    start = time.time()
    try:
        with open(args.config) as f:
            exercises = json.load(f)["exercises"]
    except (OSError, ValueError, KeyError) as e:
        print(f"grade: error: config {args.config}: {e}", file=sys.stderr)
        return 1
    build_error, cases, tree = None, [], ROOT
    if args.submission:
        tree = tempfile.mkdtemp(prefix="fa_grade_tree_")
        try:
            taken = overlay_submission(ROOT, args.submission, tree, exercises)
            print("grade: the submission's " + ", ".join(taken))
        except OSError as e:
            build_error = f"could not take the submission's files: {e}"
    if args.junit:
        cases = read_junit(args.junit)
    elif build_error is None:
        built = subprocess.run(["make", "-C", tree, "build", f"BUILD_DIR={os.path.abspath(args.build_dir)}"],
                               capture_output=True, text=True)
        if built.returncode != 0:
            build_error = built.stdout[-2000:] + built.stderr[-2000:]
        else:
            junit = os.path.join(tempfile.mkdtemp(prefix="fa_grade_"), "tests.xml")
            subprocess.run(["ctest", "--test-dir", args.build_dir, "--timeout", str(args.timeout), "--output-junit", junit],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            cases = read_junit(junit) if os.path.exists(junit) else []
    results = score(exercises, cases, build_error)
    results["execution_time"] = round(time.time() - start, 1)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
        f.write("\n")
    for t in results["tests"]:
        print(f"{t['score']:>7g} / {t['max_score']:<5g} {t['name']}")
        print("          " + t["output"].splitlines()[0])
    print(f"grade: {results['output']}; {args.out} written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
