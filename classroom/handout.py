#!/usr/bin/env python3
"""make handout: write a student copy of this repository with the exercises' solutions stubbed.

Usage: python3 classroom/handout.py DEST [--config classroom/exercises.json]

Solutions are marked in the source, one region per marker pair, each naming its exercise:

    // BEGIN SOLUTION <id>: <what the student writes>
    ...the solution...
    // END SOLUTION

For every exercise listed in the config, each of its regions keeps its marker lines (the
grader finds the student's code by them) and its body becomes a stub:

    // BEGIN SOLUTION <id>: <what the student writes>
    // TODO(<id>): your code replaces the stub below; keep the BEGIN/END lines
    FA_NOT_IMPLEMENTED("<id>: <what the student writes>");
    // END SOLUTION

which compiles (common/not_implemented.h) and throws at run time, so the exercise's tests fail
with "not implemented: ...". A GPU kernel's body cannot throw, so a region inside one is marked

    // BEGIN SOLUTION <id> (device): <what the kernel does>

and its stub is the TODO comment alone: an empty body, which compiles and writes nothing. An
exercise with a device region must also have a host region (its launcher, say), which throws
before the launch, so the tests still say "not implemented" rather than "never written".
Regions of exercises not in the config keep their code; their marker lines go. Everything else
is copied as is but the pages' prose that explains a solution (student_page), classroom/instructor/ (the written questions' answers; classroom/questions.md
gets the questions alone) and tests/kernel_budget.csv (the instructor's kernels' resources), and the docs' snippets are made again from the stubbed sources, so
they show the stubs. DEST/.handout lists the exercises. A copy in which a distinctive solution
line survives (one the copy's code does not also hold outside the regions), or three distinctive
solution lines in a row anywhere (a copy of the solution in another file), is refused and removed. Bad markers or config are one-line errors and exit 1, and
nothing is written.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))  # check_snippets
sys.path.insert(0, os.path.join(ROOT, "classroom"))
from cxx_text import has_code  # noqa: E402
SOURCE_SUFFIXES = (".cu", ".cuh", ".h", ".hpp", ".cpp", ".cc")
# The title is what follows the colon up to its last non-blank character (a greedy .* and one
# backtrack: linear in the line's length, which a student's file sets).
BEGIN = re.compile(r"^(\s*)// BEGIN SOLUTION ([A-Za-z0-9_]+)( \(device\))?: (.*\S)\s*$")
END = re.compile(r"^\s*// END SOLUTION\s*$")
SKIP_DIRS = {".git", "build", ".deps", "__pycache__"}
CATALOG = "classroom/exercises.json"  # every exercise of the tree
INSTRUCTOR = "classroom/instructor"  # answers and rubrics: left out of the copy
STUDENT_QUESTIONS = "classroom/questions.md"  # the written questions, answers taken out
# Every kernel's registers and SASS size as the instructor's tree builds them: left out of the
# copy, whose stubbed and student-written kernels differ from them by design (without the file
# the resource budget test is not registered).
KERNEL_BUDGET = "tests/kernel_budget.csv"
# The docs' diagrams are drawn by running the steps they picture (the online update, the merge,
# the window's tiles): the pictures go to the students, the scripts that compute them do not.
DIAGRAM_SCRIPTS = ("tools/diagrams.py", "tools/diagrams_hopper.py")


class HandoutError(Exception):
    pass


def chapter_folders(root):
    """{chapter number: its folder, e.g. "chapters/05_flash_attention_v2"} for every folder
    chapters/NN_name of the tree."""
    folders = {}
    chapters = os.path.join(root, "chapters")
    for name in sorted(os.listdir(chapters)) if os.path.isdir(chapters) else []:
        m = re.match(r"(\d\d)_\w+$", name)
        if m and os.path.isdir(os.path.join(chapters, name)):
            folders[int(m.group(1))] = f"chapters/{name}"
    return folders


def load_config(path, root=ROOT):
    """The exercises a config lists, each checked. A config's 'exercises' are the entries
    themselves (classroom/exercises.json: id, chapter, device, points, title, tests, ...) or the
    ids of entries of the tree's classroom/exercises.json (an assignment: one week's exercises,
    say)."""
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise HandoutError(f"config {path}: {e}")
    exercises = config.get("exercises") if isinstance(config, dict) else None
    if not isinstance(exercises, list) or not exercises:
        raise HandoutError(f"config {path}: 'exercises' must be a non-empty list")
    if all(isinstance(ex, str) for ex in exercises):
        exercises = assignment_entries(path, exercises, root)
    chapters = chapter_folders(root)
    allowed = ", ".join(str(n) for n in sorted(chapters)) or "none (no folder chapters/NN_name)"
    ids = set()
    for i, ex in enumerate(exercises):
        if not isinstance(ex, dict):
            raise HandoutError(f"config {path}: exercise {i} must be an object (or every entry an exercise id)")
        for key, kind in (("id", str), ("title", str), ("points", (int, float)), ("tests", str)):
            if not isinstance(ex.get(key), kind):
                raise HandoutError(f"config {path}: exercise {i} needs '{key}' ({kind.__name__ if isinstance(kind, type) else 'number'})")
        if not re.fullmatch(r"[A-Za-z0-9_]+", ex["id"]):
            raise HandoutError(f"config {path}: exercise id '{ex['id']}' may hold only letters, digits and '_'")
        if isinstance(ex.get("chapter"), bool) or ex.get("chapter") not in chapters:
            raise HandoutError(f"config {path}: exercise '{ex['id']}' has chapter {ex.get('chapter')!r}; allowed: a "
                               f"chapter with a folder chapters/NN_name ({allowed})")
        if ex.get("device") not in ("cpu", "gpu"):
            raise HandoutError(f"config {path}: exercise '{ex['id']}' has device {ex.get('device')!r}; allowed: 'cpu' "
                               "or 'gpu'")
        if "week" in ex and (isinstance(ex["week"], bool) or not isinstance(ex["week"], int) or ex["week"] < 1):
            raise HandoutError(f"config {path}: exercise '{ex['id']}' has week {ex['week']!r}; allowed: a whole number "
                               "from 1 up")
        if ex["id"] in ids:
            raise HandoutError(f"config {path}: exercise id '{ex['id']}' appears twice")
        if ex["points"] < 0:
            raise HandoutError(f"config {path}: exercise '{ex['id']}' has negative points {ex['points']}")
        try:
            re.compile(ex["tests"])
        except re.error as e:
            raise HandoutError(f"config {path}: exercise '{ex['id']}' tests pattern: {e}")
        ids.add(ex["id"])
    return exercises


def assignment_entries(path, ids, root):
    """The entries of the tree's classroom/exercises.json that an assignment lists by id, in the
    assignment's order."""
    catalog_path = os.path.join(root, CATALOG)
    if os.path.abspath(path) == os.path.abspath(catalog_path):
        raise HandoutError(f"config {path}: the exercises must be entries, not ids")
    try:
        with open(catalog_path) as f:
            catalog = {ex.get("id"): ex for ex in json.load(f).get("exercises", []) if isinstance(ex, dict)}
    except (OSError, json.JSONDecodeError, AttributeError) as e:
        raise HandoutError(f"config {path} lists exercise ids, but {CATALOG} cannot be read: {e}")
    unknown = [ex_id for ex_id in ids if ex_id not in catalog]
    if unknown:
        raise HandoutError(f"config {path}: no exercise '{unknown[0]}' in {CATALOG}; allowed: {', '.join(catalog)}")
    return [catalog[ex_id] for ex_id in ids]


