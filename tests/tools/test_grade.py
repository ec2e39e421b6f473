"""classroom/grade.py without a runner's build: what it takes from a submission (a tree, a zip, loose
files, or nothing it can use), what the region lint and the compiler's own reading of a region
reject, that only region bodies go into a copy made from the handout, the sandbox user (as root),
what of a failed build reaches the student, and the results.json it writes (Gradescope's schema;
GPU exercises without a GPU not graded)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "classroom"))
import grade  # noqa: E402
import handout  # noqa: E402

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
            ("int x = 1; // \\ \t\n#include <cstdlib>\n", "line splicing"),
            ("int x = 1; // \\\r\n#include <cstdlib>\n", "U+000D"),
            # 0x1'a is one number to the compiler, so the next quote opens a character literal
            # ('"', in an ignored attribute's arguments): g++ compiles the exit after it as code.
            # A quote right after a number is refused (another compiler could split it otherwise).
            ("[[maybe::note(0x1'a'\"')]] int v = 0; std::exit(0); //\")]]\n", "right after a number"),
            # g++ reads '$' and non-ASCII letters as part of a number as well.
            ("[[maybe::note(0x1\u00e9'a'\"')]] int v = 0; std::exit(0); //\")]]\n", "right after a number"),
            ("[[maybe::note(0x1'a '\"')]] int v = 0; std::exit(0); //\")]]\n", "attributes"),
            ("  std::exit(0);\n", "'exit'"),
            ("  struct A { [[gnu::section(\".text.x\\n.incbin \\\"/etc/passwd\\\"\")]] void f() {} };\n", "attributes"),
            ("  struct A { [ [gnu::cold]] void f() {} };\n", "attributes"),
            ("  __attribute__((constructor)) int y = 0;\n", "attributes"),
            # A region may not close the function it sits in (to add code at file scope).
            ("return 1; }\nstruct Forge { Forge() {} } forge;\ninline int tail() {\n", "unmatched"),
            ("__builtin_execv(\"/bin/sh\", nullptr);\n", "'__builtin_execv'"),
            ("auto f = fopen64(\"x\", \"r\");\n", "'fopen64'"),
            ("printf(\"ok out=0\\n\");\n", "'printf'"),
            ("const char* p = \"/pro\" \"c/self/cmdline\";\n", "system path"),
            # Macros of the compiler's command line, which no header defines.
            ("const char* t = FA_RUNNER_TASKS;\n", "command line"),
            ("pthread_t t; pthread_create(&t, nullptr, f, nullptr);\n", "'pthread_create'"),
            # A region holds whole statements: none that takes over the instructor's next one.
            ("  state.m = 0;\n  if (false)\n", "whole statements"),
            ("  for (;;)  // forever\n#pragma unroll\n", "whole statements"),
            ("  return\n", "whole statements"),
            ("  else { x = 1; }\n", "begins with 'else'"),
            ("int arch = __CUDA_ARCH__ + __OPTIMIZE__;\n", "command line"),
        ]:
            self.assertIn(why, grade.lint_region(body, 3), body)

    def test_kernel_code_passes(self):
        body = ("  const uint32_t mask = 0xffff'ffffu;\n  auto row = [&](int j) -> float& { return s[j / 2][2 * h + j % 2]; };\n"
                "#pragma unroll\n  for (int i = 0; i < 4; ++i) { float sigma = row(i); reader[i] = sigma; }\n")
        self.assertEqual(grade.lint_region(body, 5), "")

    def test_a_comment_or_string_may_say_anything(self):
        self.assertEqual(grade.lint_region("  // exit early? no: static analysis says abort() is bad\n  int x = 1;\n", 3), "")


# The two ways past a lint that reads text differently from the compiler: a backslash, other
# whitespace and a newline (g++ splices the lines, so a // comment goes on over the next line),
# and a character literal glued to a number with a digit separator.
SPLICE_BYPASS = "  return {score, 1.0f}; // \\\x0c\n#include \"../../classroom/grader/runner_cpu.cpp\"\n"
NUMBER_BYPASS = "  [[maybe::note(0x1'a'\"')]] int v = 0; std::exit(0); //\")]]\n  return {score, 1.0f};\n"


def needs_root(test):
    return unittest.skipUnless(os.geteuid() == 0, "the sandbox user exists only when the grader runs as root")(test)


class CompilerViewTest(unittest.TestCase):
    """compiler_view: the region as g++ reads it (run as the sandbox's user when root)."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        # The machine's own lock folder: a test takes a sandbox user as a grading does, so it never
        # takes (and kills and sweeps) the user of a grading running on the same machine.
        cls.state = grade.STATE_DIR
        cls.box = grade.claim_sandbox(state=cls.state)
        os.chmod(cls.tmp.name, 0o755)
        cls.work = grade.sandbox_folder(cls.box, cls.tmp.name, "check")

    @classmethod
    def tearDownClass(cls):
        cls.box.close()
        cls.tmp.cleanup()

    def view(self, body):
        return grade.compiler_view(body, self.box, self.work)

    def test_plain_code_passes(self):
        body = ("  const uint32_t mask = 0xffff'ffffu;\n#pragma unroll 4\n  for (int i = 0; i < 4; ++i) { s[i] = 'a'; }\n"
                "  auto l = [&](int j) -> float& { return q[j]; };\n  k<<<1, 2>>>(x);\n  return {m, \"}{\"};\n")
        self.assertEqual(self.view(body), "")

    def test_what_the_compiler_reads_as_directives_or_escapes(self):
        for body, why in [
            (SPLICE_BYPASS, "U+000C"),
            ("int x = 1; // \\  \n#include <cstdlib>\n", "line splicing"),
            ('int x = 1;\n  #  include "/etc/hostname"\n', "directive"),
            ("int x;\n# 7 \"runner_cpu.cpp\"\nint y;\n", "directive"),
            ("int x;\n#define Y 2\n", "directive"),
            ("int x;\n#undef __cplusplus\n", "directive"),
            ("int x;\n#pragma GCC optimize(\"O0\")\n", "directive"),
            ("int x = __LINE__;\n", "macro"),
            ('_Pragma("GCC diagnostic ignored \\"-Wall\\"") int a;\n', "directive"),
            ("return 1; }\nstruct Forge { Forge() {} } forge;\ninline int tail() {\n", "unmatched '}'"),
            # What the lint read as a character literal is code to the compiler, and the reverse.
            ("(void)sizeof'}'; }\nstruct E {} e;\ninline int f() { return '{'; \n", "unmatched '}'"),
            ("auto s = R\"x(\n", "unterminated raw string"),
            ("int a; /* \n", "unterminated comment"),
            ("int a = 'b;\n", "missing terminating"),
            ('auto s = "{P:<stdin>;F:<NULL>;L:1;C:1;S:0;M:0x1;E:0,LOC:1,R:1}}";\n', "'{P:'"),
        ]:
            self.assertIn(why, self.view(body), body)

    def test_an_include_of_the_instructors_files_is_refused(self):
        for path in ("classroom/instructor/questions.md", "classroom/grader/runner_cpu.cpp"):
            if not os.path.isfile(os.path.join(ROOT, path)):
                continue  # a student copy holds no instructor's file
            body = f'  int x = 1;\n#include "{os.path.join(ROOT, path)}"\n'
            why = self.view(body)
            # Refused: as a directive, or (as the sandbox's user) because the file cannot be read.
            self.assertTrue("directive" in why or "Permission denied" in why, why)


class SandboxTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.state = grade.STATE_DIR  # shared with real gradings (see CompilerViewTest)

    def tearDown(self):
        self.tmp.cleanup()

    def test_without_root_there_is_no_sandbox_and_the_grader_says_so(self):
        if os.geteuid() == 0:
            self.assertTrue(grade.claim_sandbox(state=self.state).active)
            return
        box = grade.claim_sandbox(state=self.state)
        self.assertFalse(box.active)

    @needs_root
    def test_what_a_killed_grading_left_goes_before_the_next_runs(self):
        # A grading killed midway (grade_batch.py's time limit) leaves its folders, which name
        # its student's code, and its user's files in the shared places, here a tree deeper than
        # any recursion would go. The next grading to claim that user removes both first.
        first = grade.claim_sandbox(state=self.state)
        uid = first.uid
        stale = tempfile.mkdtemp(prefix="fa_sandbox_")
        with open(os.path.join(stale, "secret"), "w") as f:
            f.write("the previous student's region\n")
        upload = tempfile.mkdtemp(prefix="fa_upload_")  # a zip being unpacked when the grading was killed
        with open(os.path.join(upload, "algorithm.h"), "w") as f:
            f.write("a student's upload\n")
        keep = tempfile.mkdtemp(prefix="kept_")  # not a grading's folder: a record may not name it
        first.record(stale)
        first.record(upload)
        first.record(keep)
        deep = os.path.join("/tmp", f"fa_test_deep_{uid}")
        nest = ("import os\n"
                f"os.mkdir({deep!r}); fd = os.open({deep!r}, os.O_RDONLY)\n"
                "for _ in range(1500):\n"
                "    os.mkdir('a', dir_fd=fd); inner = os.open('a', os.O_RDONLY, dir_fd=fd); os.close(fd); fd = inner\n")
        made = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", sys.executable, "-c",
                               nest])
        self.assertEqual(made.returncode, 0)
        # A folder open to all under one that is root's and closed to writes (a chroot's tmp, say).
        parent = tempfile.mkdtemp(prefix="fa_test_parent_")
        os.chmod(parent, 0o755)
        public = os.path.join(parent, "tmp")
        os.mkdir(public)
        os.chmod(public, 0o1777)
        hidden = os.path.join(public, "left_for_the_next_student")
        made = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", sys.executable, "-c",
                               f"open({hidden!r}, 'w').write('x')"])
        self.assertEqual(made.returncode, 0)
        os.close(first.lock)  # killed: no cleanup of its own, the lock file keeps its record
        first.lock = None
        try:
            again = grade.claim_sandbox(state=self.state)
            self.assertEqual(again.uid, uid)
            self.assertFalse(os.path.exists(stale), "a killed grading's sandbox folder outlived the next claim")
            self.assertFalse(os.path.exists(upload), "a killed grading's unpacked upload outlived the next claim")
            self.assertFalse(os.path.exists(deep), "the sandbox user's deep tree outlived the next claim")
            self.assertFalse(os.path.exists(hidden), "a file in a public folder under a closed one outlived the claim")
            self.assertTrue(os.path.isdir(keep), "a record removed a folder that is not a grading's")
            again.close()
        finally:
            shutil.rmtree(keep, ignore_errors=True)
            grade.remove_tree(stale)
            grade.remove_tree(upload)
            grade.remove_tree(deep)
            grade.remove_tree(parent)

    @needs_root
    def test_each_grading_has_a_user_of_its_own_and_kills_only_its_own(self):
        first = grade.claim_sandbox(state=self.state)
        second = grade.claim_sandbox(state=self.state)
        try:
            self.assertNotEqual(first.uid, second.uid)
            for box in (first, second):
                self.assertFalse(grade.id_in_use(box.uid))
            runners = [subprocess.Popen(["sleep", "60"], preexec_fn=box.enter, start_new_session=True)
                       for box in (first, second)]
            first.kill_all()  # what the checker does after each case, as the first grading's user
            self.assertEqual(runners[0].wait(timeout=10), -9)
            time.sleep(0.1)
            self.assertIsNone(runners[1].poll(), "one grading killed another's runner")
            second.kill_all()
            self.assertEqual(runners[1].wait(timeout=10), -9)
        finally:
            first.close()
            second.close()
        again = grade.claim_sandbox(state=self.state)  # a freed id is taken again
        self.assertIn(again.uid, (first.uid, second.uid))
        again.close()

    @needs_root
    def test_the_instructors_files_are_out_of_the_sandbox_users_reach(self):
        # A stand-in for the instructor's tree, open to others as a fresh clone is: protect()
        # closes it, and then the compiler run as the sandbox's user cannot read what it holds.
        tree = os.path.join(self.tmp.name, "instructor")
        os.makedirs(os.path.join(tree, "classroom", "instructor"))
        os.chmod(self.tmp.name, 0o755)
        os.chmod(tree, 0o755)
        secret = os.path.join(tree, "classroom", "instructor", "questions.md")
        with open(secret, "w") as f:
            f.write("rubric: the answer is 42\n")
        os.chmod(secret, 0o644)
        box = grade.claim_sandbox(state=self.state)
        try:
            self.assertTrue(box.can_reach(tree))
            said = []
            box.protect([tree], said.append)
            self.assertFalse(box.can_reach(tree))
            self.assertIn("it is now mode 700", said[0])
            work = grade.sandbox_folder(box, self.tmp.name, "build")
            source = os.path.join(work, "region.cpp")
            with open(source, "w") as f:
                f.write(f'#include "{secret}"\n')
            os.chmod(source, 0o644)
            ok, out = grade.run_build(["g++", "-E", source], 60, os.path.join(work, "tmp"), box, cwd=work)
            self.assertFalse(ok)
            self.assertIn("Permission denied", out)
            self.assertNotIn("42", out)
            ok, out = grade.run_build(["g++", "-E", source], 60, os.path.join(work, "tmp"), grade.Sandbox(), cwd=work)
            self.assertIn("42", out)  # root could: the sandbox is what stops it
        finally:
            box.close()


