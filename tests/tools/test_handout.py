"""classroom/handout.py on a small made-up tree: which regions become stubs, what stays, and the
one-line errors for bad markers and bad config (with nothing written); and on this tree: no code
line of a solution survives anywhere in its student copy."""
import json
import os
import sys
import tempfile
import unittest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "classroom"))
import handout  # noqa: E402

KERNEL = """int keep(int x) {
  // BEGIN SOLUTION other: something else
  return x + 1;
  // END SOLUTION
}
float solve(float* row, int n) {
  // BEGIN SOLUTION ex1: the "online" softmax of one row
  float m = row[0];
  return m + n;
  // END SOLUTION
}
"""


class HandoutTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = os.path.join(self.tmp.name, "repo")
        os.makedirs(os.path.join(self.root, "chapters", "01_first"))
        self.write("chapters/kernel.h", KERNEL)
        self.write("README.md", "docs keep `// BEGIN SOLUTION` text as is\n")
        self.config = os.path.join(self.tmp.name, "exercises.json")
        self.set_config([{"id": "ex1", "chapter": 1, "device": "cpu", "title": "t", "points": 5, "tests": "^ex1"}])
        self.dest = os.path.join(self.tmp.name, "out")

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, rel, text):
        with open(os.path.join(self.root, rel), "w") as f:
            f.write(text)

    def set_config(self, exercises):
        # Every exercise has a chapter and a device; the tests below vary the other fields.
        exercises = [{"chapter": 1, "device": "cpu", **ex} for ex in exercises]
        with open(self.config, "w") as f:
            json.dump({"exercises": exercises}, f)

    def read(self, rel):
        with open(os.path.join(self.dest, rel)) as f:
            return f.read()

    def test_selected_region_becomes_a_stub_and_others_keep_their_code(self):
        totals = handout.make_handout(self.root, self.dest, self.config)
        self.assertEqual(totals, {"ex1": 1, "other": 1})
        out = self.read("chapters/kernel.h")
        self.assertIn('float solve(float* row, int n) {\n'
                      '  // BEGIN SOLUTION ex1: the "online" softmax of one row\n'
                      '  // TODO(ex1): your code replaces the stub below; keep the BEGIN/END lines\n'
                      '  FA_NOT_IMPLEMENTED("ex1: the \\"online\\" softmax of one row");\n'
                      '  // END SOLUTION\n}\n', out)
        self.assertNotIn("float m = row[0];", out)
        # Exercise 'other' is not in the config: its code stays, its markers go.
        self.assertIn("int keep(int x) {\n  return x + 1;\n}\n", out)
        self.assertEqual(self.read("README.md"), "docs keep `// BEGIN SOLUTION` text as is\n")
        self.assertEqual(json.loads(self.read(".handout")), {"exercises": [{"id": "ex1", "regions": 1}]})

    def test_a_pages_solution_prose_goes_and_others_keep_their_text(self):
        self.write("chapters/lesson.md", "# L\n\nThe stub:\n\n<!-- BEGIN SOLUTION ex1 -->\nFirst take m = row[0], "
                   "then rescale.\n<!-- END SOLUTION -->\n<!-- BEGIN SOLUTION other -->\nKeep adds one.\n"
                   "<!-- END SOLUTION -->\nThe end.\n")
        handout.make_handout(self.root, self.dest, self.config)
        page = self.read("chapters/lesson.md")
        self.assertNotIn("rescale", page)
        self.assertIn("*This step is the exercise `ex1`", page)
        self.assertIn("\nKeep adds one.\nThe end.\n", page)
        self.assertNotIn("SOLUTION --", page)
        with open(os.path.join(self.root, "chapters/lesson.md")) as f:
            self.assertIn("rescale", f.read())  # the instructor's tree keeps it

    def test_an_unclosed_page_solution_block(self):
        self.write("chapters/lesson.md", "# L\n<!-- BEGIN SOLUTION ex1 -->\nThe answer.\n")
        self.assert_error("chapters/lesson.md: a solution block is not closed")

    def assert_error(self, message_part):
        with self.assertRaises(handout.HandoutError) as caught:
            handout.make_handout(self.root, self.dest, self.config)
        self.assertIn(message_part, str(caught.exception))
        self.assertFalse(os.path.exists(self.dest), "a failed handout must write nothing")

    def test_a_copy_of_a_solution_elsewhere_fails(self):
        step = ("  const float m_new = std::fmax(m, tile_max);\n  const float rescale = std::exp(m - m_new);\n"
                "  for (int c = 0; c < keys; ++c) p[c] = std::exp(p[c] - m_new);\n")
        self.write("chapters/step.h", "void step() {\n  // BEGIN SOLUTION ex1: the step\n" + step + "  // END SOLUTION\n}\n")
        # One of its code lines anywhere, even outside every region, gives a step away...
        self.write("chapters/later.h", "void later() {\n  const float rescale = std::exp(m - m_new);\n}\n")
        self.assert_error("chapters/later.h:2: a solution's line 'const float rescale = std::exp(m - m_new);'")
        # ...and the same lines in a row, in a later chapter's file, are a copy of the solution.
        self.write("chapters/later.h", "void later() {\n  // the step again\n" + step.replace("  ", "    ") + "}\n")
        self.assert_error("chapters/later.h:3: a copy of a solution's lines")

    def test_a_solutions_code_line_anywhere_fails(self):
        # Even one non-trivial line, in a file the student gets (a later chapter's, or a page).
        self.write("chapters/later.h", "float later(float* row) {\n  return row[0] + 1;\n}\n")
        handout.make_handout(self.root, self.dest, self.config)
        import shutil
        shutil.rmtree(self.dest)
        self.write("chapters/later.md", "The step:\n\n    float m = row[0];  // as in the solution\n")
        self.assert_error("chapters/later.md:3: a solution's line 'float m = row[0];'")

    def test_trivial_lines_are_the_listed_shapes_only(self):
        for line in ("}", "} else {", "#pragma unroll", "for (int c = 0; c < keys; ++c) {", "float sum = 0.0f;",
                     "m = m_new;", "return -INFINITY;", "CUDA_CHECK_LAUNCH();", "// m_new = max(m, x)", "x;"):
            self.assertEqual(handout.nontrivial_code(line), "", line)
        for line in ("p[c * stride] = e;", "tile_sum += e;", "l = l * rescale + tile_sum;",
                     "const bool seen = m_new != -INFINITY;", "float m = row[0];"):
            self.assertNotEqual(handout.nontrivial_code(line), "", line)
        self.assertLessEqual(len(handout.ALLOWED_LINES), 12)

    def test_end_without_begin(self):
        self.write("chapters/bad.cu", "x\n  // END SOLUTION\n")
        self.assert_error("chapters/bad.cu:2: END SOLUTION without a BEGIN SOLUTION")

    def test_unterminated_region(self):
        self.write("chapters/bad.cu", "// BEGIN SOLUTION ex1: write it\nint a;\n")
        self.assert_error("chapters/bad.cu:1: BEGIN SOLUTION ex1 has no END SOLUTION")

    def test_nested_region(self):
        self.write("chapters/bad.cu", "// BEGIN SOLUTION ex1: a\n// BEGIN SOLUTION ex1: b\n// END SOLUTION\n")
        self.assert_error("chapters/bad.cu:2: BEGIN SOLUTION inside the region opened at line 1")

    def test_malformed_marker(self):
        self.write("chapters/bad.cu", "// BEGIN SOLUTION\nint a;\n// END SOLUTION\n")
        self.assert_error("chapters/bad.cu:1: malformed marker")

    def test_config_names_an_exercise_with_no_region(self):
        self.set_config([{"id": "ex1", "title": "t", "points": 5, "tests": "x"}, {"id": "ghost", "title": "t", "points": 1, "tests": "y"}])
        self.assert_error("no BEGIN SOLUTION region in the sources: ghost")

    def test_bad_config(self):
        self.set_config([{"id": "ex1", "title": "t", "points": 5, "tests": "x"}, {"id": "ex1", "title": "t", "points": 5, "tests": "x"}])
        self.assert_error("exercise id 'ex1' appears twice")
        self.set_config([{"id": "ex1", "title": "t", "points": -1, "tests": "x"}])
        self.assert_error("negative points -1")
        self.set_config([{"id": "ex1", "title": "t", "points": 1, "tests": "("}])
        self.assert_error("tests pattern")
        self.set_config([{"id": "ex1", "points": 1, "tests": "x"}])
        self.assert_error("exercise 0 needs 'title'")

    def test_a_chapter_is_any_chapter_folder(self):
        self.set_config([{"id": "ex1", "chapter": 12, "title": "t", "points": 5, "tests": "x"}])
        self.assert_error("exercise 'ex1' has chapter 12; allowed: a chapter with a folder chapters/NN_name (1)")
        os.makedirs(os.path.join(self.root, "chapters", "12_later"))
        self.assertEqual(handout.make_handout(self.root, self.dest, self.config), {"ex1": 1, "other": 1})

    def test_a_week_is_a_whole_number_from_1(self):
        self.set_config([{"id": "ex1", "week": 0, "title": "t", "points": 5, "tests": "x"}])
        self.assert_error("exercise 'ex1' has week 0; allowed: a whole number from 1 up")
        self.set_config([{"id": "ex1", "device": "fpga", "title": "t", "points": 5, "tests": "x"}])
        self.assert_error("exercise 'ex1' has device 'fpga'; allowed: 'cpu' or 'gpu'")

    def test_an_assignment_lists_ids_of_the_trees_exercises(self):
        os.makedirs(os.path.join(self.root, "classroom"))
        with open(os.path.join(self.root, "classroom", "exercises.json"), "w") as f:
            json.dump({"exercises": [{"id": "ex1", "chapter": 1, "device": "cpu", "title": "t", "points": 5,
                                      "tests": "^ex1"},
                                     {"id": "other", "chapter": 1, "device": "gpu", "title": "o", "points": 3,
                                      "tests": "^o"}]}, f)
        with open(self.config, "w") as f:
            json.dump({"exercises": ["other"]}, f)
        self.assertEqual([ex["id"] for ex in handout.load_config(self.config, self.root)], ["other"])
        with open(self.config, "w") as f:
            json.dump({"exercises": ["ghost"]}, f)
        with self.assertRaises(handout.HandoutError) as caught:
            handout.load_config(self.config, self.root)
        self.assertIn("no exercise 'ghost' in classroom/exercises.json; allowed: ex1, other", str(caught.exception))

    def test_a_device_region_becomes_an_empty_body_and_its_launcher_throws(self):
        self.write("chapters/gpu.cu", "__global__ void k(float* o) {\n"
                   "  // BEGIN SOLUTION gpu1 (device): write o[0]\n  o[0] = 1.0f;\n  // END SOLUTION\n}\n"
                   "void launch(float* o) {\n"
                   "  // BEGIN SOLUTION gpu1: launch k\n  k<<<1, 1>>>(o);\n  // END SOLUTION\n}\n")
        self.set_config([{"id": "gpu1", "title": "t", "points": 5, "tests": "^g"}])
        self.assertEqual(handout.make_handout(self.root, self.dest, self.config)["gpu1"], 2)
        self.assertEqual(self.read("chapters/gpu.cu"),
                         "__global__ void k(float* o) {\n  // BEGIN SOLUTION gpu1 (device): write o[0]\n"
                         "  // TODO(gpu1): your code replaces this line; keep the BEGIN/END lines\n  // END SOLUTION\n}\n"
                         "void launch(float* o) {\n  // BEGIN SOLUTION gpu1: launch k\n"
                         "  // TODO(gpu1): your code replaces the stub below; keep the BEGIN/END lines\n"
                         "  FA_NOT_IMPLEMENTED(\"gpu1: launch k\");\n  // END SOLUTION\n}\n")

    def test_a_gpu_exercise_takes_no_host_code(self):
        # A GPU runner must run nothing of the student's on the host: a GPU exercise's host
        # region stays blank in the solution (the grader never fills a blank region).
        kernel = "__global__ void k(float* o) {\n  // BEGIN SOLUTION gpu1 (device): write o[0]\n  o[0] = 1.0f;\n  // END SOLUTION\n}\n"
        self.write("chapters/gpu.cu", kernel + "void launch(float* o) {\n"
                   "  // BEGIN SOLUTION gpu1: launch k\n  k<<<1, 1>>>(o);\n  // END SOLUTION\n}\n")
        self.set_config([{"id": "gpu1", "device": "gpu", "title": "t", "points": 5, "tests": "^g"}])
        self.assert_error("a GPU exercise's host region holds code (chapters/gpu.cu:7)")
        self.write("chapters/gpu.cu", kernel + "void launch(float* o) {\n"
                   "  // BEGIN SOLUTION gpu1: write k's body, then delete this line\n  // END SOLUTION\n"
                   "  k<<<1, 1>>>(o);\n}\n")
        self.assertEqual(handout.make_handout(self.root, self.dest, self.config)["gpu1"], 2)

    def test_one_reading_of_code_for_the_handout_and_the_grader(self):
        # handout.py's check and grade.py's blank() ask the same question of a region's body.
        import cxx_text
        for body in ["", "  // a note\n", "  /* a block\n     comment */\n"]:
            self.assertFalse(cxx_text.has_code(body), body)
            self.assertFalse(cxx_text.has_code(body, stubs=False), body)
        for body in ["  k<<<1, 1>>>(o);\n", '  "text";\n', "  /* a */ x = 1; // b\n", 'FA_NOT_IMPLEMENTED("a"); go();']:
            self.assertTrue(cxx_text.has_code(body), body)
            self.assertTrue(cxx_text.has_code(body, stubs=False), body)
        # A student copy's stub: the student's region to the grader, no code to the handout.
        stub = '  FA_NOT_IMPLEMENTED("gpu1: launch k");\n'
        self.assertTrue(cxx_text.has_code(stub))
        self.assertFalse(cxx_text.has_code(stub, stubs=False))

    def test_a_long_marker_line_is_read_in_linear_time(self):
        # A student's file sets the line: a title of a million blanks before its last character
        # (or after it) is read at once, not in time growing with the square of the line.
        import time
        for tail in ("x", ""):
            line = "  // BEGIN SOLUTION ex1: a" + " " * 1_000_000 + tail
            start = time.monotonic()
            m = handout.BEGIN.match(line)
            self.assertLess(time.monotonic() - start, 2.0)
            self.assertEqual(m.group(4)[-1], tail or "a")

    def test_an_exercise_with_only_device_regions_is_refused(self):
        self.write("chapters/gpu.cu", "__global__ void k(float* o) {\n"
                   "  // BEGIN SOLUTION gpu1 (device): write o[0]\n  o[0] = 1.0f;\n  // END SOLUTION\n}\n")
        self.set_config([{"id": "gpu1", "title": "t", "points": 5, "tests": "^g"}])
        self.assert_error("gpu1 have only (device) regions")

    def test_dest_must_be_empty_and_outside_the_tree(self):
        os.makedirs(self.dest)
        self.write("chapters/x.h", "int x;\n")
        with open(os.path.join(self.dest, "old"), "w") as f:
            f.write("x")
        with self.assertRaises(handout.HandoutError) as caught:
            handout.make_handout(self.root, self.dest, self.config)
        self.assertIn("exists and is not empty", str(caught.exception))
        with self.assertRaises(handout.HandoutError) as caught:
            handout.make_handout(self.root, os.path.join(self.root, "chapters", "out"), self.config)
        self.assertIn("is inside the repository", str(caught.exception))



