"""tools/grade.py without a build: what it takes from a submission (a tree, a zip, loose files,
or nothing it can use), what the region lint rejects, that only region bodies are taken, and
the results.json it writes (Gradescope's schema; GPU exercises without a GPU not graded)."""
import json
import os
import sys
import tempfile
import unittest
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tools"))
import grade  # noqa: E402

EXERCISES = [{"id": "ch03_online_update", "chapter": 3, "device": "cpu", "title": "t", "points": 6, "tests": "x"},
             {"id": "ch02_block_softmax", "chapter": 2, "device": "gpu", "title": "g", "points": 8, "tests": "y"}]
ALGORITHM = "chapters/03_online_softmax/algorithm.h"


def check_schema(test, results):
    test.assertIsInstance(results["score"], (int, float))
    test.assertIn(results["visibility"], ("visible", "hidden", "after_due_date", "after_published"))
    for t in results["tests"]:
        test.assertEqual(set(t) - {"name", "number", "score", "max_score", "status", "output", "tags", "visibility"}, set())
        test.assertIsInstance(t["score"], (int, float))
        test.assertIsInstance(t["max_score"], (int, float))
        if "status" in t:
            test.assertIn(t["status"], ("passed", "failed"))


class LintTest(unittest.TestCase):
    def test_solutions_pass_and_tricks_do_not(self):
        self.assertEqual(grade.lint_region("  const float m = fmaxf(a, b);\n#pragma unroll\n  return {m, 0.0f};\n", 3), "")
        for body, why in [
            ('#include "../../common/reference.h"\n', "preprocessor"),
            ("%:include <cstdlib>\n", "preprocessor"),
            ("std::exit(0);\n", "'exit'"),
            ("abort();\n", "'abort'"),
            ("static int calls = 0;\n", "'static'"),
            ("auto f = fopen(\"/proc/self/maps\", \"r\");\n", "'fopen'"),
            ("const char* p = \"/autograder/results/results.json\";\n", "system path"),
            ("return fa::safe::safe_softmax_row(row, n);\n", "another chapter"),
            ("auto r = fa::reference_forward(s, q, k, v, plan);\n", "oracle"),
            ("asm volatile(\"trap;\");\n", "'asm'"),
            ("float* x = new float[4];\n", "'new'"),
            ("_Pragma(\"once\")\n", "_Pragma"),
            ('auto s = u8R"x(a"b)x"; exit(0);\n', "'exit'"),  # code after a raw string is still read
            # A digit separator is not a character literal: what follows it is read.
            ("int a = 1'0;\n#include <unistd.h>\nint b = 1'0;\n", "preprocessor"),
            # After a name or keyword a quote opens a character literal, which hides nothing.
            ("(void)sizeof'//'; std::system(\"id\");\n", "'system'"),
            ("return sizeof'{'+'a' + b;\n}\nstruct E {} e;\ninline int f(int b) {\n  return b + sizeof'}'+'a';\n",
             "unmatched"),
            ("dprintf(1, \"error x\\n\");\n", "'dprintf'"),
            # Line splicing joins lines before anything else; a lint that reads lines would miss it.
            ("fla\\\nsh1::flash_attention_v1_cpu(s);\n", "line splicing"),
            ("/\\\n* x */ #include \"a.h\"\n", "line splicing"),
            ("int x = 1; ??=define y\n", "trigraphs"),
            # g++ splices a backslash followed by other whitespace (a form feed) and a newline.
            ("int x = 1; // \\\x0c\n#include <cstdlib>\n", "U+000C"),
            ("int x = 1;\x0b std::exit(0);\n", "U+000B"),
            # 0x1'a is one number to the compiler, so the next quote opens a character literal
            # ('"', in an ignored attribute's arguments): g++ compiles the exit after it as code.
            ("[[maybe::note(0x1'a'\"')]] int v = 0; std::exit(0); //\")]]\n", "'exit'"),
            # g++ reads '$' and non-ASCII letters as part of a number as well.
            ("[[maybe::note(0x1\u00e9'a'\"')]] int v = 0; std::exit(0); //\")]]\n", "'exit'"),
            # A region may not close the function it sits in (to add code at file scope).
            ("return 1; }\nstruct Forge { Forge() {} } forge;\ninline int tail() {\n", "unmatched"),
            ("__builtin_execv(\"/bin/sh\", nullptr);\n", "'__builtin_execv'"),
            ("auto f = fopen64(\"x\", \"r\");\n", "'fopen64'"),
            ("printf(\"ok out=0\\n\");\n", "'printf'"),
            ("const char* p = \"/pro\" \"c/self/cmdline\";\n", "system path"),
        ]:
            self.assertIn(why, grade.lint_region(body, 3), body)

    def test_kernel_code_passes(self):
        body = ("  const uint32_t mask = 0xffff'ffffu;\n  auto row = [&](int j) -> float& { return s[j / 2][2 * h + j % 2]; };\n"
                "#pragma unroll\n  for (int i = 0; i < 4; ++i) { float sigma = row(i); reader[i] = sigma; }\n")
        self.assertEqual(grade.lint_region(body, 5), "")

    def test_a_comment_or_string_may_say_anything(self):
        self.assertEqual(grade.lint_region("  // exit early? no: static analysis says abort() is bad\n  int x = 1;\n", 3), "")


