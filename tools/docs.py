#!/usr/bin/env python3
"""make docs: the HTML site (Doxygen) from the READMEs, the concept pages and common/'s headers.

Usage: python3 tools/docs.py [--out build/docs]

The markdown files stay the source; this writes Doxygen-ready copies of them into OUT/pages:
  * each page gets an id (`# Title {#ch03}`), and the main page lists the others in order
    (`\\subpage`), which is also the navigation tree; chapter pages end with previous/next links;
  * `$$ ... $$` becomes `\\f[ ... \\f]` (MathJax renders it, from Debian's libjs-mathjax copied
    next to the pages, so the site works offline);
  * a code block under `<!-- snippet: FILE NAME -->` becomes `\\snippet FILE NAME`: Doxygen takes
    the code from the source itself, between the two `//! [NAME]` lines;
  * links to other pages become `@ref` links, and a link to a heading (`glossary.md#warpgroup`,
    GitHub's anchor) becomes an `@ref` to a label this script puts on that heading (a link to a
    heading that does not exist is an error); links to source files become the file's name in
    code font (the site does not carry the sources); a link to a PNG or SVG (a plot) links to a
    copy of it next to the pages; web links stay;
  * a chapter's other pages (chapter 06's `fp8.md`, a `performance_notes.md`) are sub-pages of
    the chapter's page; concept pages (and the results' README, docs/results/h200/README.md) end
    with a link back to the main page; a record's markers (`<!-- record: ... -->`) go, like the
    figure markers, so that no word is glued to the next;
  * what Doxygen 1.9's markdown reads differently from GitHub is rewritten to read the same: code
    spans over several lines or with a quote in them, bold that starts with code or "(", an ordered list
    that does not start at 1, a paragraph line that starts with "160. ", a link whose label is code
    or spans two lines (fix_code_spans, fix_lines, convert_links).
Doxygen reads common/'s headers through `docs.py --filter`, which writes a flag in a `///` comment
(--variant) so that it prints as two hyphens, not an en dash. Then Doxygen runs with warnings as
errors. The site is OUT/html/index.html. Exit status is
non-zero, with Doxygen's warnings printed, when anything is wrong.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MATHJAX = "/usr/share/javascript/mathjax"
SNIPPET = re.compile(r"<!-- snippet: (\S+) (\S+) -->\n```\w*\n.*?```", re.S)
LINK = re.compile(r"(?<!!)\[([^\[\]]+)\]\(([^)\s]+)\)")  # a label holds no bracket: "[a, b)" is no link
IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def pages():
    """[(source file relative to ROOT, page id)] in the site's order; the first is the main page."""
    out = [("README.md", "index")]
    for readme in sorted(glob.glob(os.path.join(ROOT, "chapters", "*", "README.md"))):
        number = os.path.basename(os.path.dirname(readme)).split("_")[0]
        out.append((os.path.relpath(readme, ROOT), f"ch{number}"))
        for extra in sorted(glob.glob(os.path.join(os.path.dirname(readme), "*.md"))):
            if os.path.basename(extra) != "README.md":
                stem = os.path.splitext(os.path.basename(extra))[0]
                out.append((os.path.relpath(extra, ROOT), f"ch{number}_{stem}"))
    for doc in sorted(glob.glob(os.path.join(ROOT, "docs", "concepts", "*.md"))):
        out.append((os.path.relpath(doc, ROOT), os.path.splitext(os.path.basename(doc))[0]))
    out.append(("docs/python.md", "python"))
    out.append(("docs/course.md", "course"))
    out.append(("docs/grading.md", "grading"))
    out.append(("docs/results/h200/README.md", "results"))  # which page reads which result file
    return out


def convert_math(text):
    """$$ ... $$ (outside code blocks) to \\f[ ... \\f]."""
    out, in_code, buf = [], False, []
    for line in text.split("\n"):
        if FENCE.match(line.strip()):
            in_code = not in_code
        if not in_code:
            line = re.sub(r"\$\$(.*?)\$\$", r"\\f[\1\\f]", line)
            if "$$" in line:  # a formula over several lines
                line = line.replace("$$", "\\f]" if buf else "\\f[", 1)
                buf = [] if buf else [True]
        out.append(line)
    return "\n".join(out)


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def heading_label(page_id, anchor):
    return f"{page_id}_" + re.sub(r"[^A-Za-z0-9]", "_", anchor)


