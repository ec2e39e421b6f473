#!/usr/bin/env python3
"""make grade: score a student's exercises with the grader's checker, never with the student's tests.

Usage: python3 tools/grade.py [--submission PATH] [--out results.json] [--build-dir DIR]
                              [--cpu-only] [--timeout SECONDS] [--cmake-args "..."]

PATH is what the student handed in: their whole tree, a zip of it, or just the files they
edited (at their paths in the tree, or loose: a file is placed by the exercise markers it
holds). Without --submission this tree itself is graded (a student checking their work).

How a submission is graded (docs/grading.md says what this protects and what it does not):
  1. Only the bodies of the exercises' regions (between // BEGIN SOLUTION id and // END
     SOLUTION) are taken from the student's files. They go into a copy of the instructor's
     tree in which every region is the handout's stub, so nothing else the student wrote, and
     no instructor solution, is in the code that runs.
  2. Each region body is linted (tools/grade.py lint_region): no preprocessor lines, no
     asm, no process, file, memory-allocation or exit calls, no other chapter's namespace, no
     oracle or registry lookups. A region that fails scores 0 for its exercise and is stubbed.
  3. Runners are built from that copy: for a CPU exercise g++ builds its chapter's CPU runner
     (classroom/grader/runner_cpu.cpp: that chapter's algorithm.h and nothing else); for a GPU
     exercise CMake builds its chapter's GPU runner (fa_runner_chNN). A region that does not
     compile scores 0 and is stubbed, and the rest is built again.
  4. The checker (classroom/grader/checker.cpp) is built from the instructor's tree, with the
     fp64 oracle and no student code. It draws each case's inputs from a fresh random seed,
     runs the runner on them in a separate process (as user nobody when run as root), and
     compares what comes back with the oracle. Its verdict is all that is scored.
An exercise scores its points times the weighted fraction of its cases that passed; trivial
shapes (one row, one key) have weight 0. GPU exercises on a machine without a GPU (or with
--cpu-only) are listed as "not graded here" with their points, out of the total.
"""
import argparse
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import handout  # noqa: E402

MAX_OUTPUT = 4000  # characters of output kept per exercise
MAX_REGION = 20000  # characters of one region body
MAX_UPLOAD = 200 * 1024 * 1024  # bytes unpacked from a zip
WHAT_TO_SUBMIT = ("submit the whole tree, a zip of it, or only the files you edited (for example "
                  "chapters/03_online_softmax/algorithm.h), with their BEGIN/END SOLUTION lines kept")


class SubmissionError(Exception):
    pass


# ---- taking in a submission -------------------------------------------------------------------

def safe_unzip(path, dest):
    """Unpacks a zip into dest, refusing absolute paths, '..', links and more than MAX_UPLOAD bytes."""
    try:
        with zipfile.ZipFile(path) as z:
            total = 0
            for info in z.infolist():
                name = info.filename
                if name.startswith("/") or ".." in name.split("/") or "\\" in name:
                    raise SubmissionError(f"the zip holds an unsafe path '{name}'; {WHAT_TO_SUBMIT}")
                if (info.external_attr >> 16) & 0o170000 == 0o120000:
                    raise SubmissionError(f"the zip holds a link '{name}'; {WHAT_TO_SUBMIT}")
                total += info.file_size
                if total > MAX_UPLOAD:
                    raise SubmissionError(f"the zip unpacks to more than {MAX_UPLOAD >> 20} MB; {WHAT_TO_SUBMIT}")
                if info.is_dir():
                    continue
                target = os.path.join(dest, name)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with z.open(info) as src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out)
    except zipfile.BadZipFile:
        raise SubmissionError(f"{os.path.basename(path)} is not a readable zip; {WHAT_TO_SUBMIT}")


def exercise_files(root):
    """{path in the tree: {exercise id: number of regions}} over the instructor's sources."""
    out = {}
    for ex_id, files in handout.exercise_files(root).items():
        for rel in files:
            regions = []
            with open(os.path.join(root, rel), encoding="utf-8") as f:
                handout.stub_regions(f.read(), rel, set(), regions)
            out.setdefault(rel, {})[ex_id] = sum(1 for r in regions if r[0] == ex_id)
    return out


def regions_in(text, rel):
    """[(id, body text)] of a file's regions, in order; raises handout.HandoutError on bad markers."""
    found, lines = [], text.splitlines(keepends=True)
    regions = []
    handout.stub_regions(text, rel, set(), regions)
    for ex_id, _, first, last in regions:
        found.append((ex_id, "".join(lines[first:last - 1])))
    return found


UNPACKED = []  # folders zips were unpacked into


