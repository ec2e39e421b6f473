"""The docs' checkers fail on what they exist to catch: process words (tools/check_words.py), a
snippet marker with no code after it (tools/check_snippets.py), a measured table or a figure in
prose that is not what the result files give, and a measured-looking figure that no marker gives
(tools/tables.py, tools/figures.py). Each runs on a small made-up tree. Also what the generated
text and the site's markdown (tools/docs.py) must hold for Doxygen to print it as GitHub does: a
command in code font (outside it `--budget-ms` prints with an en dash), bold that starts with "(",
no word glued to a record's marker."""
import contextlib
import io
import os
import re
import sys
import tempfile
import unittest

TOOLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools")
sys.path.insert(0, TOOLS)
import check_snippets  # noqa: E402
import check_words  # noqa: E402
import docs  # noqa: E402
import tables  # noqa: E402

SOURCE = """int f(int x) {
  //! [body]
  return x + 1;
  //! [body]
}
"""


def quiet(fn, *args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = fn(*args)
    return status, out.getvalue()


def run_in(module, root, argv):
    """module.main() with ROOT at the made-up tree and these command-line arguments."""
    old_root, old_argv = module.ROOT, sys.argv
    module.ROOT, sys.argv = root, [module.__name__ + ".py", *argv]
    try:
        return quiet(module.main)
    finally:
        module.ROOT, sys.argv = old_root, old_argv


# The process phrases the word check must catch, assembled so that this file does not hold them.
PLANTED = [" ".join(words) for words in [
    ("Measured in", "sess" + "ion", "3 on the H100."), ("As", "iss" + "ue", "5 asked, the backward ..."),
    ("The", "fir" + "st", "version used atomics."), ("An", "ear" + "lier", "run was slower."),
    ("Tried in the", "sa" + "me", "pass: four stages."), ("an", "explor" + "ation", "run showed spills")]]


class Tree(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, rel, text):
        path = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        return path


class ProcessWords(Tree):
    def test_each_kind_of_process_word_is_caught(self):
        for line in PLANTED:
            path = self.write("chapters/x/README.md", f"# Title\n\n{line}\n")
            status, out = quiet(check_words.main, [path])
            self.assertEqual(status, 1, line)
            self.assertIn(":3:", out)

    def test_plain_statements_pass(self):
        path = self.write("chapters/x/README.md", "# Title\n\nThe loop's next iteration reads tile j + 1. "
                          "Measured on the H100, 2026-11-24, `make bench`.\n")
        self.assertEqual(quiet(check_words.main, [path])[0], 0)


class Snippets(Tree):
    def run_check(self, *argv):
        return run_in(check_snippets, self.root, argv)

    def test_marker_without_code_fails_and_fix_fills_it(self):
        self.write("src/f.cpp", SOURCE)
        page = self.write("chapters/x/README.md", "# T\n\n<!-- snippet: src/f.cpp body -->\n\nText.\n")
        status, out = self.run_check()
        self.assertEqual(status, 1)
        self.assertIn("has no code block after its marker", out)
        self.assertEqual(self.run_check("--fix")[0], 0)
        self.assertIn("```cpp\nreturn x + 1;\n```", open(page).read())
        self.assertEqual(self.run_check()[0], 0)

    def test_stale_block_fails(self):
        self.write("src/f.cpp", SOURCE)
        self.write("chapters/x/README.md", "# T\n\n<!-- snippet: src/f.cpp body -->\n```cpp\nreturn x;\n```\n")
        status, out = self.run_check()
        self.assertEqual(status, 1)
        self.assertIn("differs from the source", out)


class Tables(Tree):
    def run_tables(self, *argv):
        return run_in(tables, self.root, argv)

    def test_stale_table_fails_and_regeneration_fixes_it(self):
        page = self.write("chapters/x/README.md", "# T\n\n<!-- table: ch05 -->\n| made | up |\n<!-- /table -->\n")
        status, out = self.run_tables("--check")
        self.assertEqual(status, 1)
        self.assertIn("table 'ch05' differs", out)
        self.assertEqual(self.run_tables()[0], 0)
        with open(page) as f:
            self.assertIn("`ch05_tuned_bf16`", f.read())
        self.assertEqual(self.run_tables("--check")[0], 0)

    def test_unknown_table_fails(self):
        self.write("chapters/x/README.md", "# T\n\n<!-- table: ch99 -->\n<!-- /table -->\n")
        status, out = self.run_tables("--check")
        self.assertEqual(status, 1)
        self.assertIn("no table named 'ch99'", out)


class MeasuredLines(unittest.TestCase):
    def test_commands_and_files_go_in_code_font(self):
        line = ("NVIDIA H200, driver 580.159.04, CUDA 13.0, PyTorch 2.11.0+cu130, 2026-11-28: build/bin/fa_bench --dims "
                "64,128 --kernels a,b --budget-ms 50 and python3 tools/bench_torch.py --pass backward in the same call "
                "(x.csv, y.csv), merged by tools/x_report.py")
        self.assertEqual(tables.measured_on(line),
                         "Measured on NVIDIA H200, driver 580.159.04, CUDA 13.0, PyTorch 2.11.0+cu130, 2026-11-28: "
                         "`build/bin/fa_bench --dims 64,128 --kernels a,b --budget-ms 50` and "
                         "`python3 tools/bench_torch.py --pass backward` in the same call (`x.csv`, `y.csv`), merged "
                         "by `tools/x_report.py`")
        self.assertEqual(tables.code_commands("`pytest tests/python` (test_forward); A/B in one run"),
                         "`pytest tests/python` (test_forward); A/B in one run")

    def test_no_generated_table_has_a_flag_outside_code(self):
        for name, text in tables.tables().items():
            prose = re.sub(r"`[^`]*`", "", text)
            self.assertNotRegex(prose, r"(?<![\w-])--\w", name)


class SiteMarkdown(unittest.TestCase):
    def test_bold_that_starts_with_a_parenthesis_or_code_becomes_a_tag(self):
        self.assertEqual(docs.fix_lines("**(a) Students check.** Then **`x`** and **plain**, **b**."),
                         "<b>(a) Students check.</b> Then <b>`x`</b> and **plain**, **b**.")

    def test_a_record_mid_line_glues_no_words(self):
        text = "it ran. <!-- record: NVIDIA H100, 2026-11-24, fa_bench -->It took 2 ms).<!-- /record --> Kept.\n"
        self.assertEqual(docs.RECORD_MARK.sub("", text), "it ran. It took 2 ms). Kept.\n")
        self.assertEqual(docs.RECORD_MARK.sub("", "a\n\n<!-- record: H200, 2026-11-28, x -->\n- b\n<!-- /record -->\n"),
                         "a\n\n\n- b\n\n")


# A figure the result files give: chapter 05's tuned kernel over SDPA FLASH at d128, 4k.
RATIO = 'x(fwd("ch05_tuned_bf16", 128, 4096), sdpa("flash", 128, 4096))'


class Figures(Tree):
    def run_tables(self, *argv):
        return run_in(tables, self.root, argv)

    def test_planted_wrong_ratio_fails_and_regeneration_fixes_it(self):
        page = self.write("chapters/x/README.md", f"# T\n\nIt runs at <!-- f: {RATIO} -->9.99×<!-- /f --> FLASH.\n")
        status, out = self.run_tables("--check")
        self.assertEqual(status, 1)
        self.assertIn("1 prose figures differ", out)
        self.assertEqual(self.run_tables()[0], 0)
        self.assertNotIn("9.99×", open(page).read())
        self.assertRegex(open(page).read(), r"-->\d\.\d\d×<!-- /f -->")
        self.assertEqual(self.run_tables("--check")[0], 0)

    def test_unmarked_figure_in_a_lesson_fails(self):
        for text in ("It reaches 1.27× variant 4.", "It runs at 834.5 TFLOP/s.", "It takes 0.21 ms.",
                     "It moves 2.3 TB/s."):
            self.write("chapters/x/README.md", f"# T\n\n{text}\n")
            status, out = self.run_tables("--check")
            self.assertEqual(status, 1, text)
            self.assertIn("reads as a measured figure", out)

    def test_what_is_not_a_figure_passes(self):
        self.write("chapters/x/README.md", "# T\n\nTwice the work: 2× the loads, `1.5× in code`, and\n\n"
                   "```\n834.5 TFLOP/s in a block\n```\n")
        self.assertEqual(self.run_tables("--check")[0], 0)

    def test_records_in_notes_name_their_run(self):
        body = "It reached 1.27× variant 4 and 0.21 ms."
        self.write("chapters/x/performance_notes.md",
                   f"# N\n\n<!-- record: NVIDIA H200, 2026-11-28, tools/ab_bench.sh -->\n{body}\n<!-- /record -->\n")
        self.assertEqual(self.run_tables("--check")[0], 0)
        self.write("chapters/x/performance_notes.md", f"# N\n\n<!-- record: an A/B -->\n{body}\n<!-- /record -->\n")
        status, out = self.run_tables("--check")
        self.assertEqual(status, 1)
        self.assertIn("a record names no GPU and date", out)
        self.write("chapters/x/performance_notes.md", f"# N\n\n{body}\n")
        self.assertEqual(self.run_tables("--check")[0], 1)

    def test_an_expression_the_files_cannot_answer_fails(self):
        for expr, says in (('num(fwd("ch99_none", 128, 4096))', "0 rows match"), ("fwd(", "SyntaxError"),
                           ('fwd("ch05_tuned_bf16", 128, 4096)', "wrap it in a formatter")):
            self.write("chapters/x/README.md", f"# T\n\n<!-- f: {expr} -->1<!-- /f -->\n")
            status, out = self.run_tables()
            self.assertEqual(status, 1, expr)
            self.assertIn(says, out)

    def test_a_marker_markdown_would_read_as_html_fails(self):
        self.write("chapters/x/README.md", f"# T\n\nIt runs at\n<!-- f: {RATIO} -->1.00×<!-- /f --> FLASH.\n")
        status, out = self.run_tables()
        self.assertEqual(status, 1)
        self.assertIn("a figure marker starts the line", out)

    def test_a_student_copy_without_the_budget_keeps_those_figures(self):
        import figures
        page = self.write("chapters/x/README.md", '# T\n\nIt spills <!-- f: count(budget("no kernel", "spill_stores")) '
                          '-->44<!-- /f --> bytes.\n')
        old, figures.BUDGET = figures.BUDGET, os.path.join(self.root, "tests", "kernel_budget.csv")
        try:
            self.assertEqual(self.run_tables("--check")[0], 0)
            with open(page) as f:
                self.assertIn("-->44<!-- /f -->", f.read())
        finally:
            figures.BUDGET = old
        if os.path.isfile(old):  # with the budget (not in a student copy), the kernel must exist
            self.assertEqual(self.run_tables("--check")[0], 1)

    def test_lets_are_bound_in_page_order(self):
        page = self.write("chapters/x/README.md", '# T\n\n<!-- let: t = fwd("ch05_tuned_bf16", 128, 4096) -->'
                          '\n\nAt <!-- f: num(t) -->0<!-- /f --> and <!-- f: x(t, t) -->0<!-- /f -->\n')
        self.assertEqual(self.run_tables()[0], 0)
        self.assertIn("-->1.00×<!-- /f -->", open(page).read())


if __name__ == "__main__":
    unittest.main()
