"""What the *_report.py scripts share: their command line (fa_bench's CSV, a second CSV from the
same call, --out and --line), the TFLOP/s of some kernels and of SDPA's backends per sweep point,
and an output CSV whose first line is the '# ' line saying where it was measured (tools/tables.py
reads it)."""
import argparse
import contextlib
import csv
import re


# A kernel registered only so that make bench times one step of a chapter's tuned kernel
# (ch04_tuned_step1, ch05_tuned_undo_rows_bf16): it has a steps table of its own and never
# stands for its chapter (in a chapter's table, as its best, or in a plot).
STEP_KERNEL = re.compile(r"_(step\d+|undo_[a-z]+)(_|$)")


def is_step_kernel(kernel):
    return STEP_KERNEL.search(kernel) is not None


def report_args(doc, second="torch_csv", extra=()):
    """The parsed command line of a report script whose module docstring is `doc`; `extra`: more
    options, as (names, keyword arguments) pairs for add_argument."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("fa_csv")
    parser.add_argument(second)
    for names, kwargs in extra:
        parser.add_argument(*names, **kwargs)
    parser.add_argument("--out", required=True)
    parser.add_argument("--line", required=True, help="where and how it was measured (the file's first line)")
    return parser.parse_args()


def tflops_by_point(path, kernels):
    """The sweep points (head_dim, causal, seq) where one of `kernels` ran, and
    {(kernel, point): TFLOP/s}, from the rows of fa_bench's CSV that ran ("ok") and report TFLOP/s."""
    points, tflops = set(), {}
    for r in csv.DictReader(open(path, newline="")):
        if r["kernel"] in kernels and r["status"] == "ok" and r["tflops"]:
            key = (int(r["head_dim"]), int(r["causal"]), int(r["seq_q"]))
            points.add(key)
            tflops[r["kernel"], key] = float(r["tflops"])
    return points, tflops


def sdpa_tflops_by_point(path, dtype, backends):
    """{(backend, point): TFLOP/s} of bench_torch.py's CSV, the rows of `dtype` and `backends` that
    ran ("ok"); points as in tflops_by_point."""
    tflops = {}
    for r in csv.DictReader(open(path, newline="")):
        if r["status"] == "ok" and r["dtype"] == dtype and r["backend"] in backends:
            tflops[r["backend"], (int(r["head_dim"]), int(r["causal"]), int(r["seq"]))] = float(r["tflops"])
    return tflops


def ratio(a, b):
    """a / b with two decimals, or "" where either is missing."""
    return f"{a / b:.2f}" if a is not None and b else ""


@contextlib.contextmanager
def report_writer(path, line, lineterminator="\n"):
    """A csv.writer on `path`, after the '# line' that says where the numbers were measured."""
    with open(path, "w", newline="") as f:
        f.write(f"# {line}\n")
        yield csv.writer(f, lineterminator=lineterminator)
