#!/usr/bin/env python3
"""Grade a folder of submissions on one machine (a GPU machine grades the GPU exercises too).

    python3 classroom/grade_batch.py SUBMISSIONS --out GRADES [--time-limit SECONDS] [--cpu-only]
                                     [--config PATH] [--build-dir DIR] [--cmake-args "..."]
                                     [--timeout SECONDS]

SUBMISSIONS is one of:
  - a folder with one entry per student: a folder (their tree, or just the files they edited) or
    a .zip of it; the entry's name, less ".zip", names the student;
  - a Gradescope export ("Export Submissions" on the assignment's Review Grades page), as the zip
    Gradescope gives or unpacked: submission_metadata.yml beside one folder per submission
    (submission_<id>/, what the student uploaded). Each submission is graded once, and each of its
    submitters (a group has several) gets a row with their name, SID and email.
Each is graded by classroom/grade.py in a process of its own, one after the other, with
`--time-limit` seconds for the whole grading (build included; default 1800): past it the student
gets 0 and a line saying so. --config (default classroom/exercises.json) names the exercises
graded, as for grade.py. GRADES/<student>/results.json is Gradescope's schema,
GRADES/<student>/grade.log the grader's log, and GRADES/gradebook.csv one row per student: the
total, the points possible here, and each exercise's score ("" for an exercise not graded on this
machine). As root, each grading builds and runs the student's code as a sandbox user of its own,
which can read neither the instructor's tree, nor SUBMISSIONS, nor GRADES (grade.py makes them
so: mode 0700 on each).
"""
import argparse
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STOP_GRACE_S = 60  # seconds a grading stopped at its time limit has to clean up
sys.path.insert(0, os.path.join(ROOT, "classroom"))

import grade  # noqa: E402
import handout  # noqa: E402

EXPORT_METADATA = "submission_metadata.yml"  # at the top of a Gradescope export
MAX_EXPORT = 16 << 30  # bytes unpacked from an export zip (each submission is limited again by grade.py)


class BatchError(Exception):
    pass


class Submission:
    """One grading: `path` (a folder or a .zip), the folder its results go in under GRADES, and
    who it belongs to: [(name, sid, email)], one per submitter ((name, "", "") outside an export)."""

    def __init__(self, name, path, submitters=None):
        self.name, self.path = name, path
        self.submitters = submitters or [(name, "", "")]


def students(folder):
    """(name, path) for each folder or .zip in `folder`, sorted by name; other entries are listed
    as skipped."""
    found, skipped = [], []
    for entry in sorted(os.listdir(folder)):
        path = os.path.join(folder, entry)
        if entry.startswith("."):
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            found.append((entry, path))
        elif entry.lower().endswith(".zip") and os.path.isfile(path) and not os.path.islink(path):
            found.append((entry[:-4], path))
        else:
            skipped.append(entry)
    return found, skipped


def export_root(folder):
    """The folder of a Gradescope export that holds submission_metadata.yml: `folder` itself or
    its one subfolder (the export zip's assignment_<id>_export/); None when it is no export."""
    if os.path.isfile(os.path.join(folder, EXPORT_METADATA)):
        return folder
    subs = [os.path.join(folder, d) for d in os.listdir(folder) if not d.startswith(".")]
    if len(subs) == 1 and os.path.isdir(subs[0]) and os.path.isfile(os.path.join(subs[0], EXPORT_METADATA)):
        return subs[0]
    return None


def unquote(value):
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        value = value[1:-1].replace("''", "'") if value[0] == "'" else value[1:-1]
    return value


