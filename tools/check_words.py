#!/usr/bin/env python3
"""Fails when a file a learner reads speaks of how the project was made instead of what it is.

Docs, code comments, results files and scripts describe the kernels, the measurements and the
course; a result is stated as what it is (the GPU, the date, the command). Words that date a
statement by the work that produced it (a numbered work period, a ticket number, a version of the
code that no longer exists, a run named by when it happened) make the reader ask "earlier than
what?", so this check rejects them (RULES below) in every tracked text file. Usage: python3 tools/check_words.py [FILE...]   (no FILE: every tracked text file)
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (pattern, what to write instead)
RULES = [
    (r"\bsessions?\b", "state the GPU, the date and the command instead of when the work happened"),
    (r"\bissues?\s*#?\d+", "say what the requirement is, not which ticket asked for it"),
    (r"\b(first|earlier|previous|older|initial) (version|draft|attempt|implementation)s?\b",
     "describe the code as it is; a discarded design goes to the performance notes as what/measured/why not"),
    (r"\b(an? |the )?(earlier|previous|exploration|exploratory|later) runs?\b",
     "name the run by what it is: GPU, command, date"),
    (r"\btried in the same\b", "say what was measured, not when"),
    (r"\b(this|next|last) sprint\b", "describe the project, not its schedule"),
]
TEXT = (".md", ".cu", ".cuh", ".h", ".cpp", ".py", ".sh", ".txt", ".csv", ".json", ".cmake", ".yml", ".yaml")
NAMES = ("CMakeLists.txt", "Makefile", "run")
SELF = {"tools/check_words.py"}


def tracked():
    """Every file git tracks (or, outside a git checkout, every file under ROOT)."""
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        files = out.split("\n")
    except (OSError, subprocess.CalledProcessError):  # a handout tree: no git; skip build folders
        files = []
        for folder, subfolders, names in os.walk(ROOT):
            subfolders[:] = [d for d in subfolders if not d.startswith((".", "build", "_deps", "CMakeFiles"))]
            files += [os.path.relpath(os.path.join(folder, n), ROOT) for n in names]
    return [f for f in files if f and (f.endswith(TEXT) or os.path.basename(f) in NAMES) and f not in SELF]


def check(path, text):
    found = []
    for number, line in enumerate(text.split("\n"), 1):
        for pattern, advice in RULES:
            m = re.search(pattern, line, re.I)
            if m:
                found.append(f"{path}:{number}: '{m.group(0)}': {advice}")
    return found


def main(argv):
    files = argv or tracked()
    found = []
    for path in files:
        full = path if os.path.isabs(path) else os.path.join(ROOT, path)
        if not os.path.isfile(full):
            continue
        try:
            text = open(full, encoding="utf-8").read()
        except UnicodeDecodeError:
            continue
        found += check(path, text)
    if found:
        print("\n".join(found))
        print(f"check_words: {len(found)} lines speak of how the project was made; see tools/check_words.py")
        return 1
    print(f"check_words: {len(files)} files, none speaks of how the project was made")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