class LockTest(unittest.TestCase):
    def test_one_grading_at_a_time(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "lock")
            first = grade.one_grading_at_a_time(path)
            with self.assertRaises(grade.GradingBusy) as caught:
                grade.one_grading_at_a_time(path)
            self.assertIn(f"another grading is running on this machine (pid {os.getpid()}", str(caught.exception))
            os.close(first)
            os.close(grade.one_grading_at_a_time(path))  # free again once the first is done
            os.symlink(path, path + ".link")
            with self.assertRaises(grade.GradingBusy):
                grade.one_grading_at_a_time(path + ".link")  # never through a link


class BuildLogTest(unittest.TestCase):
    def test_only_the_students_own_error_lines_reach_the_student(self):
        secret = "classroom/instructor/questions.md:3:1: error: the rubric's answer is 42"
        kept = []
        reason = grade.build_until_clean(lambda: (False, "In file included from x.h:1:\n" + secret + "\n"), "/tmp/t",
                                         {}, {}, "chapter 03's CPU runner", kept.append)
        self.assertIn("none of the compiler's errors falls inside an exercise region", reason)
        self.assertNotIn("42", reason)
        self.assertIn("42", kept[0])  # the grader's own log keeps it


class SubmissionTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        with open(os.path.join(ROOT, ALGORITHM)) as f:
            self.text = f.read()

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, rel, text):
        path = os.path.join(self.tmp.name, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_a_tree_a_zip_and_a_loose_file(self):
        self.write("tree/" + ALGORITHM, self.text)
        self.assertEqual(list(grade.locate(os.path.join(self.tmp.name, "tree"), ROOT)), [ALGORITHM])
        z = os.path.join(self.tmp.name, "s.zip")
        with zipfile.ZipFile(z, "w") as f:
            f.writestr("handout/" + ALGORITHM, self.text)
        self.assertEqual(list(grade.locate(z, ROOT)), [ALGORITHM])
        loose = self.write("loose/algorithm.h", self.text)
        self.assertEqual(list(grade.locate(os.path.dirname(loose), ROOT)), [ALGORITHM])

    def test_anything_else_gets_one_line_saying_what_to_submit(self):
        self.write("junk/notes.txt", "my answers")
        with self.assertRaises(grade.SubmissionError) as caught:
            grade.locate(os.path.join(self.tmp.name, "junk"), ROOT)
        self.assertIn("submit the whole tree, a zip of it, or only the files you edited", str(caught.exception))
        z = os.path.join(self.tmp.name, "evil.zip")
        with zipfile.ZipFile(z, "w") as f:
            f.writestr("../../etc/passwd", "x")
        with self.assertRaises(grade.SubmissionError) as caught:
            grade.locate(z, ROOT)
        self.assertIn("unsafe path", str(caught.exception))

    def test_launcher_markers_follow_the_exercise(self):
        # Chapter 06's producer: the device region is in flash3_tile.cuh; the launchers' regions
        # are blank in the solution. Handing in only the device file leaves those blank (they are
        # never the student's: code put there is dropped); handing in nothing keeps their stubs.
        if grade.STUDENT_COPY:
            self.skipTest("a student copy has no solution, so no region is blank in it")
        producer = [{"id": "ch06_producer", "chapter": 6, "device": "gpu", "title": "p", "points": 10, "tests": "z"}]
        tile = "chapters/06_flash_attention_v3/flash3_tile.cuh"
        launcher = "chapters/06_flash_attention_v3/flash_attention_v3_specialized_sm90a.cu"
        with open(os.path.join(ROOT, tile)) as f:
            source = f.read()
        # A body of the student's own (the same in the instructor's tree and in a handout).
        begin = source.index("\n", source.index("// BEGIN SOLUTION ch06_producer")) + 1
        end = source.rindex("\n", 0, source.index("// END SOLUTION", begin)) + 1
        solved = source[:begin] + "  for (int j = 0; j < n_tiles; ++j) load_k(j, 0);\n" + source[end:]
        with open(os.path.join(ROOT, launcher)) as f:
            text = f.read()
        marker = text.index("\n", text.index("// BEGIN SOLUTION ch06_producer")) + 1
        injected = text[:marker] + "  p.shape.causal = false;\n" + text[marker:]
        files = {tile: self.write("p/" + tile, solved), launcher: self.write("p/" + launcher, injected)}
        for given, taken_expected in ((files, True), ({}, False)):
            tree = os.path.join(self.tmp.name, f"graded_{taken_expected}")
            problems, taken = grade.splice(ROOT, tree, given, producer)
            self.assertEqual(problems, {})
            self.assertEqual(bool(taken.get("ch06_producer")), taken_expected)
            with open(os.path.join(tree, launcher)) as f:
                graded = f.read()
            self.assertNotIn("p.shape.causal = false", graded)
            self.assertEqual("FA_NOT_IMPLEMENTED" in graded, not taken_expected)

    def test_only_region_bodies_are_taken(self):
        # Code added outside the regions (a static initializer that fakes a result) is dropped;
        # a banned body is stubbed with the reason.
        evil = self.text.replace("namespace fa::online {", "namespace fa::online {\nstatic int fake = (exit(0), 0);", 1)
        # The region gets a body of the student's own (in a handout it holds the stub, which is
        # not taken as the student's code).
        begin = evil.index("\n", evil.index("// BEGIN SOLUTION ch03_online_update")) + 1
        end = evil.rindex("\n", 0, evil.index("// END SOLUTION", begin)) + 1
        evil = evil[:begin] + "  return {score, l};\n" + evil[end:]
        path = self.write("s/" + ALGORITHM, evil)
        tree = os.path.join(self.tmp.name, "graded")
        problems, taken = grade.splice(ROOT, tree, {ALGORITHM: path}, EXERCISES)
        with open(os.path.join(tree, ALGORITHM)) as f:
            graded = f.read()
        self.assertNotIn("fake", graded)
        self.assertTrue(taken.get("ch03_online_update"))
        self.assertIn("FA_NOT_IMPLEMENTED", open(os.path.join(tree, "chapters/02_safe_softmax/safe_softmax.cu")).read())
        # (in the instructor's tree or in a handout: the line goes right after the BEGIN line)
        begin = self.text.index("\n", self.text.index("// BEGIN SOLUTION ch03_online_update")) + 1
        bad = self.text[:begin] + "  abort();\n" + self.text[begin:]
        path = self.write("b/" + ALGORITHM, bad)
        problems, taken = grade.splice(ROOT, os.path.join(self.tmp.name, "graded2"), {ALGORITHM: path}, EXERCISES)
        self.assertIn("'abort'", problems["ch03_online_update"][0])
        self.assertFalse(taken.get("ch03_online_update"))


class ResultsTest(unittest.TestCase):
    def test_weights_and_a_gpu_exercise_not_graded_here(self):
        verdict = {"cases": [{"name": "one row", "weight": 0, "passed": True, "detail": ""},
                             {"name": "n=300", "weight": 1, "passed": False, "detail": "l off"},
                             {"name": "n=2000", "weight": 1, "passed": True, "detail": ""}]}
        value, lines = grade.score_verdict(EXERCISES[0], verdict)
        self.assertEqual(value, 3)
        self.assertIn("FAIL n=300", "\n".join(lines))
        trivial_only = {"cases": [{"name": "one row", "weight": 0, "passed": True, "detail": ""},
                                  {"name": "n=300", "weight": 1, "passed": False, "detail": "x"}]}
        self.assertEqual(grade.score_verdict(EXERCISES[0], trivial_only)[0], 0)
        results = grade.results_json(EXERCISES, {"ch03_online_update": ("graded", value, lines),
                                                 "ch02_block_softmax": ("not graded here", "needs a GPU")})
        check_schema(self, results)
        self.assertEqual(results["score"], 3)
        gpu = results["tests"][1]
        self.assertEqual((gpu["score"], gpu["max_score"]), (0, 0))
        self.assertNotIn("status", gpu)
        self.assertIn("NOT GRADED HERE (8 points)", gpu["output"])
        self.assertIn("8 more points of GPU exercises are not graded here", results["output"])
        json.dumps(results)


if __name__ == "__main__":
    unittest.main()