def headings(text):
    """GitHub anchors of the headings outside code blocks."""
    out, in_code = set(), False
    for line in text.split("\n"):
        if FENCE.match(line.strip()):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            out.add(slug(line.lstrip("#")))
    return out


def link_target(source, target, ids):
    """(page id or None, anchor or None) of a link in `source`."""
    path, _, anchor = target.partition("#")
    path = os.path.normpath(os.path.join(os.path.dirname(source), path)) if path else source
    return ids.get(path), anchor or None


def convert_links(text, source, ids, order):
    """Links to pages become @ref links; links to repository files become code; web links stay."""

    def ref(label, target):
        """[label](@ref target), in a form Doxygen 1.9 prints: it makes the link `\\ref target "label"`,
        so the label must be one line, and backticks in it would show as such."""
        code = re.fullmatch(r"`([^`]+)`", label)
        if code:  # all code: the code font goes around the link
            return f"<tt>[{code.group(1)}](@ref {target})</tt>"
        return f"[{label.replace('`', '')}](@ref {target})"

    def replace(m):
        label, target = " ".join(m.group(1).split()), m.group(2)
        if re.match(r"^[a-z]+://", target) or target.startswith("mailto:"):
            return m.group(0)
        page, anchor = link_target(source, target, ids)
        if page and anchor:
            if anchor not in order["anchors"][page]:
                raise ValueError(f"{source}: link '{target}': no heading with that anchor")
            order["labels"].add((page, anchor))
            return ref(label, heading_label(page, anchor))
        if page:
            return ref(label, page)
        path = os.path.normpath(os.path.join(os.path.dirname(source), target.partition("#")[0]))
        if re.search(r"\.(png|svg)$", path) and os.path.isfile(os.path.join(ROOT, path)):
            order.setdefault("linked", set()).add(path)  # a plot: main() copies it next to the pages
            return f"[{label}]({os.path.basename(path)})"
        return label if "`" in label else f"`{label}`"  # a file: its name in code font, no link

    return LINK.sub(replace, text)


CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
# Doxygen 1.9 opens bold (`**` after a space or an opening mark) only before a letter, a digit, `[`
# or one of -+!?$@&*%: not before code, a tag, a parenthesis or a quote (`**(a) Students ...**`
# stays as typed).
BOLD_ODD = re.compile(r"(?:^|(?<=[\s'<>{(\[,:;]))\*\*(?=[^\w\s\[\-+!?$@&*%])(.+?)\*\*")
# A record's markers (tools/figures.py): Doxygen drops the space after an HTML comment, which would
# glue the words on either side of one in the middle of a line.
RECORD = r"<!-- (?:record: (?:(?!-->).)*|/record) -->"
RECORD_MARK = re.compile(rf"^[ \t]*{RECORD}[ \t]*$|{RECORD}", re.S | re.M)  # a marker's own line goes blank
ORDERED = re.compile(r"^( *)(\d+)\. (.*)$")
BULLET = re.compile(r"^( *)[-*+] (.*)$")


def blocks(text):
    """The text as [(is_code, part)], parts of whole lines: the fenced code blocks and the text between."""
    out, lines, in_code = [], [], False
    for line in text.split("\n"):
        fence = FENCE.match(line.strip())
        if fence and not in_code and lines:
            out.append((False, "\n".join(lines)))
            lines = []
        lines.append(line)
        if fence and in_code:
            out.append((True, "\n".join(lines)))
            lines = []
        in_code = in_code != bool(fence)
    if lines:
        out.append((in_code, "\n".join(lines)))
    return out


def fix_code_spans(text):
    """Code spans the way GitHub reads them, written so that Doxygen 1.9 reads them the same:
      * a span over several lines goes on one line (Doxygen takes at most one line break);
      * a span with a quote that a non-word character follows (`--gtest_filter='x*'`) gets two
        backticks: Doxygen reads `text' with one backtick as a quotation, not as code."""

    def span(m):
        ticks, body = m.group(1), m.group(2)
        if re.search(r"\n\s*\n", body) or re.search(r"\n\s*\|", body):
            return m.group(0)  # not one span: a blank line or a table row in between
        body = re.sub(r"\s*\n\s*", " ", body)
        if len(ticks) == 1 and re.search(r"'(?![A-Za-z0-9_\x80-\U0010ffff])", body):
            ticks = "``"
        return f"{ticks}{body}{ticks}"

    return "\n".join(part if code else CODE_SPAN.sub(span, part) for code, part in blocks(text))


