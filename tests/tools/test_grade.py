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
        self.assertIn("FAILED: b_hang\n  Timeout", by_id["b"]["output"])
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


if __name__ == "__main__":
    unittest.main()
