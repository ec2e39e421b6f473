#!/usr/bin/env python3
"""make autograder: the zip to upload to Gradescope as a programming assignment's autograder.

Usage: python3 classroom/autograder.py [--out build/autograder.zip] [--week N | --config PATH]

The zip holds the instructor's tree (the files git tracks or would add, as they are in the working
tree; every file outside .git and build folders where there is no git) and, at its top level, Gradescope's
pair classroom/gradescope/setup.sh and run_autograder. Gradescope unpacks it into
/autograder/source, runs setup.sh once, then run_autograder for each submission: the CPU
exercises are graded there, the GPU ones listed as not graded (Gradescope has no GPU). The tree
must be the instructor's (classroom/instructor/ present, no .handout file): the grader builds
its checker and the handout's stubs from it, and a student copy holds no solutions to check with.

With --week N (the exercises whose `week` in classroom/exercises.json is N) or --config PATH (a
config that lists exercise ids, or entries of classroom/exercises.json), the zip also holds
classroom/assignment.json, the list of those ids: run_autograder grades them alone, and the
score's total is theirs. Without either, every exercise is graded.
"""
import argparse
import json
import os
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "classroom"))
import handout  # noqa: E402

PAIR = ("classroom/gradescope/setup.sh", "classroom/gradescope/run_autograder")
ASSIGNMENT = "classroom/assignment.json"  # the graded exercises' ids, when the zip is one assignment's
SKIP_DIRS = {".git", ".deps", "__pycache__"}


def tree_files(root):
    """The tree's files: those git tracks or would add (new, not ignored) in a git checkout, as
    for the handout; else every file outside .git, build folders and __pycache__."""
    try:
        listed = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                check=True, capture_output=True).stdout
        return sorted({p for p in listed.decode().split("\0") if p and os.path.isfile(os.path.join(root, p))})
    except (OSError, subprocess.CalledProcessError):
        files = []
        for base, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith("build")]
            files += [os.path.relpath(os.path.join(base, n), root) for n in names]
        return sorted(files)


def assignment(root, week=None, config=None):
    """The assignment file's content for --week or --config (None for every exercise). Exits with
    one line when the week has no exercise or the config names one the tree does not have."""
    if week is None and config is None:
        return None
    try:
        every = handout.catalog(root)
        if config is not None:
            chosen = handout.load_config(config, root)
            known = {ex["id"] for ex in every}
            unknown = [ex["id"] for ex in chosen if ex["id"] not in known]
            if unknown:
                raise SystemExit(f"autograder: error: {config} names exercise '{unknown[0]}', which "
                                 f"classroom/exercises.json does not have; allowed: {', '.join(sorted(known))}")
            about = f"the exercises of {os.path.basename(config)}"
        else:
            chosen = [ex for ex in every if ex.get("week") == week]
            if not chosen:
                weeks = sorted({ex["week"] for ex in every if "week" in ex})
                raise SystemExit(f"autograder: error: no exercise has week {week}; the weeks in classroom/exercises.json "
                                 f"are {', '.join(str(w) for w in weeks) or 'none (no exercise has a week)'}")
            about = f"week {week}"
    except handout.HandoutError as e:
        raise SystemExit(f"autograder: error: {e}")
    return {"about": f"The exercises this autograder grades ({about}); run_autograder passes this file to "
                     "classroom/grade.py as --config.",
            "exercises": [ex["id"] for ex in chosen]}


def make_zip(root, out, selection=None):
    if not os.path.isdir(os.path.join(root, "classroom", "instructor")) or os.path.exists(os.path.join(root, ".handout")):
        raise SystemExit(f"autograder: error: {root} is not the instructor's tree (classroom/instructor/ is missing "
                         "or .handout is there): make the autograder from the instructor's repository, never from a handout")
    for rel in PAIR:
        if not os.path.isfile(os.path.join(root, rel)):
            raise SystemExit(f"autograder: error: {rel} is missing")
    out = os.path.abspath(out)
    top = {os.path.basename(rel) for rel in PAIR}  # names the pair takes at the zip's top level
    files = [rel for rel in tree_files(root) if rel not in top and rel != ASSIGNMENT
             and os.path.join(root, rel) not in (out, out + ".partial")]
    os.makedirs(os.path.dirname(out), exist_ok=True)
    partial = out + ".partial"
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
        for rel in files:
            z.write(os.path.join(root, rel), rel)  # keeps each file's mode (run_autograder stays executable)
        for rel in PAIR:
            z.write(os.path.join(root, rel), os.path.basename(rel))
        if selection is not None:
            z.writestr(ASSIGNMENT, json.dumps(selection, indent=2) + "\n")
    os.replace(partial, out)
    return len(files) + len(PAIR) + (selection is not None)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "build", "autograder.zip"))
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--week", type=int, help="grade only the exercises of this week (their 'week' field)")
    which.add_argument("--config", help="grade only the exercises this config lists (ids or entries)")
    parser.add_argument("--root", default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    selection = assignment(root, args.week, args.config)
    count = make_zip(root, args.out, selection)
    graded = "every exercise" if selection is None else ", ".join(selection["exercises"])
    print(f"autograder: {os.path.abspath(args.out)} written ({count} files; setup.sh and run_autograder at its top "
          f"level; it grades {graded}): upload it as the autograder, base image Ubuntu 22.04")
    return 0


if __name__ == "__main__":
    sys.exit(main())