class BuildLogTest(unittest.TestCase):
    def test_only_the_students_own_error_lines_reach_the_student(self):
        secret = "classroom/instructor/questions.md:3:1: error: the rubric's answer is 42"
        kept = []
        reason = grade.build_until_clean(lambda: (False, "In file included from x.h:1:\n" + secret + "\n"), "/tmp/t",
                                         {}, {}, "chapter 03's CPU runner", kept.append)
        self.assertIn("none of the compiler's errors falls inside an exercise region", reason)
        self.assertNotIn("42", reason)
        self.assertIn("42", kept[0])  # the grader's own log keeps it

    def test_a_failed_build_says_where_in_the_region_and_nothing_else(self):
        with tempfile.TemporaryDirectory() as tree:
            rel = "chapters/03_online_softmax/algorithm.h"
            os.makedirs(os.path.join(tree, os.path.dirname(rel)))
            with open(os.path.join(tree, rel), "w") as f:
                f.write("int f() {\n  // BEGIN SOLUTION ch03_online_update: x\n  int a = 1;\n  return b;\n"
                        "  // END SOLUTION\n}\n")
            log = (f"In file included from {tree}/classroom/grader/runner_cpu.cpp:9:\n"
                   f"{tree}/{rel}:4:10: error: 'b' was not declared in this scope\n"
                   f"    4 |   return b;  // the source line, echoed\n"
                   f"{tree}/classroom/instructor/questions.md:1:1: error: rubric: the answer is 42\n"
                   f"{tree}/common/reference.h:9:1: note: candidate: the oracle's signature\n")
            broken = {}
            builds = iter([(False, log), (True, "")])
            reason = grade.build_until_clean(lambda: next(builds), tree, {rel: {"ch03_online_update": 1}}, broken,
                                             "chapter 03's CPU runner", lambda line: None)
            self.assertEqual(reason, "")
            shown = "\n".join(broken["ch03_online_update"])
            self.assertIn("region ch03_online_update (chapters/03_online_softmax/algorithm.h) does not compile: 1 error, "
                          "first at line 2 of your region: 'b' was not declared in this scope", shown)
            for leak in ("42", "oracle", "runner_cpu", tree, "echoed"):
                self.assertNotIn(leak, shown)
            with open(os.path.join(tree, rel)) as f:
                self.assertIn("FA_NOT_IMPLEMENTED", f.read())  # stubbed, and built again


class SubmissionTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        with open(os.path.join(ROOT, ALGORITHM)) as f:
            self.text = f.read()

    def tearDown(self):
        self.tmp.cleanup()
        for folder in grade.UNPACKED:  # the zips locate() unpacked (a grading removes them when it ends)
            shutil.rmtree(folder, ignore_errors=True)
        grade.UNPACKED.clear()

    def write(self, rel, text):
        path = os.path.join(self.tmp.name, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_a_link_a_deep_tree_a_fifo_and_broken_zips_are_one_line_each(self):
        solved = os.path.join(self.tmp.name, "solved.zip")
        with zipfile.ZipFile(solved, "w") as z:
            z.writestr(ALGORITHM, self.text)
        link = os.path.join(self.tmp.name, "mine.zip")
        os.symlink(solved, link)  # another's zip (or the autograder's) handed in as a link
        upper = os.path.join(self.tmp.name, "MINE.ZIP")
        shutil.copy(solved, upper)
        self.assertIn(ALGORITHM, grade.locate(upper, ROOT))  # the extension in any case
        deep = os.path.join(self.tmp.name, "deep", *(["d"] * (grade.MAX_DEPTH + 2)))
        os.makedirs(deep)
        fifo = self.write("fifo/x.txt", "")
        os.remove(fifo)
        os.mkfifo(os.path.join(self.tmp.name, "fifo", "algorithm.h"))
        corrupt = os.path.join(self.tmp.name, "corrupt.zip")
        with open(solved, "rb") as f:
            data = bytearray(f.read())
        data[40:60] = b"\xff" * 20  # inside the stored entry's compressed bytes
        with open(corrupt, "wb") as f:
            f.write(bytes(data))
        many = os.path.join(self.tmp.name, "many.zip")  # empty entries: no bytes, but time and inodes
        with zipfile.ZipFile(many, "w") as z:
            for i in range(grade.MAX_ENTRIES + 1):
                z.writestr(f"e/{i}", "")
        for path, words in ((link, "symbolic link"), (os.path.join(self.tmp.name, "deep"), "deep"),
                            (corrupt, "zip"), (many, f"more than the {grade.MAX_ENTRIES}")):
            with self.assertRaises(grade.SubmissionError, msg=path) as caught:
                grade.locate(path, ROOT)
            self.assertIn(words, str(caught.exception))
        with self.assertRaises(grade.SubmissionError):  # nothing to grade, and no read that blocks
            grade.locate(os.path.join(self.tmp.name, "fifo"), ROOT)

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
        # Chapter 06's producer: the device region (produce_kv) and the host region its launchers
        # call (require_produce_kv, blank in the solution) are both in flash3_tile.cuh. Handing in
        # the file with produce_kv written leaves the host region blank (it is never the
        # student's: code put there is dropped); handing in nothing keeps its stub.
        if grade.STUDENT_COPY:
            self.skipTest("a student copy has no solution, so no region is blank in it")
        producer = [{"id": "ch06_producer", "chapter": 6, "device": "gpu", "title": "p", "points": 10, "tests": "z"}]
        tile = "chapters/06_flash_attention_v3/flash3_tile.cuh"
        with open(os.path.join(ROOT, tile)) as f:
            source = f.read()
        # A body of the student's own (the same in the instructor's tree and in a handout).
        device = source.index("// BEGIN SOLUTION ch06_producer (device)")
        begin = source.index("\n", device) + 1
        end = source.rindex("\n", 0, source.index("// END SOLUTION", begin)) + 1
        solved = source[:begin] + "  for (int j = 0; j < n_tiles; ++j) load_k(j, 0);\n" + source[end:]
        host = solved.index("\n", solved.index("// BEGIN SOLUTION ch06_producer:")) + 1
        injected = solved[:host] + "  static int calls = 0;\n" + solved[host:]
        files = {tile: self.write("p/" + tile, injected)}
        for given, taken_expected in ((files, True), ({}, False)):
            tree = os.path.join(self.tmp.name, f"graded_{taken_expected}")
            problems, taken = grade.splice(ROOT, tree, given, producer)
            self.assertEqual(problems, {})
            self.assertEqual(bool(taken.get("ch06_producer")), taken_expected)
            with open(os.path.join(tree, tile)) as f:
                graded = f.read()
            self.assertNotIn("static int calls", graded)
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


class BypassTest(unittest.TestCase):
    """The two lint bypasses, handed in as a student's file: the region is refused (its exercise
    scores 0 with the reason) and the folder the build sees holds the handout's stub there."""

    def test_each_bypass_scores_0_for_its_region(self):
        with open(os.path.join(ROOT, ALGORITHM)) as f:
            text = f.read()
        begin = text.index("\n", text.index("// BEGIN SOLUTION ch03_online_update")) + 1
        end = text.rindex("\n", 0, text.index("// END SOLUTION", begin)) + 1
        with tempfile.TemporaryDirectory() as tmp:
            os.chmod(tmp, 0o755)
            box = grade.claim_sandbox(state=grade.STATE_DIR)
            try:
                work = grade.sandbox_folder(box, tmp, "check")
                for name, body in (("splice", SPLICE_BYPASS), ("number", NUMBER_BYPASS)):
                    path = os.path.join(tmp, name, ALGORITHM)
                    os.makedirs(os.path.dirname(path))
                    with open(path, "w") as f:
                        f.write(text[:begin] + body + text[end:])
                    tree = os.path.join(tmp, name + "_graded")
                    problems, taken = grade.splice(ROOT, tree, {ALGORITHM: path}, EXERCISES,
                                                   check=lambda b: grade.compiler_view(b, box, work))
                    self.assertFalse(taken.get("ch03_online_update"), name)
                    self.assertIn("ch03_online_update", problems, name)
                    with open(os.path.join(tree, ALGORITHM)) as f:
                        graded = f.read()
                    self.assertNotIn("runner_cpu.cpp", graded)
                    self.assertNotIn("exit(0)", graded)
                    outcome = {"ch03_online_update": ("graded", 0, problems["ch03_online_update"]),
                               "ch02_block_softmax": ("not graded here", "x")}
                    self.assertEqual(grade.results_json(EXERCISES, outcome)["tests"][0]["score"], 0)
                    if name == "splice":  # the compiler's own reading refuses it too, without the lint
                        self.assertIn("U+000C", grade.compiler_view(body, box, work))
            finally:
                box.close()


class SilentFailureTest(unittest.TestCase):
    """A region that throws an exception with no message: the runner's "error" line then carries
    no reason, and an empty reason must never read as a pass."""

    def test_an_exception_without_a_message_scores_0(self):
        with open(os.path.join(ROOT, ALGORITHM)) as f:
            lines = f.read().splitlines(keepends=True)
        out, inside = [], False
        for line in lines:  # every ch03_online_update region's body becomes one silent throw
            if "// BEGIN SOLUTION ch03_online_update" in line:
                out += [line, '  throw std::runtime_error("");\n']
                inside = True
            elif inside and "// END SOLUTION" in line:
                out.append(line)
                inside = False
            elif not inside:
                out.append(line)
        with tempfile.TemporaryDirectory() as tmp:
            os.chmod(tmp, 0o755)
            path = os.path.join(tmp, "algorithm.h")
            with open(path, "w") as f:
                f.write("".join(out))
            config = os.path.join(tmp, "config.json")
            with open(config, "w") as f:
                json.dump({"exercises": ["ch03_online_update"]}, f)
            results = os.path.join(tmp, "results.json")
            subprocess.run([sys.executable, os.path.join(ROOT, "classroom", "grade.py"), "--cpu-only", "--submission",
                            path, "--out", results, "--config", config], check=True, capture_output=True, timeout=900)
            with open(results) as f:
                graded = json.load(f)
        self.assertEqual(graded["score"], 0)
        self.assertIn("failed without a message", graded["tests"][0]["output"])


class HeaderMacroAndLinkTest(unittest.TestCase):
    """Macros of the system headers (they expand only in the real build), a call of the function
    the region sits in, a folder reached through a link, and a zip whose entries clash."""

    def test_header_macros_are_refused(self):
        for body in ('  auto* f = __CONCAT(fo, pen)("x", "r");\n', "  return {state.m, state.l};\n__END_DECLS\n",
                     "  __BEGIN_DECLS int x; __END_DECLS\n", "  (void)stdin;\n",
                     "  std::FA_CONCAT(vec, tor)<float> hq;\n", "  float x = CUDART_INF_F;\n"):
            self.assertIn("is a macro (of the system, CUDA or project headers", grade.lint_region(body, 3), body)
        self.assertEqual(grade.lint_region("  float x = INFINITY;\n  (void)x;\n", 3), "")

    def test_a_region_may_not_call_the_function_it_is_in(self):
        with open(os.path.join(ROOT, "chapters/08_paged_attention/algorithm.h")) as f:
            text = f.read()
        self.assertIn({"merge_partitions_cpu"}, grade.enclosing_functions(text))
        for body in ("  merge_partitions_cpu(partial_o, partial_lse, d, oh, lse);\n",
                     "  (merge_partitions_cpu)(partial_o, partial_lse, d, oh, lse);\n",
                     "  auto f = &merge_partitions_cpu;\n  f(partial_o, partial_lse, d, oh, lse);\n"):
            self.assertIn("the function this region is written in", grade.lint_region(body, 8, {"merge_partitions_cpu"}))

    def test_libcs_own_state_and_other_allocators_are_refused(self):
        for word in ("seed48", "initstate", "valloc", "reallocarray", "asprintf", "on_exit", "wcsdup", "set_new_handler",
                     "get_temporary_buffer", "ecvt", "l64a", "localeconv", "__errno_location",
                     # writable globals a region could count its calls in
                     "signgam", "errno", "environ", "optind", "tzname", "daylight", "stdout", "cout", "xalloc",
                     "set_default_resource"):
            self.assertRegex(grade.lint_region(f"  (void){word};\n", 3), f"'{word}' is (not allowed|a macro)", word)

    def test_cuda_barriers_pass_and_gccs_sync_builtins_do_not(self):
        for word in ("__syncthreads", "__syncwarp", "__syncthreads_or", "__syncthreads_count"):
            self.assertEqual(grade.lint_region(f"  {word}();\n", 2), "", word)
        self.assertRegex(grade.lint_region("  __sync_fetch_and_add(p, 1);\n", 2), "'__sync_fetch_and_add' is not allowed")

    def test_a_build_may_not_take_all_the_memory(self):
        with tempfile.TemporaryDirectory() as tmp:
            ok, out = grade.run_build([sys.executable, "-c", "import resource; print(resource.getrlimit("
                                       "resource.RLIMIT_AS)[0])"], 30, tmp)
            self.assertTrue(ok, out)
            self.assertEqual(int(out.split()[-1]), grade.BUILD_MEMORY)

    def test_a_build_whose_messages_are_not_utf8_is_graded(self):
        with tempfile.TemporaryDirectory() as tmp:
            ok, out = grade.run_build(["printf", "static_assert failed: \\377\\376\\n"], 30, tmp)
            self.assertTrue(ok)
            self.assertIn("static_assert failed", out)

    def test_an_export_with_an_odd_entry_unpacks_the_rest(self):
        with tempfile.TemporaryDirectory() as tmp:
            z = os.path.join(tmp, "export.zip")
            with zipfile.ZipFile(z, "w") as f:
                f.writestr("submission_1/chapters/x.h", "kept")
                f.writestr("submission_2/notes\\todo.txt", "left out")
                f.writestr("submission_2/../../escape.txt", "left out")
            skipped = []
            grade.safe_unzip(z, os.path.join(tmp, "out"), skipped=skipped)
            self.assertEqual(sorted(skipped), sorted(["submission_2/notes\\todo.txt", "submission_2/../../escape.txt"]))
            self.assertTrue(os.path.isfile(os.path.join(tmp, "out", "submission_1", "chapters", "x.h")))
            self.assertFalse(os.path.exists(os.path.join(tmp, "escape.txt")))
            with self.assertRaises(grade.SubmissionError):  # a student's own zip is still refused whole
                grade.safe_unzip(z, os.path.join(tmp, "out2"))

    def test_every_region_knows_its_function(self):
        for rel in grade.exercise_files(ROOT):
            with open(os.path.join(ROOT, rel)) as f:
                text = f.read()
            names = grade.enclosing_functions(text)
            self.assertEqual(len(names), len(grade.regions_in(text, rel)), rel)
            self.assertTrue(all(names), rel)

    def test_a_linked_folder_is_not_read(self):
        with tempfile.TemporaryDirectory() as tmp:
            os.symlink(os.path.join(ROOT, "chapters"), os.path.join(tmp, "chapters"))
            with self.assertRaises(grade.SubmissionError):
                grade.locate(tmp, ROOT)

    def test_a_zip_whose_entries_clash_is_one_line(self):
        with tempfile.TemporaryDirectory() as tmp:
            z = os.path.join(tmp, "s.zip")
            with zipfile.ZipFile(z, "w") as f:
                f.writestr("chapters", "a file")
                f.writestr("chapters/03_online_softmax/algorithm.h", "x")
            with self.assertRaises(grade.SubmissionError) as caught:
                grade.locate(z, ROOT)
            self.assertIn("cannot be unpacked", str(caught.exception))
        for folder in grade.UNPACKED:
            shutil.rmtree(folder, ignore_errors=True)
        grade.UNPACKED.clear()


class ExercisesAreDataTest(unittest.TestCase):
    """An exercise is its exercises.json entry, its regions and its registered case generator: the
    grader's code names no exercise and no chapter count."""

    def setUp(self):
        import handout
        self.exercises = handout.catalog(ROOT)

    def test_every_exercise_has_one_generator_and_every_generator_an_exercise(self):
        import glob
        import re
        registered = []
        for path in glob.glob(os.path.join(ROOT, "classroom", "grader", "cases", "*.cpp")):
            with open(path) as f:
                registered += re.findall(r'^FA_EXERCISE_CASES\("(\w+)"', f.read(), re.M)
        self.assertEqual(sorted(registered), sorted(ex["id"] for ex in self.exercises))
        answers = grade.ANSWERS if os.path.isfile(os.path.join(ROOT, grade.ANSWERS)) else grade.NO_ANSWERS
        self.assertEqual(sorted(set(grade.checker_sources()) - set(grade.CHECKER_SOURCES)),
                         sorted([answers] + [os.path.relpath(p, ROOT) for p in glob.glob(
                             os.path.join(ROOT, "classroom", "grader", "cases", "*.cpp"))]))

    def test_the_step_answers_are_the_instructors_alone(self):
        # The cases' files hold no answer to a step: those come from classroom/instructor/answers.cpp,
        # which the student copy leaves out; in its place answers_absent.cpp answers nothing.
        self.assertTrue(grade.ANSWERS.startswith(handout.INSTRUCTOR + "/"))
        self.assertEqual(os.path.isfile(os.path.join(ROOT, grade.ANSWERS)),
                         os.path.isdir(os.path.join(ROOT, handout.INSTRUCTOR)))  # there in the instructor's tree alone
        with tempfile.TemporaryDirectory() as tmp:
            os.makedirs(os.path.join(tmp, "classroom", "grader", "cases"))
            self.assertIn(grade.NO_ANSWERS, grade.checker_sources(tmp))
            self.assertNotIn(grade.ANSWERS, grade.checker_sources(tmp))
        with open(os.path.join(ROOT, grade.NO_ANSWERS)) as f:
            self.assertIn("bool answers_available() { return false; }", f.read())

    def test_every_cpu_chapter_has_its_runner_tasks(self):
        for ex in self.exercises:
            if ex["device"] == "cpu":
                self.assertTrue(os.path.isfile(os.path.join(ROOT, "classroom", "grader", grade.cpu_tasks(ex["chapter"]))),
                                ex["id"])
        grade.check_graded(self.exercises)
        with self.assertRaises(grade.handout.HandoutError) as caught:
            grade.check_graded([{**self.exercises[0], "id": "later_cpu", "chapter": 99}])
        self.assertIn("'later_cpu' is a CPU exercise of chapter 99, which has no classroom/grader/tasks/cpu_ch99.h",
                      str(caught.exception))

    def test_no_exercise_id_in_the_graders_code(self):
        import glob
        code = [os.path.join(ROOT, "classroom", n) for n in
                ("grade.py", "grade_batch.py", "handout.py", "check_handout.py", "autograder.py")]
        code += glob.glob(os.path.join(ROOT, "classroom", "grader", "*.*"))
        code += glob.glob(os.path.join(ROOT, "classroom", "grader", "tasks", "*"))
        for path in code:
            with open(path) as f:
                text = f.read()
            named = [ex["id"] for ex in self.exercises if ex["id"] in text]
            self.assertEqual(named, [], f"{os.path.relpath(path, ROOT)} names exercises")

    def test_chapter_namespaces_come_from_the_chapters(self):
        for number, folder in grade.handout.chapter_folders(ROOT).items():
            with open(os.path.join(ROOT, folder, "algorithm.h")) as f:
                self.assertIn(f"namespace fa::{grade.CHAPTER_NAMESPACES[number]} {{", f.read())
        self.assertIn("grader", grade.BANNED_NAMESPACES)
        self.assertEqual(grade.lint_region("return fa::online::online_update(s, x);\n", 3), "")
        self.assertIn("another chapter", grade.lint_region("return fa::online::online_update(s, x);\n", 4))

    def test_a_graded_selection_still_stubs_every_exercise(self):
        # One week's exercise graded: the tree the build sees holds no solution of any other.
        week = [ex for ex in self.exercises if ex["id"] == EXERCISES[0]["id"]]
        with tempfile.TemporaryDirectory() as tmp:
            tree = os.path.join(tmp, "tree")
            grade.splice(ROOT, tree, {}, grade.every_exercise(week))
            for ex in self.exercises:
                for rel in grade.exercise_files(ROOT):
                    with open(os.path.join(tree, rel)) as f:
                        text = f.read()
                    self.assertNotIn("// END SOLUTION\n// BEGIN", text)
            stubbed = {ex_id for rel, held in grade.exercise_files(ROOT).items() for ex_id in held
                       if f"FA_NOT_IMPLEMENTED(\"{ex_id}:" in open(os.path.join(tree, rel)).read()}
            self.assertEqual(stubbed, {ex["id"] for ex in self.exercises})


class GpuTurnTest(unittest.TestCase):
    @needs_root
    def test_a_grading_that_waits_for_the_gpu_says_so(self):
        import threading
        with tempfile.TemporaryDirectory() as tmp:
            state = os.path.join(tmp, "state")
            first = grade.gpu_turn(state)
            said = []
            second = []
            waiter = threading.Thread(target=lambda: second.append(grade.gpu_turn(state, log=said.append)))
            waiter.start()
            time.sleep(0.3)
            self.assertTrue(waiter.is_alive())
            self.assertIn("waiting for the GPU: another grading on this machine is running its GPU cases", said[0])
            os.close(first)
            waiter.join(10)
            self.assertFalse(waiter.is_alive())
            self.assertIn("the GPU is free", said[-1])
            os.close(second[0])


class RunnerLimitsTest(unittest.TestCase):
    def test_a_cpu_runner_gets_its_address_space_limit(self):
        # A runner that maps 6 GiB without touching it: allowed with no limit, refused under the
        # CPU exercises' 4 GiB. The checker's verdict says which.
        with tempfile.TemporaryDirectory() as tmp:
            os.chmod(tmp, 0o755)
            checker = grade.build_checker(tmp)
            runner = os.path.join(tmp, "runner")
            with open(runner, "w") as f:
                # The system's python: as root the runner runs as another user, who may not reach ours.
                python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
                f.write(f"#!{python}\nimport mmap, sys\nsys.stdin.buffer.read()\n"
                        "m = mmap.mmap(-1, 6 << 30)\nprint('error the runner mapped 6 GiB')\n")
            os.chmod(runner, 0o755)

            def verdict(*extra):
                done = subprocess.run([checker, "--exercise", "ch03_online_update", "--runner", runner, "--timeout",
                                       "20", *extra], capture_output=True, text=True)
                return done.stdout
            self.assertIn("the runner mapped 6 GiB", verdict())
            limited = verdict("--memory-mb", str(grade.CPU_RUNNER_MEMORY_MB))
            self.assertNotIn("the runner mapped 6 GiB", limited)
            self.assertIn(f"a runner may use {grade.CPU_RUNNER_MEMORY_MB} MiB of address space", limited)


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