class LeftOutTest(unittest.TestCase):
    def test_grading_outputs_and_archives_never_reach_a_copy(self):
        with tempfile.TemporaryDirectory() as tree:  # no git: every file would be taken
            for rel in ("common/x.h", "build2/autograder.zip", "grades/gradebook.csv", "grades/bob/results.json",
                        "grades/bob/grade.log", "results.json", "notes.TAR.GZ"):
                os.makedirs(os.path.join(tree, os.path.dirname(rel) or "."), exist_ok=True)
                with open(os.path.join(tree, rel), "w") as f:
                    f.write("x")
            self.assertEqual(handout.tracked_files(tree), ["common/x.h"])


class ThisTreesHandoutTest(unittest.TestCase):
    """The student copy of this repository (every file of every chapter, docs included) holds no
    non-trivial code line of any solution region, inside the regions or outside them."""

    def test_no_solution_line_survives_in_the_copy(self):
        with tempfile.TemporaryDirectory() as tmp:
            dest = os.path.join(tmp, "handout")
            exercises = handout.load_config(os.path.join(ROOT, "classroom", "exercises.json"))
            _, regions_text, _ = handout.write_copy(ROOT, dest, exercises)
            leaks = handout.code_line_leaks(dest, regions_text)
            self.assertEqual(leaks, [], f"{len(leaks)} solution line(s) in the student copy:\n" + "\n".join(leaks))
            # The checker's answers to the steps and the scripts that draw the steps stay out.
            for rel in ("classroom/instructor/answers.cpp",) + handout.DIAGRAM_SCRIPTS:
                self.assertFalse(os.path.exists(os.path.join(dest, rel)), rel)
            self.assertTrue(os.path.isfile(os.path.join(dest, "classroom", "grader", "answers_absent.cpp")))
            # and the case generators in the copy hold no step's formula (each is a line of answers.cpp)
            answers = os.path.join(ROOT, "classroom", "instructor", "answers.cpp")
            if not os.path.isfile(answers):
                return  # a student copy: its own copy is made from no answers
            with open(answers) as f:
                formulas = {handout.code_tokens(line) for line in f if "exp" in line or "/ tile * tile" in line}
            formulas.discard("")
            for rel, text in handout.text_files(os.path.join(dest, "classroom", "grader")):
                for line in text.splitlines():
                    self.assertNotIn(handout.code_tokens(line), formulas, f"{rel}: {line.strip()}")


if __name__ == "__main__":
    unittest.main()
