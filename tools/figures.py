#!/usr/bin/env python3
"""Figures in prose, from the result files: the measured numbers a sentence states.

A page states a measured figure through a marker that holds the expression giving it:

    variant 5 reaches <!-- f: num(fwd("ch06_fp8", 128, 16384, causal=1)) -->898.7<!-- /f --> TFLOP/s,
    <!-- f: x(fwd("ch06_fp8", 128, 16384, 1), fwd("ch06_pingpong_bf16", 128, 16384, 1)) -->1.40×<!-- /f -->
    variant 4

The comment is invisible on the rendered page; `python3 tools/tables.py` (which calls fill() here)
rewrites the text between the markers from docs/results/h200/, and `tables.py --check` (a CTest
test) fails when a page's text differs from what the files give. A page may name a value once and
use it again: `<!-- let: fp8 = fwd("ch06_fp8", 128, 16384, 1) -->`, in page order.

The expression sees the accessors below (each returns a float and fails when no row, or more than
one, matches) and the formatters that turn them into text. unmarked() is the other half of the
check: a lesson page may not state a throughput, a time or a decimal ratio outside a marker, a
generated table or a code block; a performance-notes page may, inside a record that names its run
(`<!-- record: NVIDIA H200, 2026-11-28, tools/ab_bench.sh ... -->` ... `<!-- /record -->`).
"""
import csv
import math
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "docs", "results", "h200")
BUDGET = os.path.join(ROOT, "tests", "kernel_budget.csv")
SPECS = os.path.join(ROOT, "docs", "results", "specs.csv")

FIGURE = re.compile(r"<!-- f: (.*?) -->(.*?)<!-- /f -->", re.S)
LET = re.compile(r"<!-- let: (\w+) = (.*?) -->", re.S)
RECORD = re.compile(r"<!-- record: (.*?) -->(.*?)<!-- /record -->", re.S)
# What reads as a measured figure: a number with a throughput or time unit, or a ratio with decimals.
MEASURED = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?:\s*[–-]\s*\d[\d,]*(?:\.\d+)?)?\s*(?:TFLOP/s|[GT]B/s|GiB/s|ms\b|µs\b)"
                      r"|(?<![\w.])\d+\.\d+(?:\s*[–-]\s*\d+\.\d+)?\s*×")


class FigureError(Exception):
    pass


class Unavailable(Exception):
    """A source a student copy leaves out (tests/kernel_budget.csv): the figure keeps its text."""


_files = {}


def rows(name):
    """A result file's rows (a first line starting with '# ' names its run and is skipped)."""
    if name not in _files:
        path = {"kernel_budget.csv": BUDGET, "specs.csv": SPECS}.get(name, os.path.join(RESULTS, name))
        with open(path, newline="", encoding="utf-8") as f:
            first = f.readline()
            if not first.startswith("# "):
                f.seek(0)
            _files[name] = list(csv.DictReader(f))
    return _files[name]


def value(name, col, **where):
    """The number in column `col` of the one row of file `name` whose columns equal `where`."""
    want = {k: str(int(v)) if isinstance(v, bool) else str(v) for k, v in where.items()}
    found = [r for r in rows(name) if all(r.get(k) == v for k, v in want.items())]
    if len(found) != 1:
        raise FigureError(f"{name}: {len(found)} rows match {want} (one is needed)")
    text = found[0].get(col)
    if text is None or text == "":
        raise FigureError(f"{name}: no '{col}' in the row matching {want}")
    return float(text)


def fwd(kernel, d, seq, causal=0, col="tflops"):
    """One of our forward kernels on the standard sweep (fa_bench.csv): TFLOP/s by default."""
    return value("fa_bench.csv", col, kernel=kernel, head_dim=d, seq_q=seq, causal=causal, status="ok")


def sdpa(backend, d, seq, causal=0, dtype="bf16", col="tflops"):
    """PyTorch SDPA's forward on the same points (torch.csv): flash, cudnn, efficient, math."""
    return value("torch.csv", col, backend=backend, dtype=dtype, head_dim=d, seq=seq, causal=causal, status="ok")


def bwd(kernel, d, seq, causal=0, col="tflops"):
    """One of our backward kernels (backward.csv)."""
    return value("backward.csv", col, kernel=kernel, head_dim=d, seq_q=seq, causal=causal, status="ok")


def sdpa_bwd(backend, d, seq, causal=0, dtype="bf16", col="tflops"):
    """PyTorch SDPA's backward (torch_backward.csv)."""
    return value("torch_backward.csv", col, backend=backend, dtype=dtype, head_dim=d, seq=seq, causal=causal,
                 status="ok")


def ceiling(name):
    """A measured ceiling of the card (ceilings.csv): copy GB/s, GEMM TFLOP/s."""
    return value("ceilings.csv", "value", ceiling=name)


def budget(kernel, col, arch="sm_90a"):
    """A kernel's resources as ptxas reports them (tests/kernel_budget.csv, which CI checks): the one
    kernel of `arch` whose mangled name contains every space-separated part of `kernel`."""
    if not os.path.isfile(BUDGET):
        raise Unavailable(BUDGET)
    parts = kernel.split()
    found = [r for r in rows("kernel_budget.csv") if r["arch"] == arch and all(p in r["kernel"] for p in parts)]
    if len(found) != 1:
        raise FigureError(f"kernel_budget.csv: {len(found)} {arch} kernels match '{kernel}' (one is needed)")
    return float(found[0][col])


def gpu():
    """The card of the result files' run (run.txt's gpu line)."""
    for line in open(os.path.join(RESULTS, "run.txt"), encoding="utf-8"):
        if line.startswith("gpu:"):
            return line.split(":", 1)[1].strip()
    raise FigureError("run.txt names no gpu")