def read_export_metadata(path):
    """{submission folder: [(name, sid, email)]} from a Gradescope export's submission_metadata.yml.
    It reads the part of the file it needs, as Gradescope writes it: a top-level key per
    submission folder, under it a :submitters: list of maps with :name:, :sid: and :email:."""
    out, folder, in_list, list_indent, current = {}, None, False, 0, None
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip(" "))
        text = line.strip()
        if indent == 0:
            m = re.fullmatch(r"['\"]?([^'\":]+)['\"]?:", text)
            if not m:
                raise BatchError(f"{path}:{number}: expected a submission folder's key ('submission_<id>:'), "
                                 f"got {text[:60]!r}")
            folder, in_list, current = m.group(1), False, None
            out[folder] = []
            continue
        if folder is None:
            continue
        if text in (":submitters:", "submitters:"):
            in_list, list_indent = True, indent
            continue
        if not in_list:
            continue
        if indent <= list_indent and not text.startswith("- "):
            in_list = False  # the next key of the submission
            continue
        if text.startswith("- "):
            current = {}
            out[folder].append(current)
            text = text[2:].strip()
        m = re.fullmatch(r":?(\w+):\s*(.*)", text)
        if m and current is not None and m.group(1) in ("name", "sid", "email"):
            current[m.group(1)] = unquote(m.group(2))
    return {k: [(s.get("name", ""), s.get("sid", ""), s.get("email", "")) for s in v] for k, v in out.items()}


def export_submissions(root):
    """The gradings of a Gradescope export (see read_export_metadata), one per submission folder,
    sorted by folder. A folder that holds one .zip alone (an upload Gradescope did not unpack) is
    graded as that zip. Returns (submissions, lines saying what was skipped)."""
    metadata = read_export_metadata(os.path.join(root, EXPORT_METADATA))
    found, notes = [], []
    for folder in sorted(set(metadata) | {d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))}):
        path = os.path.join(root, folder)
        if folder not in metadata:
            notes.append(f"{folder!r} is not in {EXPORT_METADATA}: graded under its folder's name")
        if not os.path.isdir(path) or os.path.islink(path):
            notes.append(f"skipping {folder!r}: {EXPORT_METADATA} lists it, but the export has no such folder")
            continue
        inside = [n for n in os.listdir(path) if not n.startswith(".")]
        one = os.path.join(path, inside[0]) if len(inside) == 1 else None
        if one and one.lower().endswith(".zip") and os.path.isfile(one) and not os.path.islink(one):
            path = one
        submitters = [s if s[0] else (s[2] or s[1] or folder, s[1], s[2]) for s in metadata.get(folder, [])]
        found.append(Submission(folder, path, submitters or [(folder, "", "")]))
    return found, notes


def gather(submissions, unpack_to):
    """(the submissions to grade, notes, whether it is a Gradescope export) from SUBMISSIONS: a
    folder of students, or a Gradescope export (unpacked, or its zip, which is unpacked into
    `unpack_to`)."""
    folder, unpacked = submissions, []
    if os.path.isfile(submissions) and submissions.lower().endswith(".zip"):
        mode = os.stat(submissions).st_mode
        if os.geteuid() == 0 and mode & 0o077:
            # Every student's code is in it: the sandbox users may not read it.
            os.chmod(submissions, mode & ~0o077)
            print(f"grade_batch: {submissions} was open to other users; it is now mode {mode & ~0o077 & 0o7777:o}")
        skipped = []
        try:
            grade.safe_unzip(submissions, unpack_to, limit=MAX_EXPORT, skipped=skipped, max_entries=None)
        except grade.SubmissionError as e:
            raise BatchError(f"{submissions!r} cannot be unpacked as a Gradescope export: {str(e).split(';')[0]}")
        folder = unpack_to
        unpacked = [f"left out of the export's unpacking: {name!r} (an unsafe, too deep or too long path, a link, or "
                    "an entry that could not be written)" for name in skipped]
        if export_root(folder) is None:
            raise BatchError(f"{submissions!r} is a zip without {EXPORT_METADATA}: give Gradescope's export zip, or a "
                             "folder that holds one folder or .zip per student")
    elif not os.path.isdir(submissions):
        raise BatchError(f"{submissions!r} is neither a folder nor a zip; give the folder that holds one folder or .zip "
                         "per student, or Gradescope's export (its zip or the folder it unpacks to)")
    root = export_root(folder)
    if root is not None:
        found, notes = export_submissions(root)
        return found, (unpacked if folder == unpack_to else []) + notes, True
    entries, skipped = students(folder)
    notes = [f"skipping {entry!r}: neither a folder nor a .zip (a symbolic link is neither)" for entry in skipped]
    return [Submission(name, path) for name, path in entries], notes, False