def catalog(root=ROOT):
    """Every exercise of the tree (classroom/exercises.json)."""
    return load_config(os.path.join(root, CATALOG), root)


def stub_regions(text, path, selected, regions=None):
    """Returns (new text, {id: regions found}) for one file's text. `regions`, a list when given,
    gets (id, "host" or "device", first line, last line) for each region, markers included."""
    out, found = [], {}
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        m = BEGIN.match(lines[i])
        if not m:
            if END.match(lines[i]):
                raise HandoutError(f"{path}:{i + 1}: END SOLUTION without a BEGIN SOLUTION")
            if "BEGIN SOLUTION" in lines[i]:
                raise HandoutError(f"{path}:{i + 1}: malformed marker; write '// BEGIN SOLUTION <id>: <what to write>', or '<id> (device): ...' inside a kernel")
            out.append(lines[i])
            i += 1
            continue
        indent, ex_id, device, what = m.groups()
        start = i
        i += 1
        body = []
        while i < len(lines) and not END.match(lines[i]):
            if "BEGIN SOLUTION" in lines[i]:
                raise HandoutError(f"{path}:{i + 1}: BEGIN SOLUTION inside the region opened at line {start + 1}")
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise HandoutError(f"{path}:{start + 1}: BEGIN SOLUTION {ex_id} has no END SOLUTION")
        i += 1  # the END line
        found[ex_id] = found.get(ex_id, 0) + 1
        if regions is not None:
            regions.append((ex_id, "device" if device else "host", start + 1, i))
        if ex_id in selected:
            out.append(lines[start])
            if device:
                out.append(f"{indent}// TODO({ex_id}): your code replaces this line; keep the BEGIN/END lines\n")
            else:
                message = json.dumps(f"{ex_id}: {what}")  # a valid C string literal for this text
                out.append(f"{indent}// TODO({ex_id}): your code replaces the stub below; keep the BEGIN/END lines\n")
                out.append(f"{indent}FA_NOT_IMPLEMENTED({message});\n")
            out.append(lines[i - 1])
        else:
            out.extend(body)
    return "".join(out), found


