"""classroom/grade_batch.py and classroom/autograder.py without a grading: a Gradescope export (its
zip, or unpacked) read into one grading per submission and one gradebook row per submitter, a
plain folder of students, and the weekly autograder's assignment (only that week's exercises)."""
import csv
import json
import os
import sys
import tempfile
import unittest
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "classroom"))
import autograder  # noqa: E402
import grade_batch  # noqa: E402
import handout  # noqa: E402

# What Gradescope's "Export Submissions" writes beside the submission folders (a group submission
# has several submitters; the keys are Ruby symbols).
METADATA = """submission_1001:
  :submitters:
  - :name: Ada Lovelace
    :sid: '17'
    :email: ada@example.edu
  :created_at: 2026-03-02 10:00:00.000000000 -08:00
  :score: 5.0
  :history: []
submission_1002:
  :submitters:
  - :name: Alan Turing
    :sid: '18'
    :email: alan@example.edu
  - :name: "=Grace Hopper"
    :sid: '19'
    :email: grace@example.edu
  :created_at: 2026-03-02 11:00:00.000000000 -08:00
  :score: 0.0
"""


class ExportTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.export = os.path.join(self.tmp.name, "assignment_42_export")
        for rel, text in (("submission_metadata.yml", METADATA),
                          ("submission_1001/chapters/03_online_softmax/algorithm.h", "// a tree\n"),
                          ("submission_1002/algorithm.h", "// loose files\n")):
            path = os.path.join(self.export, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        zipped = os.path.join(self.tmp.name, "s.zip")
        with zipfile.ZipFile(zipped, "w") as z:
            z.writestr("handout/x.h", "x")
        os.makedirs(os.path.join(self.export, "submission_1003"))
        os.replace(zipped, os.path.join(self.export, "submission_1003", "upload.zip"))

    def tearDown(self):
        self.tmp.cleanup()

    def check(self, found, notes, export):
        self.assertTrue(export)
        self.assertEqual([s.name for s in found], ["submission_1001", "submission_1002", "submission_1003"])
        self.assertEqual(found[0].submitters, [("Ada Lovelace", "17", "ada@example.edu")])
        self.assertEqual([s[0] for s in found[1].submitters], ["Alan Turing", "=Grace Hopper"])
        self.assertTrue(found[2].path.endswith("upload.zip"))  # an upload Gradescope did not unpack
        self.assertIn("'submission_1003' is not in submission_metadata.yml", notes[0])

    def test_the_export_folder_and_its_zip(self):
        self.check(*grade_batch.gather(self.export, os.path.join(self.tmp.name, "unused")))
        self.check(*grade_batch.gather(self.tmp.name, os.path.join(self.tmp.name, "unused")))  # one folder up
        zipped = os.path.join(self.tmp.name, "export.zip")
        with zipfile.ZipFile(zipped, "w") as z:
            for base, _, names in os.walk(self.export):
                for name in names:
                    path = os.path.join(base, name)
                    z.write(path, os.path.relpath(path, self.tmp.name))
        found, notes, export = grade_batch.gather(zipped, os.path.join(self.tmp.name, "unpacked"))
        self.check(found, notes, export)
        self.assertTrue(found[0].path.startswith(os.path.join(self.tmp.name, "unpacked")))

    def test_one_gradebook_row_per_submitter(self):
        found, _, export = grade_batch.gather(self.export, os.path.join(self.tmp.name, "unused"))
        exercises = [{"id": "a_cpu", "points": 5}, {"id": "b_gpu", "points": 8}]
        results = {"score": 4, "tests": [{"number": "1", "score": 4, "max_score": 5},
                                         {"number": "2", "score": 0, "max_score": 0}]}
        book = os.path.join(self.tmp.name, "gradebook.csv")
        grade_batch.write_gradebook(book, exercises, [(s, s.name, results) for s in found], export)
        with open(book, newline="") as f:
            rows = list(csv.reader(f))
        self.assertEqual(rows[0], ["student", "sid", "email", "submission", "score", "possible_here", "a_cpu", "b_gpu"])
        self.assertEqual(rows[1], ["Ada Lovelace", "17", "ada@example.edu", "submission_1001", "4", "5", "4", ""])
        self.assertEqual([r[0] for r in rows[2:]], ["Alan Turing", "'=Grace Hopper", "submission_1003"])

    def test_a_plain_folder_of_students(self):
        os.makedirs(os.path.join(self.tmp.name, "plain", "ada"))
        with open(os.path.join(self.tmp.name, "plain", "notes.txt"), "w") as f:
            f.write("x")
        found, notes, export = grade_batch.gather(os.path.join(self.tmp.name, "plain"), self.tmp.name)
        self.assertFalse(export)
        self.assertEqual([(s.name, s.submitters) for s in found], [("ada", [("ada", "", "")])])
        self.assertEqual(notes, ["skipping 'notes.txt': neither a folder nor a .zip (a symbolic link is neither)"])
        with self.assertRaises(grade_batch.BatchError) as caught:
            grade_batch.gather(os.path.join(self.tmp.name, "missing"), self.tmp.name)
        self.assertIn("is neither a folder nor a zip", str(caught.exception))


class WeeklyAutograderTest(unittest.TestCase):
    def test_a_weeks_assignment_lists_that_weeks_exercises_only(self):
        every = handout.catalog(ROOT)
        for week in sorted({ex["week"] for ex in every}):
            chosen = autograder.assignment(ROOT, week=week)["exercises"]
            self.assertEqual(chosen, [ex["id"] for ex in every if ex["week"] == week])
        with self.assertRaises(SystemExit) as caught:
            autograder.assignment(ROOT, week=99)
        self.assertIn("no exercise has week 99; the weeks in classroom/exercises.json are 1,", str(caught.exception))
        self.assertIsNone(autograder.assignment(ROOT))

    def test_the_zip_holds_the_assignment_that_run_autograder_passes_on(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = os.path.join(tmp, "tree")
            for rel in ("classroom/instructor/questions.md", "classroom/gradescope/setup.sh",
                        "classroom/gradescope/run_autograder", "chapters/01_first/algorithm.h"):
                os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
                with open(os.path.join(root, rel), "w") as f:
                    f.write("x\n")
            with open(os.path.join(root, "classroom", "exercises.json"), "w") as f:
                json.dump({"exercises": [{"id": f"e{w}", "chapter": 1, "week": w, "device": "cpu", "title": "t",
                                          "points": 1, "tests": "x"} for w in (1, 2)]}, f)
            out = os.path.join(tmp, "autograder.zip")
            autograder.make_zip(root, out, autograder.assignment(root, week=2))
            with zipfile.ZipFile(out) as z:
                self.assertEqual(json.loads(z.read(autograder.ASSIGNMENT))["exercises"], ["e2"])
                self.assertIn("run_autograder", z.namelist())
        with open(os.path.join(ROOT, "classroom", "gradescope", "run_autograder")) as f:
            self.assertIn("--config classroom/assignment.json", f.read())



class HostileNamesTest(unittest.TestCase):
    def test_a_linked_zip_is_not_a_submission_and_names_cannot_take_the_gradebook(self):
        with tempfile.TemporaryDirectory() as tmp:
            real = os.path.join(tmp, "elsewhere.zip")
            with zipfile.ZipFile(real, "w") as z:
                z.writestr("x.txt", "x")
            folder = os.path.join(tmp, "subs")
            os.makedirs(os.path.join(folder, "bob"))
            os.symlink(real, os.path.join(folder, "mallory.zip"))
            found, skipped = grade_batch.students(folder)
            self.assertEqual([name for name, _ in found], ["bob"])
            self.assertEqual(skipped, ["mallory.zip"])
        self.assertNotEqual(grade_batch.safe_name("gradebook.csv"), "gradebook.csv")
        self.assertEqual(grade_batch.shown("zz\x1b[2Jok\udcff"), "zz?[2Jok?")


if __name__ == "__main__":
    unittest.main()