def locate(submission, root):
    """{path in the tree: the student's file} for the exercise files the submission holds.
    A tree (or a zip of one) is matched by path; loose files by the exercise markers inside."""
    wanted = exercise_files(root)
    work = None
    if os.path.isfile(submission):
        if not submission.endswith(".zip"):
            return locate_loose([submission], wanted)
        work = tempfile.mkdtemp(prefix="fa_upload_")
        UNPACKED.append(work)  # removed when the grading ends
        safe_unzip(submission, work)
        submission = work
    if not os.path.isdir(submission):
        raise SubmissionError(f"{submission} is neither a folder nor a zip; {WHAT_TO_SUBMIT}")
    # The tree's top may be the folder itself or one folder down (a zip of "handout/").
    tops = [submission] + [os.path.join(submission, d) for d in sorted(os.listdir(submission))
                           if os.path.isdir(os.path.join(submission, d)) and not os.path.islink(os.path.join(submission, d))]
    for top in tops:
        found = {rel: os.path.join(top, rel) for rel in wanted if os.path.isfile(os.path.join(top, rel))
                 and not os.path.islink(os.path.join(top, rel))}
        if found:
            return found
    loose = []
    for base, dirs, names in os.walk(submission):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("build", "__pycache__")]
        loose += [os.path.join(base, n) for n in names if not os.path.islink(os.path.join(base, n))]
    return locate_loose(loose, wanted)


def locate_loose(paths, wanted):
    """Places loose files by the regions they hold: a file whose regions are exactly those of one
    exercise file of the tree is that file."""
    found = {}
    for path in paths:
        if not path.endswith(handout.SOURCE_SUFFIXES) or os.path.getsize(path) > 2 * 1024 * 1024:
            continue
        try:
            with open(path, encoding="utf-8") as f:
                ids = {}
                for ex_id, _ in regions_in(f.read(), path):
                    ids[ex_id] = ids.get(ex_id, 0) + 1
        except (OSError, UnicodeDecodeError, handout.HandoutError):
            continue
        matches = [rel for rel, held in wanted.items() if held == ids and os.path.basename(rel) == os.path.basename(path)]
        if len(matches) == 1:
            found[matches[0]] = path
    if not found:
        raise SubmissionError(f"no exercise file found in the submission; {WHAT_TO_SUBMIT}")
    return found


# ---- the grading tree -------------------------------------------------------------------------

# What an exercise region may not hold. The checker's verdict does not depend on this (a runner
# that misbehaves still only produces numbers the oracle judges); it keeps student code from
# reaching for the oracle, another chapter's code, the grader's files or processes.
BANNED_WORDS = (
    "asm __asm__ __asm _Pragma exit _exit _Exit quick_exit abort terminate atexit at_quick_exit system popen "
    "fork vfork clone execl execlp execle execv execvp execvpe execve fexecve kill raise signal sigaction "
    "setjmp longjmp dlopen dlsym syscall ptrace fopen freopen fdopen open openat creat unlink remove rename "
    "mmap munmap mprotect getenv setenv putenv chdir malloc calloc realloc free new delete static "
    "thread_local extern ifstream ofstream fstream FILE thread jthread cudaMalloc cudaMallocManaged "
    "cudaMallocHost cudaHostAlloc cudaFree cudaMemcpy cudaMemcpyAsync cudaDeviceReset cudaSetDevice "
    "goto friend namespace using typeid register volatile").split()
BANNED_NAMESPACES = ("naive", "safe", "online", "flash1", "flash2", "flash3", "backward", "paged", "grader")
CHAPTER_NAMESPACES = {1: "naive", 2: "safe", 3: "online", 4: "flash1", 5: "flash2", 6: "flash3", 7: "backward", 8: "paged"}
BANNED_PARTS = re.compile(r"reference|oracle|registry|_kernels\b|cpu_algorithms|find_|Problem|run_forward|"
                          r"run_backward|launch_", re.I)