def spec(name):
    """A datasheet figure of the results' card (docs/results/specs.csv, each with its source): not
    measured, but what a measured figure is held against (bf16_dense, fp8_dense, fp32, hbm)."""
    card = gpu()
    found = [r for r in rows("specs.csv") if r["name"] == name and r["gpu"] in card]
    if len(found) != 1:
        raise FigureError(f"specs.csv: {len(found)} rows for '{name}' on '{card}' (one is needed)")
    return float(found[0]["value"])


def given(text):
    """A setting, not a measurement (a default budget, a command's flag): the text as written."""
    return text


def num(v, digits=None):
    """A number as the tables print it: 1,133 / 834.5 / 0.94 (or with `digits` decimals)."""
    if digits is not None:
        return f"{v:,.{digits}f}"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def count(v):
    """A whole number: 4 / 1,536."""
    return f"{round(v):,}"


def x(a, b=1.0, digits=2):
    """a over b as a ratio: 1.27×."""
    return f"{a / b:.{digits}f}×"


def span(values, digits=2, unit="×"):
    """The smallest and largest of `values`: 0.94–0.98× (one value when they agree)."""
    lo, hi = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return (lo if lo == hi else f"{lo}–{hi}") + unit


def ratios(pairs, digits=2):
    """The range of a / b over (a, b) pairs: 0.94–0.98×."""
    return span([a / b for a, b in pairs], digits)


def pct(a, b=1.0, digits=0):
    """a over b as a percentage: 74%."""
    return f"{100 * a / b:.{digits}f}%"


def more(a, b, digits=0):
    """How much larger a is than b, in percent: 16%."""
    return f"{100 * (a / b - 1):.{digits}f}%"


NAMES = {f.__name__: f for f in (value, fwd, sdpa, bwd, sdpa_bwd, ceiling, budget, spec, given, num, count, x,
                                 span, ratios, pct, more)}
NAMES.update(min=min, max=max, abs=abs, round=round, sum=sum, len=len, sqrt=math.sqrt)


def evaluate(expr, names):
    try:
        result = eval(expr, {"__builtins__": {}, **names})  # the pages' own expressions (globals: comprehensions see them)
    except (FigureError, Unavailable):
        raise
    except Exception as e:  # a typo in a page's expression: say which
        raise FigureError(f"'{expr}': {type(e).__name__}: {e}")
    return result


def fill(text):
    """(the page with every figure rewritten from the files, [problems]). Lets are bound in page
    order; a figure must give text (a formatter's result), not a bare number."""
    names, problems = dict(NAMES), []
    out, pos = [], 0
    events = sorted([(m.start(), "let", m) for m in LET.finditer(text)] +
                    [(m.start(), "f", m) for m in FIGURE.finditer(text)], key=lambda e: e[0])
    for _, kind, m in events:
        try:
            if kind == "let":
                names[m.group(1)] = evaluate(m.group(2), names)
                continue
            result = evaluate(m.group(1), names)
            if not isinstance(result, str):
                raise FigureError(f"'{m.group(1)}' gives {result!r}; wrap it in a formatter (num, x, span, ...)")
        except FigureError as e:
            problems.append(str(e))
            continue
        except Unavailable:
            continue  # the instructor's figure stays as written
        out.append(text[pos:m.start(2)])
        out.append(result)
        pos = m.end(2)
    out.append(text[pos:])
    return "".join(out), problems


def prose(text):
    """The text a reader sees as prose: without code blocks, inline code, generated tables, figures."""
    text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"<!-- table: \w+ -->.*?<!-- /table -->", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = FIGURE.sub("", text)
    return re.sub(r"`[^`\n]*`", "", text)


def unmarked(page, text):
    """The measured-looking figures of a page that no marker gives: [(line, text)]. A notes page
    (performance_notes.md, results pages) may state them inside a record naming its run."""
    notes = os.path.basename(page) == "performance_notes.md"
    body = prose(text)
    if notes:
        body = RECORD.sub(lambda m: "\n" * m.group(0).count("\n"), body)
    found = []
    for m in MEASURED.finditer(body):
        found.append((body.count("\n", 0, m.start()) + 1, m.group(0)))
    return found


def bad_layout(text):
    """[(line, why)] for markers that Markdown would read as an HTML block (a line that starts with
    '<!--' ends the paragraph before it and shows the rest of its line unprocessed): a figure must
    not start a line, and a let stands in lines of its own, between paragraphs."""
    found = []
    for m in FIGURE.finditer(text):
        line_start = text.rfind("\n", 0, m.start()) + 1
        if not text[line_start:m.start()].strip():
            found.append((text.count("\n", 0, m.start()) + 1, "a figure marker starts the line; move a word before it"))
    for m in LET.finditer(text):
        line_start = text.rfind("\n", 0, m.start()) + 1
        before = text[:line_start].rstrip(" ").split("\n")[-2] if line_start else ""
        after_end = text.find("\n", m.end())
        rest = text[m.end():after_end if after_end >= 0 else len(text)]
        following = text[after_end + 1:].split("\n", 1)[0] if after_end >= 0 else ""
        if (text[line_start:m.start()].strip() or rest.strip() or (before.strip() and not before.rstrip().endswith("-->"))
                or (following.strip() and not following.lstrip().startswith("<!--"))):
            found.append((text.count("\n", 0, m.start()) + 1, "a let stands in lines of its own, with a blank line "
                                                              "(or another marker) before and after"))
    return found


def bad_records(text):
    """Records that do not name their run: a GPU (H100, H200) and a date."""
    return [m.group(1) for m in RECORD.finditer(text)
            if not (re.search(r"\bH[12]00\b", m.group(1)) and re.search(r"\d{4}-\d\d-\d\d", m.group(1)))]
