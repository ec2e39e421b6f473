#!/usr/bin/env python3
"""CI check of `make handout`: build the student tree and run its tests.

Usage: python3 classroom/check_handout.py [DEST]   (default: a fresh temporary folder)

Passes when the handout builds, every test of an exercise (the config's `tests` pattern) fails
with "not implemented: <id>: ..." or skips (a kernel skips a shape it does not take), and every
other test passes or skips. Without a GPU, a GPU exercise's tests skip before they reach the
stub: that is allowed, and said, so run this on a GPU machine too to check the GPU exercises
(CMAKE_ARGS in the environment reaches the handout's build, e.g. its CUDA architectures). The
handout is built without -Werror: a stub leaves its function's parameters unused, which is a
warning the student's code will remove.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "classroom"))
import grade  # noqa: E402  (its JUnit reader)


def run(cmd, **kw):
    print("+ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, **kw)


def main():
    """The handout in the folder given, or in a temporary one that goes away afterwards (a built
    handout takes more than a gigabyte)."""
    if len(sys.argv) > 1:
        return check(sys.argv[1])
    tmp = tempfile.mkdtemp(prefix="fa_handout_")
    try:
        return check(os.path.join(tmp, "handout"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check(dest):
    if run([sys.executable, os.path.join(ROOT, "classroom", "handout.py"), dest]).returncode != 0:
        return 1
    jobs = str(os.cpu_count() or 2)
    if run(["make", "-C", dest, "build", f"JOBS={jobs}"], stdout=subprocess.DEVNULL).returncode != 0:
        print("check_handout: the handout does not build", file=sys.stderr)
        return 1
    junit = os.path.join(dest, "build", "handout_tests.xml")
    run(["ctest", "--test-dir", os.path.join(dest, "build"), "-j", jobs, "--output-junit", junit],
        stdout=subprocess.DEVNULL)
    with open(os.path.join(ROOT, "classroom", "exercises.json")) as f:
        exercises = json.load(f)["exercises"]
    patterns = [(ex["id"], re.compile(ex["tests"])) for ex in exercises]
    problems, counts = [], {"exercise failed as expected": 0, "exercise skipped (no GPU)": 0, "passed": 0, "skipped": 0}
    not_checked = {ex["id"]: 0 for ex in exercises}
    per_exercise = {ex["id"]: 0 for ex in exercises}
    stub_message = re.compile("not implemented: (" + "|".join(re.escape(ex["id"]) for ex in exercises) + "):")
    for name, status, output in grade.read_junit(junit):
        owners = [ex_id for ex_id, pattern in patterns if pattern.search(name)]
        if owners:
            for owner in owners:
                per_exercise[owner] += 1
            if status == "skipped" and "no GPU" in output:
                counts["exercise skipped (no GPU)"] += 1
                for owner in owners:
                    not_checked[owner] += 1
            elif status == "skipped":
                # A shape the kernel does not take (it says so before it runs): not a stub's doing.
                counts["skipped"] += 1
                for owner in owners:
                    not_checked[owner] += 1
            elif status != "failed":
                problems.append(f"{name}: exercise {owners[0]}'s test {status} in the handout")
            elif not stub_message.search(output):
                # A test can stop at the stub of an exercise it reaches first (chapter 02's CPU
                # softmax runs chapter 01's scores), so any exercise's stub message will do.
                problems.append(f"{name}: failed without a 'not implemented: <exercise>:' line in its output")
            else:
                counts["exercise failed as expected"] += 1
        elif status == "failed":
            problems.append(f"{name}: failed in the handout but belongs to no exercise")
        else:
            counts[status] += 1
    for ex_id, n in per_exercise.items():
        if n == 0:
            problems.append(f"exercise {ex_id}: its tests pattern matches no test")
        elif not_checked[ex_id] == n:
            print(f"check_handout: exercise {ex_id}: all {n} of its tests skip here (no GPU, or shapes its kernels do "
                  "not take), so its stub is not checked here")
    print("check_handout: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    for p in problems:
        print("check_handout: " + p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
