#!/usr/bin/env python3
"""make grade: build, run the tests, and score the exercises of classroom/exercises.json.

Usage: python3 tools/grade.py [--build-dir build] [--out results.json] [--config FILE]
                              [--junit FILE] [--timeout SECONDS] [--jobs N]
                              [--submission DIR] [--cmake-args "..."]

Writes Gradescope's results.json (tests[] with name, score, max_score, status, output; top-level
score, execution_time, output) and prints a summary. An exercise's score is its points times
the fraction of its tests that passed. It never crashes on a broken submission:
  * a submission's exercise does not compile: its regions are put back as the handout's stubs
    (the compiler's errors say which regions, by file and line), the tree is built again, and
    that exercise scores 0 with the errors as the reason while the others grade as usual;
  * the build fails otherwise: every exercise scores 0 with the build log's tail as the reason;
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


# A compiler's error line: nvcc's "path(12): error: ..." or gcc's "path:12:5: error: ...".
COMPILE_ERROR = re.compile(r"^(?P<path>[^\s:()][^:()\n]*?)(?:\((?P<nv>\d+)\):|:(?P<gcc>\d+):(?:\d+:)?) ?(?:fatal )?error\b.*$",
                           re.M)


def compile_errors(log, tree):
    """[(path relative to tree, line, the error line)] for the error lines of a build log."""
    out = []
    for m in COMPILE_ERROR.finditer(log):
        path = os.path.normpath(m.group("path"))
        if os.path.isabs(path):
            path = os.path.relpath(path, tree)
        text = m.group(0).strip()
        if text.startswith(os.path.join(tree, "")):
            text = text[len(os.path.join(tree, "")):]  # the grader's copy means nothing to a student
        out.append((path, int(m.group("nv") or m.group("gcc")), text))
    return out


def exercises_by_file(root):
    """{file: set of exercise ids with regions in it}, over the instructor's tree."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import handout

    by_file = {}
    for ex_id, files in handout.exercise_files(root).items():
        for rel in files:
            by_file.setdefault(rel, set()).add(ex_id)
    return by_file


