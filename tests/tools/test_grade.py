"""tools/grade.py's scoring on a fixture: a CTest JUnit file in, a results.json in Gradescope's
schema out, with partial credit, failures, timeouts, skips and a broken build."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import grade  # noqa: E402

JUNIT = """<?xml version="1.0" encoding="UTF-8"?>
<testsuite name="Linux-c++" tests="6" failures="2" disabled="0" skipped="2" hostname="" time="3" timestamp="2026-11-22T00:00:00">
  <testcase name="a_first" classname="a_first" time="0.1" status="run"><system-out>ok</system-out></testcase>
  <testcase name="a_second" classname="a_second" time="0.1" status="run"><system-out>ok</system-out></testcase>
  <testcase name="b_good" classname="b_good" time="0.1" status="run"><system-out>ok</system-out></testcase>
  <testcase name="b_bad" classname="b_bad" time="0.1" status="fail"><failure message="Failed"/><system-out>Expected: rel err below 2e-02
not implemented: b: the kernel</system-out></testcase>
  <testcase name="b_hang" classname="b_hang" time="300" status="fail"><failure message="Timeout"/><system-out></system-out></testcase>
  <testcase name="c_gpu" classname="c_gpu" time="0.0" status="notrun"><skipped message="SKIP_REGULAR_EXPRESSION_MATCHED"/><system-out>no GPU: driver insufficient</system-out></testcase>