def fix_lines(text):
    """Line by line, outside code blocks, what Doxygen 1.9's markdown reads differently from GitHub:
      * `**` followed by code, a tag, a parenthesis or a quote opens no bold in Doxygen: such a bold
        span becomes <b>...</b>;
      * an ordered list keeps its first number (GitHub's `<ol start>`; Doxygen restarts at 1): the
        first item carries a marker that main() turns into the start attribute;
      * a line of a paragraph that starts with a number and a dot (`160. Predict`) is text on GitHub,
        where only a list starting at 1 can interrupt a paragraph, but a list item in Doxygen: its
        dot is escaped."""
    out, in_code, open_items, prev = [], False, [], ""
    for line in text.split("\n"):
        if FENCE.match(line.strip()):
            in_code = not in_code
        if in_code or FENCE.match(line.strip()):
            out.append(line)
            prev = line
            continue
        line = BOLD_ODD.sub(r"<b>\1</b>", line)
        indent = len(line) - len(line.lstrip(" "))
        paragraph = prev.strip() != "" and not re.match(r"\s*(#|\||<|```|~~~)", prev)
        item, bullet = ORDERED.match(line), BULLET.match(line)
        if item and int(item.group(2)) != 1 and paragraph and (not open_items or indent >= open_items[-1]):
            line = f"{item.group(1)}{item.group(2)}\\. {item.group(3)}"  # text, not a list
        elif item or bullet:
            while open_items and indent < open_items[-1]:
                open_items.pop()
            open_items.append(indent + (len(item.group(2)) + 2 if item else 2))
            if item and int(item.group(2)) != 1:
                line = f'{item.group(1)}{item.group(2)}. <span class="ol-start-{item.group(2)}"></span>{item.group(3)}'
        elif line.strip() and not prev.strip():
            while open_items and indent < open_items[-1]:
                open_items.pop()
        out.append(line)
        prev = line
    return "\n".join(out)


def label_headings(text, page_id, order):
    """Puts `{#label}` on the headings some page links to."""
    out, in_code = [], False
    for line in text.split("\n"):
        if FENCE.match(line.strip()):
            in_code = not in_code
        elif not in_code and re.match(r"^#{2,} ", line) and (page_id, slug(line.lstrip("#"))) in order["labels"]:
            line = f"{line} {{#{heading_label(page_id, slug(line.lstrip('#')))}}}"
        out.append(line)
    return "\n".join(out)


def convert(source, page_id, ids, order):
    with open(os.path.join(ROOT, source), encoding="utf-8") as f:
        text = f.read()
    text = SNIPPET.sub(lambda m: f"\\snippet {m.group(1)} {m.group(2)}", text)
    # Figure markers (tools/figures.py) keep their text; lets go. Doxygen drops the space after an
    # HTML comment, which would glue a figure to the word after it.
    text = re.sub(r"<!-- f: .*?-->(.*?)<!-- /f -->", r"\1", text, flags=re.S)
    text = re.sub(r"<!-- let: .*?-->\n?", "", text, flags=re.S)
    text = RECORD_MARK.sub("", text)
    text = convert_math(text)
    # Doxygen 1.9 prints a heading's `code` as a literal <tt>: headings lose their backticks.
    text = re.sub(r"^(#+ .*)$", lambda m: m.group(1).replace("`", ""), text, flags=re.M)
    text = convert_links(text, source, ids, order)
    text = fix_lines(fix_code_spans(text))
    for m in IMAGE.finditer(text):  # images: copied next to the pages by main()
        if not re.match(r"^[a-z]+://", m.group(2)):
            order.setdefault("images", set()).add(os.path.normpath(os.path.join(os.path.dirname(source), m.group(2))))
    text = IMAGE.sub(lambda m: f"![{m.group(1)}]({os.path.basename(m.group(2))})", text)
    lines = text.split("\n")
    if not lines[0].startswith("# "):
        raise ValueError(f"{source}: the first line must be the page's '# Title'")
    if page_id != "index":  # the main page has Doxygen's own label, index
        lines[0] = f"{lines[0]} {{#{page_id}}}"
    all_pages = order["pages"]
    chapters = [p for _, p in all_pages if re.fullmatch(r"ch\d+", p)]
    if page_id == "index":  # @ref, not \subpage: Doxygen 1.9's tree shows no sub-pages of the main page
        lines += ["", "## All pages", ""] + [f"- @ref {p}" for _, p in all_pages[1:] if not re.match(r"ch\d+_", p)]
    elif page_id in chapters:
        subpages = [p for _, p in all_pages if p.startswith(page_id + "_")]
        if subpages:
            lines += ["", "## More on this chapter", ""] + [f"- \\subpage {p}" for p in subpages]
        j = chapters.index(page_id)
        nav = []
        if j > 0:
            nav.append(f"previous: @ref {chapters[j - 1]}")
        if j + 1 < len(chapters):
            nav.append(f"next: @ref {chapters[j + 1]}")
        lines += ["", "<hr>", "", " · ".join(nav + ["@ref index \"all chapters\""])]
    elif re.match(r"ch\d+_", page_id):
        chapter = page_id.split("_")[0]
        lines += ["", "<hr>", "", f"back to @ref {chapter} · @ref index \"all chapters\""]
    else:  # a concept page
        lines += ["", "<hr>", "", "back to @ref index \"all chapters\""]
    return "\n".join(lines) + "\n"