def student_regions(tree, rel):
    """[(id, kind, first line, last line)] of the submitted file's marked regions ([] if unreadable)."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import handout

    regions = []
    try:
        with open(os.path.join(tree, rel), encoding="utf-8") as f:
            handout.stub_regions(f.read(), rel, set(), regions)
    except (OSError, UnicodeDecodeError, handout.HandoutError):
        return []
    return regions


def broken_exercises(errors, tree, by_file):
    """{exercise id: its error lines} for the errors that fall in the submission's files (the keys
    of `by_file`, each with the exercises it holds): an error inside a region (the handout keeps
    the BEGIN/END lines) blames that region's exercise; one elsewhere in such a file blames every
    exercise of the file. Errors in other files blame nobody."""
    blamed = {}
    for path, line, text in errors:
        if path not in by_file:
            continue
        inside = {r_id for r_id, _, first, last in student_regions(tree, path) if first <= line <= last}
        for ex_id in (inside & by_file[path]) or by_file[path]:
            blamed.setdefault(ex_id, []).append(text)
    return blamed


def stub_out(root, tree, by_file, ex_ids):
    """Puts the handout's stubs in place of the regions of `ex_ids` in the submitted files. A file
    whose markers for them are gone or broken is replaced by the instructor's file with all its
    exercises stubbed. Returns the ids stubbed (`ex_ids` and any such file's other exercises)."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import handout

    stubbed = set()
    for rel, holds in sorted(by_file.items()):
        wanted = holds & set(ex_ids)
        if not wanted:
            continue
        path = os.path.join(tree, rel)
        try:
            with open(path, encoding="utf-8") as f:
                text, found = handout.stub_regions(f.read(), rel, wanted)
            if not wanted <= set(found):
                raise handout.HandoutError(f"{rel}: markers missing")
            stubbed |= wanted
        except (OSError, UnicodeDecodeError, handout.HandoutError):
            with open(os.path.join(root, rel), encoding="utf-8") as f:
                text, _ = handout.stub_regions(f.read(), rel, holds)
            stubbed |= holds
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    return stubbed


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


def score(exercises, cases, build_error=None, broken=None):
    """The results.json dictionary. `broken`: {exercise id: compiler error lines} for exercises
    whose code did not compile (they score 0 with those lines)."""
    tests, total = [], 0.0
    for number, ex in enumerate(exercises, 1):
        entry = {"name": f"{ex['id']}: {ex['title']}", "number": str(number), "max_score": ex["points"]}
        if build_error is not None:
            entry.update(score=0, status="failed", output="the build failed, so nothing ran:\n" + build_error[-MAX_OUTPUT:])
            tests.append(entry)
            continue
        if broken and ex["id"] in broken:
            entry.update(score=0, status="failed",
                         output=("this exercise's code did not compile, so its tests ran the handout's stub:\n" +
                                 "\n".join(broken[ex["id"]][:20]))[:MAX_OUTPUT])
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
            if reason[:1] == ["Timeout"]:
                reason[0] = "Timeout: the test ran past the time limit (a loop that never ends? a kernel that hangs?)"
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
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="tests run at once (default: CPUs)")
    parser.add_argument("--cmake-args", default=os.environ.get("CMAKE_ARGS", ""),
                        help='passed to CMake; write it with =, e.g. --cmake-args="-DFA_CUDA_ARCHITECTURES=90" (default: $CMAKE_ARGS)')
    args = parser.parse_args()
    if args.jobs < 1 or args.timeout < 1:
        print(f"grade: error: --jobs ({args.jobs}) and --timeout ({args.timeout}) must be at least 1", file=sys.stderr)
        return 1
    start = time.time()
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import handout

    try:
        exercises = handout.load_config(args.config)  # the handout's checks: one-line errors
    except handout.HandoutError as e:
        print(f"grade: error: {e}", file=sys.stderr)
        return 1
    build_error, cases, tree, by_file, broken = None, [], ROOT, {}, {}
    if args.submission:
        tree = tempfile.mkdtemp(prefix="fa_grade_tree_")
        try:
            taken = overlay_submission(ROOT, args.submission, tree, exercises)
            print("grade: the submission's " + ", ".join(taken))
            ids = {ex["id"] for ex in exercises}
            by_file = {rel: held & ids for rel, held in exercises_by_file(ROOT).items() if rel in taken}
        except OSError as e:
            build_error = f"could not take the submission's files: {e}"
    build_dir = os.path.abspath(args.build_dir)
    if args.junit:
        cases = read_junit(args.junit)
    elif build_error is None:
        while True:
            print("grade: building" + (" again with the stubs of " + ", ".join(sorted(broken)) if broken else ""), flush=True)
            built = subprocess.run(["make", "-C", tree, "build", f"BUILD_DIR={build_dir}", f"CMAKE_ARGS={args.cmake_args}"],
                                   capture_output=True, text=True)
            if built.returncode == 0:
                break
            log = built.stdout + built.stderr
            blamed = broken_exercises(compile_errors(log, tree), tree, by_file)
            if not blamed or set(blamed) <= set(broken):
                build_error = built.stdout[-2000:] + built.stderr[-2000:]
                break
            for ex_id in stub_out(ROOT, tree, by_file, blamed):
                broken.setdefault(ex_id, []).extend(
                    blamed.get(ex_id, ["(its file's BEGIN/END SOLUTION lines were missing, so the whole file was "
                                       "replaced by the handout's)"]))
        if build_error is None:
            junit = os.path.join(tempfile.mkdtemp(prefix="fa_grade_"), "tests.xml")
            print(f"grade: running the tests ({args.jobs} at a time, {args.timeout} s each at most)", flush=True)
            subprocess.run(["ctest", "--test-dir", build_dir, "-j", str(args.jobs), "--timeout", str(args.timeout),
                            "--output-junit", junit], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            cases = read_junit(junit) if os.path.exists(junit) else []
    results = score(exercises, cases, build_error, broken)
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
