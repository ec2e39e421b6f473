#!/usr/bin/env python3
"""Keeps the code shown in the docs identical to the real source.

A markdown file shows a region of a source file like this:

    <!-- snippet: chapters/01_naive_attention/naive_attention.cu naive_softmax -->
    ```cpp
    ...the lines between the two `//! [naive_softmax]` markers, de-indented...
    ```

The markers are Doxygen's (`\\snippet` uses the same ones). `check_snippets.py` fails, naming
each stale block, when a block differs from its region, and when a `<!-- snippet: ... -->` line has
no code block right after it (the page would show nothing); `--fix` rewrites the blocks from the
source and fills in the missing ones.
"""
import argparse
import glob
import os
import re
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCK = re.compile(r"<!-- snippet: (\S+) (\S+) -->\n```(\w*)\n(.*?)```", re.S)
MARKER = re.compile(r"<!-- snippet: (\S+) (\S+) -->\n(?!```)")


SOLUTION_MARKER = re.compile(r"^\s*// (BEGIN|END) SOLUTION\b")


def region(path, name, root=ROOT):
    """The code between the two `//! [name]` lines of `path`, dedented; an exercise's
    BEGIN/END SOLUTION lines are left out (a handout shows its stub in their place)."""
    with open(os.path.join(root, path)) as f:
        lines = [line for line in f.read().split("\n") if not SOLUTION_MARKER.match(line)]
    marker = f"//! [{name}]"
    where = [i for i, line in enumerate(lines) if line.strip() == marker]
    if len(where) != 2:
        raise ValueError(f"{path}: expected 2 '{marker}' lines, found {len(where)}")
    code = textwrap.dedent("\n".join(lines[where[0] + 1:where[1]])) + "\n"
    # A region that opens more braces than it closes would show a function or loop cut short.
    if code.count("{") != code.count("}"):
        raise ValueError(f"{path}: region [{name}] has unbalanced braces; move its closing marker")
    return code


def doc_pages(root):
    """Every markdown page a reader sees: the top level, the chapters, docs/."""
    return sorted(glob.glob(os.path.join(root, "*.md")) + glob.glob(os.path.join(root, "chapters", "*", "*.md")) +
                  glob.glob(os.path.join(root, "docs", "**", "*.md"), recursive=True))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fix", action="store_true", help="rewrite stale blocks from the source")
    parser.add_argument("--root", default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args()
    stale, count = sync(args.root, args.fix)
    if stale and not args.fix:
        print("\n".join(stale))
        print(f"{len(stale)} of {count} snippets are stale; run tools/check_snippets.py --fix")
        return 1
    print(f"{count} snippets checked" + (f", {len(stale)} rewritten" if args.fix and stale else ", all match the source"))
    return 0


def sync(root, fix):
    """([what is stale], snippets seen) over the tree's pages; with fix, the pages are rewritten
    from the sources (classroom/handout.py does this in a student copy, so its pages show the stubs)."""
    docs = doc_pages(root)
    stale, count = [], 0
    for doc in docs:
        with open(doc) as f:
            text = f.read()

        def replace(m):
            nonlocal count
            count += 1
            try:
                code = region(m.group(1), m.group(2), root)
            except (OSError, ValueError) as e:
                stale.append(f"{os.path.relpath(doc, root)}: {e}")
                return m.group(0)
            if code != m.group(4):
                stale.append(f"{os.path.relpath(doc, root)}: snippet {m.group(1)} [{m.group(2)}] differs from the source")
            return f"<!-- snippet: {m.group(1)} {m.group(2)} -->\n```{m.group(3)}\n{code}```"

        new = BLOCK.sub(replace, text)
        for m in MARKER.finditer(new):  # a marker with no code block after it shows an empty snippet
            line = new[:m.start()].count("\n") + 1
            stale.append(f"{os.path.relpath(doc, root)}:{line}: snippet {m.group(1)} [{m.group(2)}] has no code block "
                         "after its marker")

        def fill(m):
            try:
                code = region(m.group(1), m.group(2), root)
            except (OSError, ValueError):
                return m.group(0)
            return f"<!-- snippet: {m.group(1)} {m.group(2)} -->\n```cpp\n{code}```\n"

        new = MARKER.sub(fill, new)
        if fix and new != text:
            with open(doc, "w") as f:
                f.write(new)
    return stale, count


if __name__ == "__main__":
    sys.exit(main())