DOXYFILE = """PROJECT_NAME           = "Attention kernels, step by step"
PROJECT_BRIEF          = "From naive attention to FlashAttention-3 and paged attention, in CUDA C++"
OUTPUT_DIRECTORY       = {out}
INPUT                  = {inputs} {root}/common
FILE_PATTERNS          = *.md *.h *.cuh
USE_MDFILE_AS_MAINPAGE = {pages}/index.md
EXAMPLE_PATH           = {root}
IMAGE_PATH             = {pages}
STRIP_FROM_PATH        = {root} {pages}
FULL_PATH_NAMES        = YES
MARKDOWN_SUPPORT       = YES
TOC_INCLUDE_HEADINGS   = 3
EXTRACT_ALL            = YES
EXTRACT_STATIC         = YES
WARN_IF_UNDOCUMENTED   = NO
WARN_AS_ERROR          = FAIL_ON_WARNINGS
WARN_LOGFILE           = {out}/warnings.log
QUIET                  = YES
GENERATE_HTML          = YES
GENERATE_LATEX         = NO
GENERATE_TREEVIEW      = YES
DISABLE_INDEX          = NO
SEARCHENGINE           = YES
SOURCE_BROWSER         = NO
USE_MATHJAX            = YES
MATHJAX_VERSION        = MathJax_2
MATHJAX_FORMAT         = HTML-CSS
MATHJAX_RELPATH        = mathjax
MATHJAX_EXTENSIONS     = TeX/AMSmath TeX/AMSsymbols
EXTENSION_MAPPING      = cu=C++ cuh=C++
ENABLE_PREPROCESSING   = YES
MACRO_EXPANSION        = YES
PREDEFINED             = __CUDACC__ FA_HD= __device__= __host__= __global__= __forceinline__=
HTML_COLORSTYLE_HUE    = 200
HAVE_DOT               = NO
CLASS_GRAPH            = NO
HTML_EXTRA_STYLESHEET  = {out}/extra.css
FILTER_PATTERNS        = "*.h={filter}" "*.cuh={filter}"
"""

# Wide figures (the benchmark plots are 1800 px) shrink to the page instead of overflowing it.
# Doxygen 1.9's inline code is an inline-block: a long command became a block of its own, with
# the sentence's next word pushed below it. The page title was smaller than the ## sections below it,
# and a table touched the code block next to it. A table wider than the page (chapter 06's head_dim
# table) scrolls sideways in its own box; without it Doxygen's page cuts the table off at the right
# edge. A word of code too long for the line (an ncu metric list) breaks instead of running past it.
EXTRA_CSS = """div.image img { max-width: 100%; height: auto; }
div.contents code, div.contents tt { display: inline; overflow-wrap: break-word; }
table.markdownTable, table.doxtable { display: block; width: max-content; max-width: 100%; overflow-x: auto; }
div.headertitle .title { font-size: 200%; line-height: 1.3; }
table.markdownTable { margin: 0.6em 0 1em 0; }
"""


DOC_COMMENT = re.compile(r"^(.*?(?:///|//!)<?)(.*)$", re.S)
FLAG = re.compile(r"(?<![\w\\\"-])--(?=[A-Za-z])")  # in quotes Doxygen prints the text as it is


