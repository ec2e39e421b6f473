#!/usr/bin/env python3
"""The README's Layout map against the tree: every file of common/, of each chapter folder, of
tools/, classroom/ (and its grader/, grader/cases/, grader/tasks/, gradescope/ and instructor/,
where they exist), python/attention_kernels/, python/csrc/ and examples/ is named in it, and every file it
names exists.
A file is named by its name (the files of docs/, python/ and tests/ may be named too), or as a
second suffix after one named stem ("tma.h/.cpp" names tma.h and tma.cpp). A chapter's own files
must be named in that chapter's entry ("  07 backward   ..." and its continuation lines), except
the three every chapter has (README.md, algorithm.h, main.cu), which the chapters/ line names once.
Exits 1 listing what differs."""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKED = ["common", "tools", os.path.join("python", "attention_kernels"), os.path.join("python", "csrc"), "examples",
           "classroom"] + [
    os.path.join("classroom", *d) for d in (("grader",), ("grader", "cases"), ("grader", "tasks"), ("gradescope",),
                                            ("instructor",))]
# A file's name with its extension, or Gradescope's run_autograder (which has none).
NAME = re.compile(r"[\w.+-]+\.(?:h|cuh|cu|cpp|py|sh|md|map|toml|csv|json)\b(?:/\.\w+)*|\brun_autograder\b")


def layout_block(readme):
    text = open(readme).read()
    section = text[text.index("## Layout"):]
    section = section[:section.index("\n## ", 1)] if "\n## " in section[1:] else section
    return section[section.index("```\n") + 4:section.index("\n```", section.index("```\n") + 4)]


def named_files(block):
    names = set()
    for token in NAME.findall(block):
        parts = token.split("/")
        first = parts[0]
        names.add(first)
        stem = first.rsplit(".", 1)[0]
        for suffix in parts[1:]:  # "tma.h/.cpp"
            names.add(stem + suffix)
    return names


CHAPTER_ENTRY = re.compile(r"^  (\d\d) \w+")
EVERY_CHAPTER = {"README.md", "algorithm.h", "main.cu"}


def chapter_entries(block):
    """{"07": names in chapter 07's entry}: the entry's first line and the deeper-indented lines
    after it."""
    entries, current = {}, None
    for line in block.split("\n"):
        m = CHAPTER_ENTRY.match(line)
        if m:
            current = m.group(1)
            entries[current] = named_files(line[len(m.group(0)):])
        elif current and line.startswith(" " * 10):
            entries[current] |= named_files(line)
        else:
            current = None
    return entries


def tree_files(root):
    files = {}
    dirs = [os.path.join(root, d) for d in CHECKED if os.path.isdir(os.path.join(root, d))]
    dirs += sorted(os.path.join(root, "chapters", d) for d in os.listdir(os.path.join(root, "chapters"))
                   if re.match(r"\d\d_", d))
    for d in dirs:
        for name in sorted(os.listdir(d)):
            path = os.path.join(d, name)
            if os.path.isfile(path) and not name.startswith(".") and not name.endswith(".pyc"):
                files.setdefault(name, []).append(os.path.relpath(path, root))
    return files


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else ROOT
    named = named_files(layout_block(os.path.join(root, "README.md")))
    files = tree_files(root)
    missing = sorted(p for name, paths in files.items() if name not in named for p in paths)
    entries = chapter_entries(layout_block(os.path.join(root, "README.md")))
    for name, paths in files.items():
        for p in paths:
            parts = p.split(os.sep)
            if parts[0] != "chapters" or name in EVERY_CHAPTER or p in missing:
                continue
            number = parts[1][:2]
            if name not in entries.get(number, set()):
                missing.append(p)
    missing.sort()
    elsewhere = {name for d in ("docs", "python", "tests") for name in os.listdir(os.path.join(root, d))}
    if os.path.exists(os.path.join(root, ".handout")):
        # A student handout leaves out the instructor's budget, the diagram scripts and the
        # instructor's folder (handout.py), which the README still names.
        sys.path.insert(0, os.path.join(root, "classroom"))
        import handout

        left_out = (handout.KERNEL_BUDGET,) + handout.DIAGRAM_SCRIPTS
        elsewhere |= {os.path.basename(p) for p in left_out}
        elsewhere |= set(re.findall(r"instructor/([\w.+-]+)", layout_block(os.path.join(root, "README.md"))))
    extra = sorted(n for n in named if n not in files and n not in elsewhere)
    for p in missing:
        print(f"check_layout: {p} is not in the README's Layout map")
    for n in extra:
        print(f"check_layout: the README's Layout map names {n}, which is not in the tree")
    if missing or extra:
        return 1
    print(f"check_layout: the README's Layout map names all {sum(len(p) for p in files.values())} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