BANNED_STRINGS = ("/proc", "/dev", "/sys", "/autograder", "/tmp", "/etc", "/home", "/root", "/usr")
# Families of names no kernel exercise needs: compiler builtins and attributes, and the C and
# POSIX calls that reach files, processes, memory maps, IPC, the network or the environment.
BANNED_NAME_PATTERN = re.compile(
    r"(__builtin\w*|__attribute\w*|__asm\w*|__sync\w*|__atomic\w*|__declspec|f?open(64|at|at64)?|freopen(64)?|"
    r"fdopen|popen|mk[a-z]*temps?\w*|mkdir(at)?|mkfifo(at)?|mknod(at)?|rmdir|unlink(at)?|rename(at2?)?|"
    r"(sym)?link(at)?|remove|exec\w*|posix_spawnp?|fork|vfork|clone3?|wait(pid|id|3|4)?|kill(pg)?|tgkill|"
    r"signal|sigaction|raise|ptrace|syscall|system|shm\w*|sem(get|op|ctl|_open|_unlink)|msg(get|snd|rcv|ctl)|"
    r"mmap(64)?|munmap|mprotect|dlopen|dlsym|(secure_)?getenv|setenv|putenv|socket|connect|bind|listen|"
    r"accept4?|f?chdir|f?chmod(at)?|f?chown(at)?|chroot|set[re]*[ug]id|prctl|ioctl|pipe2?|dup[23]?|read|write|"
    r"p(read|write)(64)?|lseek(64)?|fread|fwrite|fgets|fputs|fputc|v?f?printf|puts|putchar|[sf]?scanf|"
    r"snprintf|sprintf|perror|cout|cerr|clog|cin|w?[io]?fstream|filebuf|stdin|stdout|stderr|FILE|"
    r"errno|f?close|opendir|readdir|[lf]?stat(64)?|access|f?truncate|u?sleep|nanosleep|v?dprintf|putc|getc|"
    r"fgetc|getline|getchar|gets|tmpfile|tmpnam|fmemopen|open_memstream|fopencookie|realpath|\w+_unlocked|"
    r"alloca|aligned_alloc|posix_memalign|allocator|allocate|set_terminate|set_unexpected|filesystem|"
    r"make_unique|make_shared|unique_ptr|shared_ptr|vector|string|basic_string|ostringstream|istringstream|"
    r"stringstream)")


DIGITS = "0123456789"  # what starts a number for the compiler (str.isdigit also takes other scripts' digits)


def identifier_char(c):
    """A character that continues a name: g++ also takes '$' and any non-ASCII character."""
    return c.isascii() and (c.isalnum() or c in "_$") or not c.isascii()


def pp_number_end(text, i):
    """Where the preprocessing number that starts at text[i] (a digit, or '.' and a digit) ends, as
    g++'s lexer reads it: then any letter, digit, '_', '$', non-ASCII character or quote, a '.' not
    right after a quote, and a sign after e, E, p or P; the quotes it ends with are not its own.
    So 1'000 is one number, and in 0x1'a'"' the number is 0x1'a and the next quote opens a
    character literal: a lint that read that quote as a separator would read the rest of the line
    differently from the compiler."""
    j, n = i + 1, len(text)
    while j < n:
        c, prev = text[j], text[j - 1]
        if c == "'" or identifier_char(c) or (c == "." and prev != "'") or (c in "+-" and prev in "eEpP"):
            j += 1
        else:
            break
    while j > i + 1 and text[j - 1] == "'":
        j -= 1
    return j


def strip_comments_and_strings(text):
    """The code with comments, string and character literals blanked (their text kept aside)."""
    out, strings, i, n = [], [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
            out.append(" ")
        elif text.startswith('R"', i) and re.search(r'(?<![A-Za-z0-9_])(u8|[LuU])?$', text[max(0, i - 3):i]):
            # A raw string R"delim( ... )delim": its text, then the code after it is read on.
            open_paren = text.find("(", i + 2)
            close = -1 if open_paren < 0 else text.find(")" + text[i + 2:open_paren] + '"', open_paren)
            end = n if close < 0 else close + len(text[i + 2:open_paren]) + 2
            strings.append(text[open_paren + 1:close] if close >= 0 else text[i:])
            out.append('""')
            i = end
        elif (c in DIGITS or (c == "." and i + 1 < n and text[i + 1] in DIGITS)) and not (
                i > 0 and identifier_char(text[i - 1])):
            # A number, with its digit separators (1'000, 0xffff'ffff): a quote inside it opens no
            # character literal.
            j = pp_number_end(text, i)
            out.append(text[i:j].replace("'", " "))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            strings.append(text[i + 1:j])
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out), strings