def safe_name(name):
    """A student's folder name under GRADES: letters, digits, '.', '_', '-' only, and never the
    gradebook's own name."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".")
    if cleaned.lower() == "gradebook.csv":
        cleaned = "student_" + cleaned
    return cleaned or "student"


def shown(name):
    """A submission's name as printed or written in the gradebook: control characters (a
    terminal's escape sequences) and bytes no encoding holds replaced by '?'."""
    return "".join("?" if not ch.isprintable() or 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in name)


def failed_results(exercises, why, cpu_only):
    """results.json for a grading that did not finish: every exercise 0, with the reason (GPU
    exercises not graded here where there is no GPU)."""
    has_gpu = not cpu_only and grade.gpu_available()
    return grade.results_json(exercises, grade.refused_outcomes(exercises, has_gpu, why))


def grade_one(path, out_dir, args, private):
    """Runs grade.py on one submission within the time limit; returns its results dict."""
    os.makedirs(out_dir, exist_ok=True)
    results_path = os.path.join(out_dir, "results.json")
    if os.path.exists(results_path):
        os.remove(results_path)
    # Other students' submissions and results stay out of the sandbox user's reach.
    cmd = [sys.executable, os.path.join(ROOT, "classroom", "grade.py"), "--submission", path, "--out", results_path,
           "--build-dir", args.build_dir, "--timeout", str(args.timeout), "--config", args.config]
    for folder in private:
        cmd += ["--private", os.path.abspath(folder)]
    if args.cpu_only:
        cmd.append("--cpu-only")
    if args.cmake_args:
        cmd.append("--cmake-args=" + args.cmake_args)
    exercises = handout.load_config(args.config)
    with open(os.path.join(out_dir, "grade.log"), "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
        try:
            proc.wait(timeout=args.time_limit)
        except subprocess.TimeoutExpired:
            # SIGTERM first, so that grade.py cleans up (its sandbox user's processes and folders);
            # SIGKILL if it has not ended after a grace period. What a killed grading leaves, the
            # next grading to claim its sandbox user removes before it runs anything.
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            results = failed_results(exercises, f"grading stopped: it ran past the time limit of {args.time_limit} s "
                                                 "(build and every exercise together)", args.cpu_only)
            with open(results_path, "w") as f:
                json.dump(results, f, indent=1)
            return results
    try:
        with open(results_path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        results = failed_results(exercises, f"the grader stopped with status {proc.returncode} before writing a score; "
                                            "see grade.log", args.cpu_only)
        with open(results_path, "w") as f:
            json.dump(results, f, indent=1)
        return results


def as_text(cell):
    """A cell a spreadsheet would read as a formula is written as text."""
    return "'" + cell if cell[:1] in "=+-@\t\r" else cell


def gradebook_row(name, exercises, results):
    """One CSV row: the student, the total, the points possible here, then each exercise."""
    by_number = {t.get("number"): t for t in results.get("tests", [])}
    row = [as_text(name), f"{results.get('score', 0):g}"]
    possible = 0.0
    cells = []
    for number, ex in enumerate(exercises, 1):
        t = by_number.get(str(number))
        if t is None or t.get("max_score", 0) == 0:
            cells.append("")  # not graded on this machine
            continue
        possible += t["max_score"]
        cells.append(f"{t['score']:g}")
    return row + [f"{possible:g}"] + cells


def write_gradebook(path, exercises, graded, export):
    """GRADES/gradebook.csv from [(Submission, its GRADES folder, results)]: one row per student
    (per submitter of an export, with SID, email and the submission's folder)."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        ids = [ex["id"] for ex in exercises]
        if export:
            writer.writerow(["student", "sid", "email", "submission", "score", "possible_here"] + ids)
        else:
            writer.writerow(["student", "score", "possible_here"] + ids)
        for sub, folder, results in graded:
            for name, sid, email in sub.submitters:
                row = gradebook_row(shown(name), exercises, results)
                if export:
                    row = row[:1] + [as_text(shown(sid)), as_text(shown(email)), folder] + row[1:]
                writer.writerow(row)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("submissions", help="a folder with one folder or .zip per student, or a Gradescope export "
                                            "(its zip, or the folder with submission_metadata.yml)")
    parser.add_argument("--out", required=True, help="where results.json per student and gradebook.csv go")
    parser.add_argument("--time-limit", type=int, default=1800, help="seconds per student, build included (default 1800)")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per runner process (default 120)")
    parser.add_argument("--build-dir", default=None,
                        help="where CMake builds the GPU runners, reused from student to student (default: a new "
                             "folder only this user can enter)")
    parser.add_argument("--cmake-args", default="", help='passed to CMake, e.g. "-DFA_CUDA_ARCHITECTURES=90"')
    parser.add_argument("--cpu-only", action="store_true", help="grade the CPU exercises only, even with a GPU")
    parser.add_argument("--config", default=os.path.join(ROOT, "classroom", "exercises.json"),
                        help="the exercises to grade (as for grade.py): classroom/exercises.json or an assignment")
    args = parser.parse_args(grade.cmake_args_joined(sys.argv[1:]))
    if args.time_limit < 60:
        print(f"grade_batch: error: --time-limit must be at least 60 seconds, got {args.time_limit}", file=sys.stderr)
        return 2
    try:
        exercises = handout.load_config(args.config)
    except handout.HandoutError as e:
        print(f"grade_batch: error: {e}", file=sys.stderr)
        return 2
    inside = os.path.relpath(os.path.realpath(args.submissions), os.path.realpath(ROOT))
    if not inside.startswith(".."):
        # Every grading copies the instructor's tree, and would take the students' files with it.
        print(f"grade_batch: error: SUBMISSIONS {args.submissions!r} is inside the instructor's tree {ROOT}; "
              "move it outside", file=sys.stderr)
        return 2
    scratch = tempfile.mkdtemp(prefix="fa_grade_batch_")  # only this user can enter it
    try:
        try:
            found, notes, export = gather(args.submissions, os.path.join(scratch, "export"))
        except (BatchError, OSError, UnicodeDecodeError) as e:
            print(f"grade_batch: error: {e}", file=sys.stderr)
            return 2
        for note in notes:
            print(f"grade_batch: {note}")
        if not found:
            print(f"grade_batch: error: {args.submissions!r} holds no submission to grade", file=sys.stderr)
            return 2
        os.makedirs(args.out, exist_ok=True)
        if args.build_dir is None:
            args.build_dir = os.path.join(scratch, "build")
        private = [args.submissions if os.path.isdir(args.submissions) else os.path.join(scratch, "export"), args.out]
        graded, used = [], set()
        for sub in found:
            folder = safe_name(sub.name)
            while folder in used:
                folder += "_"
            used.add(folder)
            print(f"grade_batch: grading {shown(sub.name)} ...", flush=True)
            results = grade_one(os.path.abspath(sub.path), os.path.join(args.out, folder), args, private)
            graded.append((sub, folder, results))
            print(f"grade_batch: {shown(sub.name)}: {shown(results.get('output', ''))}", flush=True)
        book = os.path.join(args.out, "gradebook.csv")
        write_gradebook(book, exercises, graded, export)
        print(f"grade_batch: {len(graded)} submissions graded; {book}")
        return 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