</testsuite>
"""

EXERCISES = [
    {"id": "a", "title": "all pass", "points": 10, "tests": "^a_"},
    {"id": "b", "title": "one of three", "points": 6, "tests": "^b_"},
    {"id": "c", "title": "skipped", "points": 4, "tests": "^c_"},
    {"id": "d", "title": "no tests", "points": 1, "tests": "^zzz"},
]


def check_schema(test, results):
    test.assertIsInstance(results["score"], (int, float))
    test.assertIsInstance(results["output"], str)
    test.assertIn(results["visibility"], ("visible", "hidden", "after_due_date", "after_published"))
    for t in results["tests"]:
        test.assertEqual(set(t) - {"name", "number", "score", "max_score", "status", "output", "tags", "visibility"}, set())
        test.assertIsInstance(t["name"], str)
        test.assertIsInstance(t["score"], (int, float))
        test.assertIsInstance(t["max_score"], (int, float))
        test.assertIn(t["status"], ("passed", "failed"))
        test.assertIsInstance(t["output"], str)


class GradeTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.junit = os.path.join(self.tmp.name, "tests.xml")
        with open(self.junit, "w") as f:
            f.write(JUNIT)

    def tearDown(self):
        self.tmp.cleanup()

    def test_scores_from_a_junit_file(self):
        results = grade.score(EXERCISES, grade.read_junit(self.junit))
        check_schema(self, results)
        by_id = {t["name"].split(":")[0]: t for t in results["tests"]}
        self.assertEqual((by_id["a"]["score"], by_id["a"]["status"]), (10, "passed"))
        self.assertEqual((by_id["b"]["score"], by_id["b"]["status"]), (2, "failed"))
        self.assertIn("FAILED: b_bad", by_id["b"]["output"])
        self.assertIn("not implemented: b: the kernel", by_id["b"]["output"])
        self.assertIn("FAILED: b_hang\n  Timeout: the test ran past the time limit", by_id["b"]["output"])
        self.assertEqual(by_id["c"]["score"], 0)
        self.assertIn("SKIPPED: c_gpu\n  no GPU: driver insufficient", by_id["c"]["output"])
        self.assertEqual(by_id["d"]["score"], 0)
        self.assertIn("no test matched", by_id["d"]["output"])
        self.assertEqual(results["score"], 12)
        self.assertEqual(results["output"], "12 of 21 points")

    def test_a_broken_build_scores_zero_with_the_reason(self):
        results = grade.score(EXERCISES, [], build_error="kernel.cu(12): error: expected a ';'")
        check_schema(self, results)
        self.assertEqual(results["score"], 0)
        for t in results["tests"]:
            self.assertEqual(t["score"], 0)
            self.assertIn("expected a ';'", t["output"])

    def test_the_command_line_writes_results_json(self):
        config = os.path.join(self.tmp.name, "exercises.json")
        with open(config, "w") as f:
            json.dump({"exercises": EXERCISES}, f)
        out = os.path.join(self.tmp.name, "results.json")
        run = subprocess.run([sys.executable, os.path.join(HERE, "..", "..", "tools", "grade.py"), "--junit", self.junit,
                              "--config", config, "--out", out], capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn("grade: 12 of 21 points", run.stdout)
        with open(out) as f:
            results = json.load(f)
        check_schema(self, results)
        self.assertIsInstance(results["execution_time"], (int, float))


    def test_a_bad_config_is_a_one_line_error_and_writes_nothing(self):
        out = os.path.join(self.tmp.name, "results.json")
        for exercises, message in (([{"id": "a", "title": "t", "points": -2, "tests": "^a"}], "negative points -2"),
                                   ([{"id": "a", "title": "t", "points": 1, "tests": "("}], "tests pattern"),
                                   ([], "'exercises' must be a non-empty list")):
            config = os.path.join(self.tmp.name, "bad.json")
            with open(config, "w") as f:
                json.dump({"exercises": exercises}, f)
            run = subprocess.run([sys.executable, os.path.join(HERE, "..", "..", "tools", "grade.py"), "--junit",
                                  self.junit, "--config", config, "--out", out], capture_output=True, text=True)
            self.assertEqual(run.returncode, 1)
            self.assertEqual(len(run.stderr.strip().splitlines()), 1, run.stderr)
            self.assertIn(message, run.stderr)
            self.assertFalse(os.path.exists(out))


class OverlayTest(unittest.TestCase):
    def test_takes_only_the_exercise_files_from_the_submission(self):
        with tempfile.TemporaryDirectory() as tmp:
            root, sub, work = (os.path.join(tmp, d) for d in ("root", "sub", "work"))
            for base in (root, sub):
                os.makedirs(os.path.join(base, "chapters"))
                os.makedirs(os.path.join(base, "tests"))
            with open(os.path.join(root, "chapters", "k.h"), "w") as f:
                f.write("// BEGIN SOLUTION ex1: write it\nint solution;\n// END SOLUTION\n")
            with open(os.path.join(root, "tests", "t.cpp"), "w") as f:
                f.write("instructor test\n")
            with open(os.path.join(sub, "chapters", "k.h"), "w") as f:
                f.write("int student;\n")
            with open(os.path.join(sub, "tests", "t.cpp"), "w") as f:
                f.write("tampered test\n")
            taken = grade.overlay_submission(root, sub, work, [{"id": "ex1"}])
            self.assertEqual(taken, ["chapters/k.h"])
            with open(os.path.join(work, "chapters", "k.h")) as f:
                self.assertEqual(f.read(), "int student;\n")
            with open(os.path.join(work, "tests", "t.cpp")) as f:
                self.assertEqual(f.read(), "instructor test\n")
            os.remove(os.path.join(sub, "chapters", "k.h"))
            with self.assertRaises(FileNotFoundError):
                grade.overlay_submission(root, sub, os.path.join(tmp, "work2"), [{"id": "ex1"}])


class CompileFailureTest(unittest.TestCase):
    """A submission whose exercise does not compile: the compiler's errors name the exercise, its
    regions go back to the handout's stubs, and it alone scores 0 with the errors."""

    SOURCE = """int keep() { return 1; }
void launch() {
  // BEGIN SOLUTION gpu_ex: launch it
  kernel<<<1, 1>>>(oops);
  // END SOLUTION
}
__global__ void kernel(int x) {
  // BEGIN SOLUTION gpu_ex (device): the body
  int y = x;
  // END SOLUTION
}
float cpu() {
  // BEGIN SOLUTION cpu_ex: the row
  return 1.0f;
  // END SOLUTION
}
"""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = os.path.join(self.tmp.name, "root")  # the instructor's
        self.tree = os.path.join(self.tmp.name, "tree")  # the copy being graded
        for base in (self.root, self.tree):
            os.makedirs(os.path.join(base, "chapters"))
            with open(os.path.join(base, "chapters", "k.cu"), "w") as f:
                f.write(self.SOURCE.replace("(oops)", "(1)") if base == self.root else self.SOURCE)
        self.by_file = {"chapters/k.cu": {"gpu_ex", "cpu_ex"}}

    def tearDown(self):
        self.tmp.cleanup()

    def read(self):
        with open(os.path.join(self.tree, "chapters", "k.cu")) as f:
            return f.read()

    def test_reads_nvcc_and_gcc_error_lines(self):
        log = (f"[ 40%] Building CUDA object chapters/CMakeFiles/x.dir/k.cu.o\n"
               f"{self.tree}/chapters/k.cu(4): error: identifier \"oops\" is undefined\n"
               f"{self.tree}/chapters/k.cu:14:3: error: expected ';'\n"
               f"{self.tree}/common/x.h:3:1: fatal error: y.h: No such file or directory\n"
               "make[2]: *** [x] Error 1\n")
        errors = grade.compile_errors(log, self.tree)
        self.assertEqual([(p, n) for p, n, _ in errors], [("chapters/k.cu", 4), ("chapters/k.cu", 14), ("common/x.h", 3)])
        self.assertEqual(errors[0][2], 'chapters/k.cu(4): error: identifier "oops" is undefined')

    def test_an_error_inside_a_region_blames_its_exercise_only(self):
        errors = [("chapters/k.cu", 4, "k.cu(4): error: oops")]
        self.assertEqual(grade.broken_exercises(errors, self.tree, self.by_file), {"gpu_ex": ["k.cu(4): error: oops"]})

    def test_an_error_outside_the_regions_blames_every_exercise_of_the_file(self):
        errors = [("chapters/k.cu", 1, "k.cu(1): error")]
        self.assertEqual(set(grade.broken_exercises(errors, self.tree, self.by_file)), {"gpu_ex", "cpu_ex"})

    def test_errors_in_the_instructors_files_blame_nobody(self):
        errors = [("common/x.h", 3, "x.h:3: error")]
        self.assertEqual(grade.broken_exercises(errors, self.tree, self.by_file), {})

    def test_the_broken_exercise_gets_stubs_and_scores_zero_with_the_errors(self):
        self.assertEqual(grade.stub_out(self.root, self.tree, self.by_file, {"gpu_ex"}), {"gpu_ex"})
        text = self.read()
        self.assertNotIn("oops", text)
        self.assertIn('FA_NOT_IMPLEMENTED("gpu_ex: launch it");', text)
        self.assertIn("  // BEGIN SOLUTION gpu_ex (device): the body\n  // TODO(gpu_ex)", text)
        self.assertIn("return 1.0f;", text)  # the other exercise keeps the student's code
        exercises = [{"id": "gpu_ex", "title": "g", "points": 5, "tests": "^g"},
                     {"id": "cpu_ex", "title": "c", "points": 3, "tests": "^c"}]
        cases = [("g1", "failed", "not implemented: gpu_ex: launch it"), ("c1", "passed", "")]
        results = grade.score(exercises, cases, broken={"gpu_ex": ["k.cu(4): error: identifier \"oops\""]})
        check_schema(self, results)
        self.assertEqual([t["score"] for t in results["tests"]], [0, 3])
        self.assertIn("did not compile", results["tests"][0]["output"])
        self.assertIn("oops", results["tests"][0]["output"])

    def test_a_file_without_its_markers_is_replaced_by_the_instructors_stubs(self):
        with open(os.path.join(self.tree, "chapters", "k.cu"), "w") as f:
            f.write("void launch() { kernel<<<1, 1>>>(oops); }\n")  # the student deleted the markers
        errors = [("chapters/k.cu", 1, "k.cu(1): error: oops")]
        self.assertEqual(set(grade.broken_exercises(errors, self.tree, self.by_file)), {"gpu_ex", "cpu_ex"})
        self.assertEqual(grade.stub_out(self.root, self.tree, self.by_file, {"gpu_ex"}), {"gpu_ex", "cpu_ex"})
        text = self.read()
        self.assertIn('FA_NOT_IMPLEMENTED("gpu_ex: launch it");', text)
        self.assertIn('FA_NOT_IMPLEMENTED("cpu_ex: the row");', text)
        self.assertIn("int keep() { return 1; }", text)


if __name__ == "__main__":
    unittest.main()