def exercise_files(root):
    """{exercise id: [files holding its regions]} over the tree's sources (what a student edits)."""
    files = {}
    for rel in tracked_files(root):
        if not rel.endswith(SOURCE_SUFFIXES) or not os.path.isfile(os.path.join(root, rel)):
            continue
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            _, found = stub_regions(f.read(), rel, set())
        for ex_id in found:
            files.setdefault(ex_id, []).append(rel)
    return files


# What grading leaves in a tree (grade.py's results, grade_batch.py's gradebook and logs) and
# archives (an autograder zip made inside the tree holds every solution): never part of a copy.
GRADING_OUTPUTS = ("results.json", "grade.log", "gradebook.csv")
ARCHIVES = (".zip", ".tar", ".gz", ".tgz", ".xz", ".bz2", ".7z")


def tracked_files(root):
    """The tree's files: those git tracks or would add (new, not ignored); every file outside
    .git/build/.deps where there is no git (an unpacked archive, as on Gradescope). Grading's
    outputs and archives are left out either way."""
    try:
        listed = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                check=True, capture_output=True).stdout
        files = [p for p in listed.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for base, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
            files += [os.path.relpath(os.path.join(base, n), root) for n in names]
    return [p for p in files if os.path.basename(p) not in GRADING_OUTPUTS and not p.lower().endswith(ARCHIVES)]


def make_handout(root, dest, config_path):
    exercises = load_config(config_path, root)
    dest = os.path.abspath(dest)
    inside = os.path.relpath(dest, os.path.abspath(root))
    if not inside.startswith("..") and (inside == "." or inside.split(os.sep)[0] != "build"):
        raise HandoutError(f"DEST {dest} is inside the repository; use a folder outside it (or under build/)")
    if os.path.exists(dest) and os.listdir(dest):
        raise HandoutError(f"DEST {dest} exists and is not empty")
    totals, regions_text, outputs = write_copy(root, dest, exercises)
    # A line that the copy's own sources hold outside every region (a loop header, a shared
    # helper's call) gives nothing away; any other solution line anywhere in the copy does.
    shared = set()
    for rel in outputs:
        if rel.endswith(SOURCE_SUFFIXES) and not rel.startswith(INSTRUCTOR + "/"):
            with open(os.path.join(dest, rel), encoding="utf-8") as f:
                shared.update(normalize(line) for line in f)
    leaks = solution_leaks(root, dest, solution_lines(regions_text) - shared)
    leaks += copied_runs(dest, solution_runs(regions_text))
    leaks += code_line_leaks(dest, regions_text)
    if leaks:
        shutil.rmtree(dest)
        raise HandoutError(f"{len(leaks)} solution line(s) survive in the copy (it was removed), first: " + "; ".join(leaks[:5]))
    return totals


def write_copy(root, dest, exercises):
    """Writes the student copy of `root` into `dest` (every region of `exercises` stubbed, the
    instructor's files left out, the pages' solution prose and snippets replaced) and returns
    ({id: regions}, [the solution regions' text], {path: the copy's bytes, or None for the
    original file}). The grader builds a student's code in such a copy too, never in the
    instructor's tree. Nothing is written when a marker or the config is bad."""
    selected = {ex["id"] for ex in exercises}
    # First every file in memory, so that a bad marker anywhere leaves nothing half-written.
    outputs, totals, regions, regions_text = {}, {}, [], []
    # A GPU exercise's host regions say only where its code goes: the grader never puts a
    # student's code into a region that is blank in the solution, so nothing of the student's
    # runs on the host in a GPU runner (whose timing and answers the host code could reach).
    gpu = {ex["id"] for ex in exercises if ex.get("device") == "gpu"} & selected
    host_code = []
    for rel in tracked_files(root):
        src = os.path.join(root, rel)
        if not os.path.isfile(src):
            continue
        if rel.endswith(SOURCE_SUFFIXES):
            with open(src, encoding="utf-8") as f:
                text = f.read()
            new_text, found = stub_regions(text, rel, selected, regions)
            lines = text.splitlines()
            for r_id, kind, first, last in regions[len(regions) - sum(found.values()):]:
                if r_id in selected:
                    regions_text.append("\n".join(lines[first:last - 1]))
                if r_id in gpu and kind == "host" and has_code("\n".join(lines[first:last - 1]), stubs=False):
                    host_code.append(f"{rel}:{first}")
            for ex_id, n in found.items():
                totals[ex_id] = totals.get(ex_id, 0) + n
            outputs[rel] = new_text.encode("utf-8") if new_text != text else None
        elif rel.endswith(".md") and not rel.startswith(INSTRUCTOR + "/"):
            with open(src, encoding="utf-8") as f:
                text = f.read()
            new_text = student_page(text, rel, selected)
            outputs[rel] = new_text.encode("utf-8") if new_text != text else None
        else:
            outputs[rel] = None
    missing = sorted(selected - set(totals))
    if missing:
        raise HandoutError(f"config names exercise(s) with no BEGIN SOLUTION region in the sources: {', '.join(missing)}")
    device_only = sorted(ex_id for ex_id in selected if all(kind == "device" for r_id, kind, _, _ in regions if r_id == ex_id))
    if device_only:
        raise HandoutError(f"exercise(s) {', '.join(device_only)} have only (device) regions, whose stubs do not "
                           "throw; mark a host region too (the launcher), so the tests say 'not implemented'")
    if host_code:
        raise HandoutError(f"a GPU exercise's host region holds code ({', '.join(host_code[:3])}): move the code out "
                           "of the region (a GPU exercise's code is device code in '(device)' regions; its host "
                           "region stays blank, marking where the exercise is)")
    questions = os.path.join(root, INSTRUCTOR, "questions.md")
    if os.path.isfile(questions):
        with open(questions, encoding="utf-8") as f:
            outputs[STUDENT_QUESTIONS] = student_questions(f.read()).encode("utf-8")
    for rel, data in outputs.items():
        if rel.startswith(INSTRUCTOR + "/") or rel == KERNEL_BUDGET or rel in DIAGRAM_SCRIPTS:
            continue  # answers and rubrics stay with the instructor, and the instructor's kernels' budget
        target = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if data is None:
            shutil.copyfile(os.path.join(root, rel), target)
            shutil.copymode(os.path.join(root, rel), target)
        else:
            with open(target, "wb") as f:
                f.write(data)
    with open(os.path.join(dest, ".handout"), "w") as f:
        json.dump({"exercises": [{"id": ex["id"], "regions": totals[ex["id"]]} for ex in exercises]}, f, indent=2)
        f.write("\n")
    # The pages' code snippets come from the sources: in the copy they show the stubs.
    import check_snippets
    check_snippets.sync(dest, fix=True)
    return totals, regions_text, outputs


PAGE_SOLUTION = re.compile(r"<!-- BEGIN SOLUTION ([A-Za-z0-9_]+) -->\n(.*?)<!-- END SOLUTION -->\n?", re.S)


def student_page(text, rel, selected):
    """A lesson page without the prose that explains an exercise's solution: each block

        <!-- BEGIN SOLUTION <id> -->
        ...how the solution works, line by line...
        <!-- END SOLUTION -->

    of an exercise in the copy becomes one line that says so (the instructor's tree keeps the
    prose). Blocks of exercises not in the copy keep their text; their marker lines go."""
    def replace(m):
        if m.group(1) not in selected:
            return m.group(2)
        return (f"*This step is the exercise `{m.group(1)}`: the page's Exercises section and the stub's TODO "
                "say what to write, and its tests check it.*\n")
    out = PAGE_SOLUTION.sub(replace, text)
    if re.search(r"<!-- (BEGIN|END) SOLUTION", out):
        raise HandoutError(f"{rel}: a solution block is not closed, or is malformed; write "
                           "'<!-- BEGIN SOLUTION <id> -->' and '<!-- END SOLUTION -->' on lines of their own")
    return out


def student_questions(text):
    """The written questions without their answers: every BEGIN ANSWER ... END ANSWER block goes."""
    out = re.sub(r"\n?<!-- BEGIN ANSWER -->.*?<!-- END ANSWER -->\n?", "\n", text, flags=re.S)
    out = re.sub(r"^Instructors:.*?\n\n", "", out, count=1, flags=re.S | re.M)
    if "ANSWER" in out:
        raise HandoutError(f"{INSTRUCTOR}/questions.md: an answer block is not closed")
    return out


def normalize(line):
    return " ".join(line.split())


def solution_lines(regions_text):
    """The distinctive lines of the solutions: at least 24 characters once spaces are squeezed,
    comments included (a comment can give the answer away as well as code)."""
    lines = set()
    for body in regions_text:
        for line in body.splitlines():
            n = normalize(line)
            if len(n) >= 24:
                lines.add(n)
    return lines


RUN = 3  # consecutive distinctive lines of a solution that make a copy of it


def distinctive(text):
    """(line number, squeezed text) of the lines of `text` that are at least 24 characters long."""
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        n = normalize(line)
        if len(n) >= 24:
            out.append((i, n))
    return out


def solution_runs(regions_text):
    """Every RUN consecutive distinctive lines of a solution region, in order. A line the copy
    shares with code outside the regions (a loop header) gives nothing away alone; the same lines
    in the same order are a copy of the solution, wherever they stand."""
    runs = set()
    for body in regions_text:
        lines = [n for _, n in distinctive(body)]
        runs.update(tuple(lines[i:i + RUN]) for i in range(len(lines) - RUN + 1))
    return runs


def text_files(dest):
    """(path relative to dest, text) of every text file of the copy."""
    for base, dirs, names in os.walk(dest):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        for name in names:
            path = os.path.join(base, name)
            try:
                with open(path, encoding="utf-8") as f:
                    yield os.path.relpath(path, dest), f.read()
            except (UnicodeDecodeError, OSError):
                continue


def copied_runs(dest, runs):
    """'path:line' where a file of the copy holds one of `runs` (its distinctive lines in a row)."""
    leaks = []
    for rel, text in text_files(dest):
        lines = distinctive(text)
        for k in range(len(lines) - RUN + 1):
            if tuple(n for _, n in lines[k:k + RUN]) in runs:
                leaks.append(f"{rel}:{lines[k][0]}: a copy of a solution's lines, from '{lines[k][1][:60]}'")
    return leaks


def solution_leaks(root, dest, lines):
    """'path:line' for each line of the copy that is a solution line, in any text file."""
    leaks = []
    for rel, text in text_files(dest):
        for i, line in enumerate(text.splitlines(), 1):
            if normalize(line) in lines:
                leaks.append(f"{rel}:{i}: {normalize(line)[:80]}")
    return leaks


# The code lines of a solution, as tokens: a line of a solution region that appears anywhere in
# the copy (any file, docs included, inside a region or not) gives it away, unless it is trivial.
CODE_TOKEN = re.compile(r"[A-Za-z_$][\w$]*|\.?\d(?:[\w.']|[eEpP][+-])*|\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*'|"
                        r"::|->|\+\+|--|<<=?|>>=?|[<>=!+\-*/%&|^]=|&&|\|\||\S")
# What makes a line trivial: fewer than 3 tokens, a comment, braces, a preprocessor line, or one
# of these shapes (token-spaced), which every chapter writes and which hold no step of a solution.
TRIVIAL_SHAPES = [re.compile(p) for p in (
    r"(\} )?else( \{| if .*)?|\} while .*",  # the other branch; a do-while's end
    r"# .*",  # #pragma unroll and the like
    # a counted loop's header
    r"for \( (const )?(int|int64_t|unsigned|(std :: )?size_t) \w+ = [\w.]+ ; \w+ < [^;]+ ; (\+\+ \w+|\w+ \+\+|\w+ \+= \w+) \) \{?",
    # a declaration with no initializer or a constant one
    r"(const |constexpr |__shared__ )*[\w:]+( \*)? \w+( \[ \w+ \])* (= (- )?[\w.]+ )?;",
    r"\w+ = \w+ ;",  # one name copied into another
    r"return (- )?[\w.]* ;",  # a constant returned
    r"if \( \w+ >= \w+ \) return ;",  # a bounds guard
    r"FA_NOT_IMPLEMENTED \( .* \) ;",  # a stub (a student copy's regions hold them: not a solution)
)]
# Lines a solution shares on purpose with the code the student is given: a launch's check, the
# CPU loops' shorthands for the shape, a kernel's block indices, branch heads. Kept short: each is
# a line the copy holds outside the regions and that says nothing about the exercise's step.
ALLOWED_LINES = frozenset((
    "CUDA_CHECK_LAUNCH ( ) ;",
    "const int d = s . head_dim ;",
    "const float scale = float ( s . softmax_scale ( ) ) ;",
    "const int i = i0 + r ;",
    "const int j = j0 + c ;",
    "const int bh = blockIdx . z ;",
    "const int64_t row = blockIdx . x ;",
    "float * s = scores + row * shape . seq_kv ;",
    "if ( products == Products :: PerThread ) {",
    "if constexpr ( kPipelined ) {",
))


def code_tokens(line):
    """The line's code as space-separated tokens ("" for a comment or a line with fewer than 3)."""
    code = line.strip()
    if code.startswith(("/*", "*", "//")):
        return ""
    code = code.split("//")[0] if '"' not in code else code  # a trailing comment (not inside a string)
    tokens = CODE_TOKEN.findall(code)
    return " ".join(tokens) if len(tokens) >= 3 else ""


def nontrivial_code(line):
    """The line's tokens when it is a non-trivial code line (see TRIVIAL_SHAPES), else ""."""
    tokens = code_tokens(line)
    if not tokens or tokens in ALLOWED_LINES or any(shape.fullmatch(tokens) for shape in TRIVIAL_SHAPES):
        return ""
    return tokens


def code_line_leaks(dest, regions_text):
    """'path:line' where any file of the copy holds a non-trivial code line of a solution region."""
    lines = {}
    for body in regions_text:
        for line in body.splitlines():
            tokens = nontrivial_code(line)
            if tokens:
                lines[tokens] = line.strip()
    leaks = []
    for rel, text in text_files(dest):
        for i, line in enumerate(text.splitlines(), 1):
            tokens = code_tokens(line)
            if tokens in lines:
                leaks.append(f"{rel}:{i}: a solution's line '{lines[tokens][:60]}'")
    return leaks


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dest")
    parser.add_argument("--config", default=os.path.join(ROOT, "classroom", "exercises.json"))
    parser.add_argument("--root", default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args()
    try:
        totals = make_handout(args.root, args.dest, args.config)
    except HandoutError as e:
        print(f"handout: error: {e}", file=sys.stderr)
        return 1
    for ex_id, n in sorted(totals.items()):
        print(f"handout: {ex_id}: {n} region(s) stubbed")
    print(f"handout: written to {os.path.abspath(args.dest)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