def filter_header(path):
    """A header as Doxygen reads it (FILTER_PATTERNS): in a `///` comment a command-line flag outside
    code and quotes (--variant) becomes `\\--variant`, which Doxygen prints as two hyphens instead of
    an en dash. Line for line, so Doxygen's line numbers stay the source's."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = DOC_COMMENT.match(line)
            if m:
                parts = re.split(r"(`[^`]*`)", m.group(2))
                line = m.group(1) + "".join(p if p.startswith("`") else FLAG.sub(r"\\--", p) for p in parts)
            sys.stdout.write(line)


def finish_html(path):
    """What the markdown marked for the HTML (fix_lines): an ordered list's first number."""
    with open(path, encoding="utf-8") as f:
        html = f.read()
    html = re.sub(r'<ol type="1">(\s*<li>)<span class="ol-start-(\d+)"></span>', r'<ol type="1" start="\2">\1', html)
    html = re.sub(r'<span class="ol-start-\d+"></span>', "", html)
    with open(path, "w", encoding="utf-8") as f:
        f.write(html)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "build", "docs"))
    parser.add_argument("--filter", metavar="HEADER", help="print HEADER as Doxygen is to read it (its input filter)")
    args = parser.parse_args()
    if args.filter:
        filter_header(args.filter)
        return 0
    out = os.path.abspath(args.out)
    if shutil.which("doxygen") is None:
        print("docs: doxygen not found; run 'make setup-docs' (installs doxygen and libjs-mathjax)", file=sys.stderr)
        return 2
    if not os.path.isfile(os.path.join(MATHJAX, "MathJax.js")):
        print(f"docs: MathJax not found in {MATHJAX}; run 'make setup-docs' (Debian's libjs-mathjax)", file=sys.stderr)
        return 2
    shutil.rmtree(out, ignore_errors=True)
    page_dir = os.path.join(out, "pages")
    os.makedirs(page_dir)
    order = {"pages": pages(), "labels": set()}
    ids = {source: page_id for source, page_id in order["pages"]}
    order["anchors"] = {page_id: headings(open(os.path.join(ROOT, source), encoding="utf-8").read())
                        for source, page_id in order["pages"]}
    try:
        converted = {page_id: convert(source, page_id, ids, order) for source, page_id in order["pages"]}
        for page_id, text in converted.items():  # labels once every page's links are known
            with open(os.path.join(page_dir, f"{page_id}.md"), "w", encoding="utf-8") as f:
                f.write(label_headings(text, page_id, order))
    except (OSError, ValueError) as e:
        print(f"docs: {e}", file=sys.stderr)
        return 1
    for image in sorted(order.get("images", ())):
        shutil.copy2(os.path.join(ROOT, image), page_dir)
    with open(os.path.join(out, "extra.css"), "w") as f:
        f.write(EXTRA_CSS)
    with open(os.path.join(out, "Doxyfile"), "w") as f:
        # the pages in INPUT in the site's order, which is the order of the navigation tree
        inputs = " ".join(os.path.join(page_dir, f"{page_id}.md") for _, page_id in order["pages"])
        f.write(DOXYFILE.format(out=out, pages=page_dir, inputs=inputs, root=ROOT,
                                filter=f"{sys.executable} {os.path.abspath(__file__)} --filter"))
    run = subprocess.run(["doxygen", os.path.join(out, "Doxyfile")], cwd=ROOT, capture_output=True, text=True)
    warnings = open(os.path.join(out, "warnings.log")).read().strip() if os.path.exists(os.path.join(out, "warnings.log")) else ""
    if run.returncode != 0 or warnings:
        print(warnings or run.stderr.strip(), file=sys.stderr)
        print(f"docs: doxygen failed ({len(warnings.splitlines())} warning lines, warnings are errors)", file=sys.stderr)
        return 1
    for path in sorted(order.get("linked", ())):
        shutil.copy2(os.path.join(ROOT, path), os.path.join(out, "html"))
    for _, page_id in order["pages"]:
        finish_html(os.path.join(out, "html", f"{page_id}.html"))
    shutil.copytree(MATHJAX, os.path.join(out, "html", "mathjax"), symlinks=False, dirs_exist_ok=True)
    print(f"docs: {len(order['pages'])} pages and common/'s API; open {os.path.join(out, 'html', 'index.html')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