def lint_region(body, chapter):
    """The first reason this region body may not be graded, or "" when it is fine."""
    if len(body) > MAX_REGION:
        return f"the region holds {len(body)} characters; at most {MAX_REGION} are graded"
    control = re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]", body)
    if control:
        return (f"the character U+{ord(control.group()):04X} is not allowed in an exercise region: "
                "of the control characters only newlines and tabs are")
    if re.search(r"\\[ \t]*\r?\n", body):
        return "a backslash at the end of a line (line splicing) is not allowed in an exercise region"
    if "??" in body:
        return "'??' is not allowed in an exercise region (trigraphs)"
    code, strings = strip_comments_and_strings(body)
    for line in code.splitlines():
        stripped = line.strip()
        if stripped.startswith(("#", "%:")) and not re.fullmatch(r"#\s*pragma\s+unroll(\s+\d+)?", stripped):
            return f"a preprocessor line ('{stripped[:40]}'): regions may hold code only (#pragma unroll is allowed)"
        if "%:" in line or "<%" in line or "%>" in line or "<:" in line or ":>" in line:
            return "digraphs are not allowed"
        if "#" in line and not re.fullmatch(r"#\s*pragma\s+unroll(\s+\d+)?", stripped):
            return "'#' is not allowed in an exercise region outside '#pragma unroll'"
    # The region is a function body (or a part of one): it may not close what it sits in.
    depth = {"{": 0, "(": 0, "[": 0}
    closer = {"}": "{", ")": "(", "]": "["}
    for ch in code:
        if ch in depth:
            depth[ch] += 1
        elif ch in closer:
            depth[closer[ch]] -= 1
            if depth[closer[ch]] < 0:
                return f"an unmatched '{ch}': a region may not close the function or block it sits in"
    if any(depth.values()):
        return "unbalanced braces or brackets: a region's braces, parentheses and brackets must pair up inside it"
    for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", code):
        if word in BANNED_WORDS or BANNED_NAME_PATTERN.fullmatch(word):
            return f"'{word}' is not allowed in an exercise region (no processes, files, allocation, exits, asm or statics)"
        if BANNED_PARTS.search(word):
            return f"'{word}' is not allowed in an exercise region (no oracle, registry or other launchers)"
    own = CHAPTER_NAMESPACES.get(chapter)
    for ns in re.findall(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*::", code):
        if ns in BANNED_NAMESPACES and ns != own:
            return f"'{ns}::' is another chapter's code; an exercise is written in its own chapter"
    for s in strings + ["".join(strings)]:  # adjacent literals are joined by the compiler
        for bad in BANNED_STRINGS:
            if bad in s:
                return f"the string \"{s[:40]}\" names a system path"
    return ""


def blank(body):
    """True for a region with no code in the solution: a marker in a launcher that only says where
    the exercise's code is (its stub throws "not implemented" before the launch)."""
    return not strip_comments_and_strings(body)[0].strip()


def splice(root, tree, student_files, exercises):
    """Writes into `tree` a copy of the instructor's tree `root` in which every exercise region
    holds the student's body (when the submission has the file and its markers) or else the
    handout's stub. A region that is blank in the solution is never the student's: it is left
    blank once some code of its exercise was taken (wherever it is), else stubbed. Returns
    ({id: [problems]}, {id: True when some student code was taken})."""
    ids = {ex["id"] for ex in exercises}
    chapter_of = {ex["id"]: ex["chapter"] for ex in exercises}
    problems, taken, pending = {}, {}, []
    for rel in handout.tracked_files(root):
        src = os.path.join(root, rel)
        if not os.path.isfile(src) or rel.startswith("classroom/instructor/"):
            continue
        target = os.path.join(tree, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not rel.endswith(handout.SOURCE_SUFFIXES):
            shutil.copy2(src, target)
            continue
        with open(src, encoding="utf-8") as f:
            text = f.read()
        stubbed, found = handout.stub_regions(text, rel, ids)
        if not found:
            shutil.copy2(src, target)
            continue
        solution = regions_in(text, rel)
        bodies = [None] * len(solution)
        if rel in student_files:
            try:
                with open(student_files[rel], encoding="utf-8") as f:
                    student = regions_in(f.read(), rel)
                if [r[0] for r in student] == [r[0] for r in solution]:
                    bodies = [body for _, body in student]
                else:
                    for ex_id in found:
                        problems.setdefault(ex_id, []).append(
                            f"{rel}: its BEGIN/END SOLUTION lines are not those of the handout (keep them as they were)")
            except (OSError, UnicodeDecodeError, handout.HandoutError) as e:
                for ex_id in found:
                    problems.setdefault(ex_id, []).append(f"{rel}: unreadable ({e})")
        # Every region stubbed, markers kept; regions of exercises not in the config keep the solution.
        stubbed, _ = handout.stub_regions(text, rel, {ex_id for ex_id, _ in solution})
        stubs = [body for _, body in regions_in(stubbed, rel)]
        for k, ((ex_id, body), mine) in enumerate(zip(solution, bodies)):
            if ex_id not in ids:
                bodies[k] = body
            elif blank(body):
                bodies[k] = None  # filled below, once every file is read
            elif mine is not None and mine.strip() == stubs[k].strip():
                bodies[k] = None  # the handout's stub, left as it was
            elif mine is not None:
                why = lint_region(mine, chapter_of.get(ex_id, 0))
                if why:
                    problems.setdefault(ex_id, []).append(f"{rel}: {why}")
                    bodies[k] = None
                else:
                    taken[ex_id] = True
        pending.append((target, stubbed, solution, bodies))
    for target, stubbed, solution, bodies in pending:
        for k, (ex_id, body) in enumerate(solution):
            if bodies[k] is None and blank(body) and ex_id in taken:
                bodies[k] = body
        with open(target, "w", encoding="utf-8") as f:
            f.write(fill_regions(stubbed, bodies))
    return problems, taken


def fill_regions(stubbed, bodies):
    """The stubbed text with the stub of region k replaced by bodies[k] where that is not None."""
    lines = stubbed.splitlines(keepends=True)
    out, k, i = [], 0, 0
    while i < len(lines):
        m = handout.BEGIN.match(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        out.append(lines[i])
        j = i + 1
        while not handout.END.match(lines[j]):
            j += 1
        out.extend(lines[i + 1:j] if bodies[k] is None else [bodies[k]])
        k += 1
        out.append(lines[j])
        i = j + 1
    return "".join(out)


def restub(tree, rel, ex_ids):
    """Puts the handout's stub back into the regions of `ex_ids` in the grading tree's file."""
    path = os.path.join(tree, rel)
    with open(path, encoding="utf-8") as f:
        text, _ = handout.stub_regions(f.read(), rel, set(ex_ids))
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


# A compiler's error line: nvcc's "path(12): error: ..." or gcc's "path:12:5: error: ...".
COMPILE_ERROR = re.compile(r"^(?P<path>[^\s:()][^:()\n]*?)(?:\((?P<nv>\d+)\):|:(?P<gcc>\d+):(?:\d+:)?) ?(?:fatal )?error\b.*$",
                           re.M)


def blame(log, tree, files_of):
    """{exercise id: error lines} for errors that fall inside an exercise region of the tree."""
    blamed = {}
    for m in COMPILE_ERROR.finditer(log):
        path = os.path.normpath(m.group("path"))
        rel = os.path.relpath(path, tree) if os.path.isabs(path) else path
        if rel not in files_of:
            continue
        line = int(m.group("nv") or m.group("gcc"))
        regions = []
        try:
            with open(os.path.join(tree, rel), encoding="utf-8") as f:
                handout.stub_regions(f.read(), rel, set(), regions)
        except (OSError, handout.HandoutError):
            continue
        text = m.group(0).strip().replace(os.path.join(tree, ""), "")
        for ex_id, _, first, last in regions:
            if first <= line <= last:
                blamed.setdefault(ex_id, []).append(text)
    return blamed


def build_until_clean(build, tree, files_of, broken, what, log=print):
    """Runs build() until it succeeds, stubbing the regions its compile errors fall in. Returns
    "" once it builds, else a short reason for the student. The compiler's output reaches the
    student only as the error lines inside their own regions (blame): any other line could quote
    a file the student may not see, so the rest goes to the grader's own log."""
    while True:
        ok, out = build()
        if ok:
            return ""
        blamed = {k: v for k, v in blame(out, tree, files_of).items() if k not in broken}
        if not blamed:
            log(f"grade: {what} does not build; the end of its log:\n" + out[-3000:])
            return (f"{what} does not build, and none of the compiler's errors falls inside an exercise region, "
                    "so there is nothing of yours to show here; the grader's own log has the compiler's output "
                    "(ask the instructor)")
        for ex_id, errors in blamed.items():
            broken[ex_id] = ["this exercise's code does not compile, so it was graded as the handout's stub:"] + errors[:20]
            for rel, held in files_of.items():
                if ex_id in held:
                    restub(tree, rel, [ex_id])


def gpu_available():
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def build_checker(out_dir):
    """fa_check from the instructor's tree (this one), with g++, in a folder only this user can
    enter (a runner of another user cannot run it to learn answers)."""
    own = os.path.join(out_dir, "checker")
    os.makedirs(own, mode=0o700)
    exe = os.path.join(own, "fa_check")
    sources = ["classroom/grader/checker.cpp"] + [f"common/{n}.cpp" for n in ("reference", "problem", "attention_features", "compare", "dtype", "fp8")]
    cmd = ["g++", "-O2", "-std=c++17", "-I", os.path.join(ROOT, "common"), "-I", "/usr/include/eigen3", "-o", exe]
    done = subprocess.run(cmd + [os.path.join(ROOT, s) for s in sources], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError("the checker does not build (an instructor's tree problem):\n" + done.stderr[-3000:])
    return exe


BUILD_TIMEOUT = 300  # seconds for one chapter's CPU runner (a compile-time loop cannot hold the grader)


def run_build(cmd, timeout, tmp):
    """(ok, output) of a build command run in a process group of its own, every process of which is
    killed when it runs past `timeout` seconds (the compiler's own children too); its temporary
    files go in `tmp`."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env=dict(os.environ, TMPDIR=tmp))
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode == 0, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return False, f"the build ran past {timeout} s and was stopped"


def cpu_runner_builder(tree, chapter, out_dir):
    exe = os.path.join(out_dir, f"runner_cpu_ch{chapter:02d}")
    sources = [os.path.join(tree, "classroom/grader/runner_cpu.cpp")] + [os.path.join(tree, f"common/{n}.cpp")
                                                                        for n in ("problem", "dtype", "fp8")]
    cmd = ["g++", "-O2", "-std=c++17", f"-DFA_RUNNER_CHAPTER={chapter}", "-I", os.path.join(tree, "common"), "-o", exe] + sources

    def build():
        return run_build(cmd, BUILD_TIMEOUT, out_dir)
    return exe, build


def gpu_runner_builder(tree, build_dir, chapters, cmake_args, fresh=True):
    def build():
        if fresh:
            # Each grading tree is a fresh folder: a cache made for another one is of no use.
            shutil.rmtree(os.path.join(build_dir, "CMakeFiles"), ignore_errors=True)
            if os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
                os.remove(os.path.join(build_dir, "CMakeCache.txt"))
        conf = subprocess.run(["cmake", "-S", tree, "-B", build_dir, "-DFA_BUILD_TESTS=OFF"] + cmake_args.split(),
                              capture_output=True, text=True)
        if conf.returncode != 0:
            return False, conf.stdout + conf.stderr
        targets = []
        for c in chapters:
            targets += ["--target", f"fa_runner_ch{c:02d}"]
        return run_build(["cmake", "--build", build_dir, "-j", str(os.cpu_count() or 2)] + targets, 3600, build_dir)
    return build


# ---- scoring ----------------------------------------------------------------------------------

def score_verdict(ex, verdict):
    """(score, output lines) from the checker's verdict for one exercise."""
    cases = verdict.get("cases", [])
    total = sum(c["weight"] for c in cases)
    got = sum(c["weight"] for c in cases if c["passed"])
    value = round(ex["points"] * got / total, 4) if total > 0 else 0
    passed = sum(1 for c in cases if c["passed"])
    lines = [f"{passed} of {len(cases)} cases passed (inputs drawn at grading time; cases of weight 0 are trivial shapes)"]
    for c in cases:
        mark = "ok  " if c["passed"] else "FAIL"
        lines.append(f"{mark} {c['name']}" + ("" if c["passed"] else f"\n     {c['detail']}")
                     + (f"\n     {c['note']}" if c.get("note") and c["passed"] else ""))
    return value, lines


NOT_HERE = "needs an NVIDIA GPU; grade it with tools/grade_batch.py on a GPU machine"


def refused_outcomes(exercises, has_gpu, why):
    """Every exercise 0 with `why`; GPU exercises, where there is no GPU, not graded here."""
    return {ex["id"]: ("not graded here", NOT_HERE) if ex["device"] == "gpu" and not has_gpu else ("graded", 0, [why])
            for ex in exercises}


def results_json(exercises, outcomes):
    """Gradescope's results.json from {id: ("graded", score, lines) | ("not graded here", reason)}."""
    tests, total, possible, elsewhere = [], 0.0, 0.0, 0.0
    for number, ex in enumerate(exercises, 1):
        outcome = outcomes[ex["id"]]
        name = f"{ex['id']}: {ex['title']}"
        if outcome[0] == "not graded here":
            elsewhere += ex["points"]
            tests.append({"name": f"{name} [not graded here]", "number": str(number), "score": 0, "max_score": 0,
                          "output": f"NOT GRADED HERE ({ex['points']:g} points): {outcome[1]}"})
            continue
        _, value, lines = outcome
        total += value
        possible += ex["points"]
        tests.append({"name": name, "number": str(number), "score": value, "max_score": ex["points"],
                      "status": "passed" if value >= ex["points"] else "failed",
                      "output": "\n".join(lines)[:MAX_OUTPUT]})
    summary = f"{round(total, 4):g} of {possible:g} points"
    if elsewhere:
        summary += f"; {elsewhere:g} more points of GPU exercises are not graded here (they need a GPU machine)"
    return {"score": round(total, 4), "output": summary, "tests": tests, "visibility": "visible",
            "stdout_visibility": "visible"}


def read_junit(path):
    """[(name, status, output)] from CTest's JUnit file, status passed / failed / skipped."""
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        failure = case.find("failure")
        skipped = case.find("skipped")
        if failure is not None:
            status = "failed"
        elif skipped is not None or case.get("status") in ("notrun", "disabled"):
            status = "skipped"
        else:
            status = "passed"
        output = "".join(e.text or "" for e in case.iter("system-out"))
        if failure is not None and failure.get("message"):
            output = failure.get("message") + "\n" + output
        cases.append((case.get("name"), status, output))
    return cases


# A handout (tools/handout.py leaves classroom/instructor/ out) grades its own copy as a
# self-check: the exercises whose expected answers come from the solution, and the speed parts,
# are not checked there.
STUDENT_COPY = not os.path.isdir(os.path.join(ROOT, "classroom", "instructor"))


LOCK = os.path.join(tempfile.gettempdir(), "fa_grade.lock")


class GradingBusy(Exception):
    pass


def one_grading_at_a_time(path=None):
    """Takes this machine's grading lock (an exclusive flock on `path`, default LOCK) and returns its
    open descriptor: the lock holds until it is closed. Two gradings at once would kill each
    other's runners, since both run them as the same sandbox user and kill every process of that
    user after each case. The file is this user's own, 0600, never a link: a runner cannot open it
    to hold the lock."""
    import fcntl
    path = path or LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        raise GradingBusy(f"the grading lock {path} cannot be opened ({e.strerror}); remove it if it is not this "
                          "user's file") from None
    if os.fstat(fd).st_uid != os.getuid():
        os.close(fd)
        raise GradingBusy(f"the grading lock {path} belongs to another user; remove it")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 100, 0).decode(errors="replace").strip() or "a process"
        os.close(fd)
        raise GradingBusy(f"another grading is running on this machine ({holder}, lock {path}); gradings run one "
                          "at a time, because each kills the sandbox user's processes after every case: wait for "
                          "it, or grade many submissions one after another with tools/grade_batch.py") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)
    return fd


def grade(submission, build_dir, config, cpu_only=False, timeout=120, cmake_args="", seed=None, log=print):
    exercises = handout.load_config(config)
    lock = one_grading_at_a_time()
    try:
        return grade_locked(exercises, submission, build_dir, cpu_only, timeout, cmake_args, seed, log)
    finally:
        os.close(lock)


def grade_locked(exercises, submission, build_dir, cpu_only, timeout, cmake_args, seed, log):
    """grade() while it holds the machine's grading lock."""
    work = tempfile.mkdtemp(prefix="fa_grade_")
    os.chmod(work, 0o755)
    has_gpu = not cpu_only and gpu_available()
    try:
        try:
            student_files = locate(submission or ROOT, ROOT)
        except SubmissionError as e:
            return results_json(exercises, refused_outcomes(exercises, has_gpu, str(e))), str(e)
        return grade_files(exercises, student_files, work, os.path.join(work, "tree"), has_gpu, build_dir, timeout,
                           cmake_args, seed, log)
    finally:
        for folder in UNPACKED + [work]:
            shutil.rmtree(folder, ignore_errors=True)
        UNPACKED.clear()


def grade_files(exercises, student_files, work, tree, has_gpu, build_dir, timeout, cmake_args, seed, log):
    """grade() once the submission's files are found."""
    outcomes = {}
    log("grade: the submission's " + ", ".join(sorted(student_files)))
    problems, taken = splice(ROOT, tree, student_files, exercises)
    files_of = exercise_files(ROOT)
    broken = {}
    for ex_id, why in problems.items():
        broken[ex_id] = ["this exercise was graded as the handout's stub:"] + why
        for rel, held in files_of.items():
            if ex_id in held:
                restub(tree, rel, [ex_id])
    checker = build_checker(work)
    runners, build_errors, reference_runners, cleanup = {}, {}, {}, []
    # Runners only for chapters with an exercise the submission holds code for.
    wanted = [ex for ex in exercises if ex["id"] in taken and ex["id"] not in broken]
    cpu_chapters = sorted({ex["chapter"] for ex in wanted if ex["device"] == "cpu"})
    for chapter in cpu_chapters:
        exe, build = cpu_runner_builder(tree, chapter, work)
        log(f"grade: building chapter {chapter:02d}'s CPU runner")
        error = build_until_clean(build, tree, files_of, broken, f"chapter {chapter:02d}'s CPU runner", log)
        if error:
            build_errors[("cpu", chapter)] = error
        else:
            runners[("cpu", chapter)] = exe
    gpu_chapters = sorted({ex["chapter"] for ex in wanted if ex["device"] == "gpu"})
    if has_gpu and gpu_chapters:
        # Default: a new folder only this user can enter (a predictable path in /tmp could be
        # made beforehand by someone else, e.g. as a link).
        if not build_dir:
            build_dir = os.path.join(tempfile.mkdtemp(prefix="fa_gpu_"), "build")
            cleanup.append(os.path.dirname(build_dir))
        gpu_build = os.path.abspath(build_dir)
        log(f"grade: building the GPU runners of chapters {', '.join(f'{c:02d}' for c in gpu_chapters)} in {gpu_build}")
        error = build_until_clean(gpu_runner_builder(tree, gpu_build, gpu_chapters, cmake_args), tree, files_of, broken,
                                  "the GPU runners", log)
        for chapter in gpu_chapters:
            if error:
                build_errors[("gpu", chapter)] = error
            else:
                exe = os.path.join(work, f"runner_gpu_ch{chapter:02d}")
                shutil.copy2(os.path.join(gpu_build, "bin", f"fa_runner_ch{chapter:02d}"), exe)
                runners[("gpu", chapter)] = exe
        # The speed parts compare with the instructor's own kernels, built from this tree (kept
        # between gradings: it does not change) and timed in the same run.
        timed = sorted({ex["chapter"] for ex in wanted if ex["device"] == "gpu" and ex.get("timed")})
        if STUDENT_COPY:
            timed = []  # no reference solution to time against
        if timed:
            ref_build = gpu_build.rstrip("/") + ".reference"
            log(f"grade: building the reference runners of chapters {', '.join(f'{c:02d}' for c in timed)} in {ref_build}")
            ok, out = gpu_runner_builder(ROOT, ref_build, timed, cmake_args, fresh=False)()
            if not ok:
                raise RuntimeError("the reference runners do not build (an instructor's tree problem):\n" + out[-3000:])
            for chapter in timed:
                exe = os.path.join(work, f"reference_gpu_ch{chapter:02d}")
                shutil.copy2(os.path.join(ref_build, "bin", f"fa_runner_ch{chapter:02d}"), exe)
                reference_runners[chapter] = exe
    for ex in exercises:
        key = (ex["device"], ex["chapter"])
        if ex["device"] == "gpu" and not has_gpu:
            outcomes[ex["id"]] = ("not graded here", NOT_HERE)
            continue
        if ex["id"] in broken:
            outcomes[ex["id"]] = ("graded", 0, broken[ex["id"]])
            continue
        if ex["id"] not in taken:
            outcomes[ex["id"]] = ("graded", 0, ["no code for this exercise in the submission (its regions still hold the "
                                                "handout's stub, or its file was not handed in)"])
            continue
        if key not in runners:
            outcomes[ex["id"]] = ("graded", 0, [build_errors.get(key, "no runner")])
            continue
        run_seed = seed if seed is not None else secrets.randbits(63)
        log(f"grade: checking {ex['id']}")
        cmd = [checker, "--exercise", ex["id"], "--runner", runners[key], "--timeout", str(timeout)]
        if ex["device"] == "gpu" and ex["chapter"] in reference_runners:
            cmd += ["--reference-runner", reference_runners[ex["chapter"]]]
        if STUDENT_COPY:
            cmd.append("--student-copy")
        # The seed goes in the environment: other users can read a command line, not that.
        done = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, FA_CHECK_SEED=str(run_seed)))
        try:
            verdict = json.loads(done.stdout)
        except json.JSONDecodeError:
            outcomes[ex["id"]] = ("graded", 0, ["the checker failed: " + done.stderr[-1000:]])
            continue
        value, lines = score_verdict(ex, verdict)
        outcomes[ex["id"]] = ("graded", value, lines)
    for folder in cleanup:
        shutil.rmtree(folder, ignore_errors=True)
    return results_json(exercises, outcomes), None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--submission", help="the student's tree, a zip of it, or the files they edited")
    parser.add_argument("--build-dir", default=None,
                        help="where CMake builds the GPU runners (default: a new folder in /tmp, removed after)")
    parser.add_argument("--out", default="results.json")
    parser.add_argument("--config", default=os.path.join(ROOT, "classroom", "exercises.json"))
    parser.add_argument("--cpu-only", action="store_true", help="grade the CPU exercises only, even with a GPU")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per runner process (default 120)")
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cmake-args", default=os.environ.get("CMAKE_ARGS", ""),
                        help='passed to CMake for the GPU runners, e.g. --cmake-args="-DFA_CUDA_ARCHITECTURES=90"')
    args = parser.parse_args()
    if args.timeout < 1:
        print(f"grade: error: --timeout must be at least 1, got {args.timeout}", file=sys.stderr)
        return 1
    start = time.time()
    try:
        results, refused = grade(args.submission, args.build_dir, args.config, args.cpu_only, args.timeout,
                                 args.cmake_args, args.seed)
    except (handout.HandoutError, GradingBusy) as e:
        print(f"grade: error: {e}", file=sys.stderr)
        return 1
    results["execution_time"] = round(time.time() - start, 1)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
        f.write("\n")
    if refused:
        print(f"grade: {refused}", file=sys.stderr)
    for t in results["tests"]:
        print(f"{t['score']:>7g} / {t['max_score']:<5g} {t['name']}")
        print("          " + t["output"].splitlines()[0])
    print(f"grade: {results['output']}; {args.out} written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
