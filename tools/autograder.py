#!/usr/bin/env python3
"""make autograder: the zip to upload to Gradescope as a programming assignment's autograder.

Usage: python3 tools/autograder.py [--out build/autograder.zip]

The zip holds the instructor's tree (the files git tracks, as they are in the working tree; every
file outside .git and build folders where there is no git) and, at its top level, Gradescope's
pair classroom/gradescope/setup.sh and run_autograder. Gradescope unpacks it into
/autograder/source, runs setup.sh once, then run_autograder for each submission: the CPU
exercises are graded there, the GPU ones listed as not graded (Gradescope has no GPU). The tree
must be the instructor's (classroom/instructor/ present, no .handout file): the grader builds
its checker and the handout's stubs from it, and a student copy holds no solutions to check with.
"""
import argparse
import os
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAIR = ("classroom/gradescope/setup.sh", "classroom/gradescope/run_autograder")
SKIP_DIRS = {".git", ".deps", "__pycache__"}


def tree_files(root):
    """The tree's files: `git ls-files` in a git checkout, else every file outside .git, build
    folders and __pycache__."""
    try:
        listed = subprocess.run(["git", "-C", root, "ls-files", "-z"], check=True, capture_output=True).stdout
        return sorted(p for p in listed.decode().split("\0") if p and os.path.isfile(os.path.join(root, p)))
    except (OSError, subprocess.CalledProcessError):
        files = []
        for base, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith("build")]
            files += [os.path.relpath(os.path.join(base, n), root) for n in names]
        return sorted(files)


def make_zip(root, out):
    if not os.path.isdir(os.path.join(root, "classroom", "instructor")) or os.path.exists(os.path.join(root, ".handout")):
        raise SystemExit(f"autograder: error: {root} is not the instructor's tree (classroom/instructor/ is missing "
                         "or .handout is there): make the autograder from the instructor's repository, never from a handout")
    for rel in PAIR:
        if not os.path.isfile(os.path.join(root, rel)):
            raise SystemExit(f"autograder: error: {rel} is missing")
    out = os.path.abspath(out)
    top = {os.path.basename(rel) for rel in PAIR}  # names the pair takes at the zip's top level
    files = [rel for rel in tree_files(root) if rel not in top and os.path.join(root, rel) not in (out, out + ".partial")]
    os.makedirs(os.path.dirname(out), exist_ok=True)
    partial = out + ".partial"
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
        for rel in files:
            z.write(os.path.join(root, rel), rel)  # keeps each file's mode (run_autograder stays executable)
        for rel in PAIR:
            z.write(os.path.join(root, rel), os.path.basename(rel))
    os.replace(partial, out)
    return len(files) + len(PAIR)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "build", "autograder.zip"))
    parser.add_argument("--root", default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args()
    count = make_zip(os.path.abspath(args.root), args.out)
    print(f"autograder: {os.path.abspath(args.out)} written ({count} files; setup.sh and run_autograder at its top "
          "level): upload it as the autograder, base image Ubuntu 22.04")
    return 0


if __name__ == "__main__":
    sys.exit(main())
