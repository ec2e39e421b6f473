#!/usr/bin/env python3
"""make grade: score a student's exercises with the grader's checker, never with the student's tests.

Usage: python3 classroom/grade.py [--submission PATH] [--out results.json] [--build-dir DIR]
                                  [--config PATH] [--cpu-only] [--timeout SECONDS] [--cmake-args "..."]

PATH is what the student handed in: their whole tree, a zip of it, or just the files they
edited (at their paths in the tree, or loose: a file is placed by the exercise markers it
holds). Without --submission this tree itself is graded (a student checking their work).
--config names the exercises to grade (default: every exercise of classroom/exercises.json; an
assignment file may list just ids, one week's, say); the score and its total are theirs alone.

How a submission is graded (docs/grading.md says what this protects and what it does not):
  1. Only the bodies of the exercises' regions (between // BEGIN SOLUTION id and // END
     SOLUTION) are taken from the student's files. They go into a student copy made as
     `make handout` makes it (classroom/handout.py: every region a stub, no instructor-only file), so
     nothing else the student wrote, and nothing of the instructor's that the handout does not
     hold, is in the folder the build sees.
  2. Each region body is linted (lint_region: no preprocessor lines, no asm, no process, file,
     memory-allocation or exit calls, no other chapter's namespace, no oracle or registry
     lookups) and then read by g++ itself (compiler_view: no directive, macro or line splice as
     the compiler reads it, its brackets paired as the compiler splits its tokens). A region
     that fails scores 0 for its exercise and is stubbed.
  3. Runners are built from that copy: for a CPU exercise g++ builds its chapter's CPU runner
     (classroom/grader/runner_cpu.cpp with tasks/cpu_chNN.h: that chapter's algorithm.h and
     nothing else); for a GPU
     exercise CMake builds its chapter's GPU runner (fa_runner_chNN). A region that does not
     compile scores 0 and is stubbed, and the rest is built again. Only the compiler's errors
     inside the student's own regions reach results.json.
  4. The checker (classroom/grader/checker.cpp, with every chapter's case generators,
     classroom/grader/cases/*.cpp) is built from the instructor's tree, with the fp64 oracle and
     no student code. It draws each case's inputs from a fresh random seed,
     runs the runner on them in a separate process, and compares what comes back with the
     oracle. Its verdict is all that is scored.
As root, steps 2 and 3 (the compiler) and every runner run as a user of this grading's own (a
uid no account holds, one per grading at a time), which cannot read the instructor's tree (it
is made so), the checker, or another grading's files. So gradings may run side by side on one
machine: each kills only its own user's processes, and their GPU cases take turns through a lock
(a grading that waits for it says so). Without root there is no sandbox, and the grader says so
(a student's self-check).
An exercise scores its points times the weighted fraction of its cases that passed; trivial
shapes (one row, one key) have weight 0. GPU exercises on a machine without a GPU (or with
--cpu-only) are listed as "not graded here" with their points, out of the total.
"""
import argparse
import concurrent.futures
import glob
import json
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
import zipfile
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "classroom"))
import handout  # noqa: E402
from cxx_text import has_code, strip_comments_and_strings  # noqa: E402

MAX_OUTPUT = 4000  # characters of output kept per exercise
MAX_REGION = 20000  # characters of one region body
MAX_UPLOAD = 200 * 1024 * 1024  # bytes unpacked from a zip
MAX_ENTRIES = 20000  # entries of a student's zip (the student copy has a few hundred files)
MAX_DEPTH = 64  # folders a submission may nest (the tree's own go 4 deep)
BUILD_MEMORY = 16 << 30  # address space of each build process (nvcc's largest here uses well under half)
WHAT_TO_SUBMIT = ("submit the whole tree, a zip of it, or only the files you edited (for example "
                  "chapters/03_online_softmax/algorithm.h), with their BEGIN/END SOLUTION lines kept")


class SubmissionError(Exception):
    pass


# ---- taking in a submission -------------------------------------------------------------------

def safe_unzip(path, dest, limit=MAX_UPLOAD, skipped=None, max_entries=MAX_ENTRIES):
    """Unpacks a zip into dest, refusing absolute paths, '..', links, more than `limit` bytes and
    more than `max_entries` entries (empty files cost time and inodes, not bytes; None: no limit).
    With a list as `skipped`, an entry of the first three kinds is left out and its name added
    there instead (a batch export: one student's odd file does not stop the others' grading)."""
    try:
        with zipfile.ZipFile(path) as z:
            entries = len(z.infolist())
            if max_entries is not None and entries > max_entries:
                raise SubmissionError(f"the zip holds {entries} entries, more than the {max_entries} a submission may "
                                      f"have; {WHAT_TO_SUBMIT}")
            total = 0
            for info in z.infolist():
                name = info.filename
                unsafe = None
                if name.startswith("/") or ".." in name.split("/") or "\\" in name:
                    unsafe = f"the zip holds an unsafe path '{name}'"
                elif name.count("/") > MAX_DEPTH or len(name.encode("utf-8", "surrogateescape")) > 1024:
                    unsafe = f"the zip holds a path deeper than {MAX_DEPTH} folders or longer than 1024 bytes"
                elif (info.external_attr >> 16) & 0o170000 == 0o120000:
                    unsafe = f"the zip holds a link '{name}'"
                if unsafe and skipped is not None:
                    skipped.append(name)
                    continue
                if unsafe:
                    raise SubmissionError(f"{unsafe}; {WHAT_TO_SUBMIT}")
                total += info.file_size
                if total > limit:
                    raise SubmissionError(f"the zip unpacks to more than {limit >> 20} MB; {WHAT_TO_SUBMIT}")
                if info.is_dir():
                    continue
                target = os.path.join(dest, name)
                try:
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    with z.open(info) as src, open(target, "wb") as out:
                        shutil.copyfileobj(src, out)
                except OSError:
                    if skipped is None:
                        raise
                    skipped.append(name)  # a batch export: this entry alone is left out
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError):
        raise SubmissionError(f"{os.path.basename(path)} is not a readable zip; {WHAT_TO_SUBMIT}")
    except RuntimeError as e:  # an encrypted entry
        raise SubmissionError(f"{os.path.basename(path)} cannot be unpacked ({str(e)[:80]}); {WHAT_TO_SUBMIT}")
    except (OSError, ValueError) as e:  # e.g. an entry under a name that another entry made a file
        raise SubmissionError(f"{os.path.basename(path)} cannot be unpacked ({e.__class__.__name__}: an entry clashes "
                              f"with another); {WHAT_TO_SUBMIT}")


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
REFERENCE_BOXES = []  # the second sandbox user of a grading's speed parts (the reference runs as it)
REFERENCE_FOLDERS = []  # the folder the reference runners are run from


def linked(base, path):
    """True when `path` or a folder between `base` and it is a symbolic link, or `path` is not
    inside `base` once links are resolved: such a file is never read (it could be anyone's)."""
    rel = os.path.relpath(path, base)
    if rel.startswith(os.pardir) or os.path.isabs(rel):
        return True
    here = base
    for part in rel.split(os.sep):
        here = os.path.join(here, part)
        if os.path.islink(here):
            return True
    real_base = os.path.realpath(base)
    return os.path.commonpath([real_base, os.path.realpath(path)]) != real_base


def locate(submission, root, box=None):
    """{path in the tree: the student's file} for the exercise files the submission holds.
    A tree (or a zip of one) is matched by path; loose files by the exercise markers inside. A
    zip is unpacked into a folder that `box` (the grading's Sandbox) records before anything is
    written there, so a grading killed while unpacking leaves it to the next to remove."""
    wanted = exercise_files(root)
    work = None
    if os.path.islink(submission):
        raise SubmissionError(f"{os.path.basename(submission)} is a symbolic link; {WHAT_TO_SUBMIT}")
    if os.path.isfile(submission):
        if not submission.lower().endswith(".zip"):
            return locate_loose([submission], wanted)
        work = tempfile.mkdtemp(prefix="fa_upload_")
        UNPACKED.append(work)  # removed when the grading ends
        if box is not None:
            box.record(work)
        safe_unzip(submission, work)
        submission = work
    if not os.path.isdir(submission):
        raise SubmissionError(f"{submission} is neither a folder nor a zip; {WHAT_TO_SUBMIT}")
    # The tree's top may be the folder itself or one folder down (a zip of "handout/").
    tops = [submission] + [os.path.join(submission, d) for d in sorted(os.listdir(submission))
                           if os.path.isdir(os.path.join(submission, d)) and not os.path.islink(os.path.join(submission, d))]
    for top in tops:
        found = {rel: os.path.join(top, rel) for rel in wanted if os.path.isfile(os.path.join(top, rel))
                 and not linked(submission, os.path.join(top, rel))}
        if found:
            return found
    loose = []
    for base, dirs, names in os.walk(submission):
        if os.path.relpath(base, submission).count(os.sep) >= MAX_DEPTH:
            raise SubmissionError(f"the submission nests folders more than {MAX_DEPTH} deep; {WHAT_TO_SUBMIT}")
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("build", "__pycache__")]
        loose += [os.path.join(base, n) for n in names if not linked(submission, os.path.join(base, n))]
    return locate_loose(loose, wanted)


def locate_loose(paths, wanted):
    """Places loose files by the regions they hold: a file whose regions are exactly those of one
    exercise file of the tree is that file."""
    found = {}
    for path in paths:
        if not path.endswith(handout.SOURCE_SUFFIXES) or not stat.S_ISREG(os.lstat(path).st_mode):
            continue  # a FIFO or a device would block the read
        if os.path.getsize(path) > 2 * 1024 * 1024:
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
    "goto friend namespace using typeid register volatile "
    # libc's own state a region could keep something in between calls, and other allocators
    "seed48 lcong48 initstate setstate srand48 srandom srand drand48 lrand48 mrand48 erand48 nrand48 jrand48 "
    "random rand valloc pvalloc memalign aligned_alloc posix_memalign reallocarray asprintf vasprintf strdup "
    "strndup wcsdup on_exit tmpfile tmpfile64 tmpnam tempnam posix_openpt fcloseall clearenv "
    "canonicalize_file_name realpath getcwd setlocale tzset set_new_handler set_terminate set_unexpected "
    "get_temporary_buffer return_temporary_buffer ecvt fcvt qecvt qfcvt l64a localeconv "
    "__errno_location errno strtok ctime asctime gmtime localtime getpwnam getlogin "
    # libc's and the C++ library's other writable globals (a counter kept in one would outlive the call)
    "signgam environ __environ optarg optind opterr optopt tzname daylight timezone stdin stdout stderr "
    "program_invocation_name program_invocation_short_name h_errno getdate_err sys_errlist sys_nerr sys_siglist "
    "__progname cin cout cerr clog wcin wcout wcerr wclog xalloc iword pword set_default_resource "
    "get_default_resource locale getopt getopt_long getopt_long_only getsubopt sbrk brk nice "
    "__nv_aligned_device_malloc pthread_create async").split()
GRADER_NAMESPACE = "grader"  # fa::grader: the runners' own code


def chapter_namespaces(root=ROOT):
    """{chapter number: the namespace its algorithm.h opens (namespace fa::NAME)}: a region may
    name its own chapter's namespace and no other's."""
    found = {}
    for number, folder in handout.chapter_folders(root).items():
        try:
            with open(os.path.join(root, folder, "algorithm.h"), encoding="utf-8") as f:
                m = re.search(r"^namespace fa::(\w+)", f.read(), re.M)
        except OSError:
            continue
        if m:
            found[number] = m.group(1)
    return found


CHAPTER_NAMESPACES = chapter_namespaces()
BANNED_NAMESPACES = tuple(sorted(set(CHAPTER_NAMESPACES.values()))) + (GRADER_NAMESPACE,)
BANNED_PARTS = re.compile(r"reference|oracle|registry|_kernels\b|cpu_algorithms|find_|Problem|run_forward|"
                          r"run_backward|launch_", re.I)
BANNED_STRINGS = ("/proc", "/dev", "/sys", "/autograder", "/tmp", "/etc", "/home", "/root", "/usr")
# Families of names no kernel exercise needs: compiler builtins and attributes, and the C and
# POSIX calls that reach files, processes, memory maps, IPC, the network or the environment.
BANNED_NAME_PATTERN = re.compile(
    r"(__builtin\w*|__attribute\w*|__asm\w*|__sync_\w*|__atomic\w*|__declspec|f?open(64|at|at64)?|freopen(64)?|"
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


def raw_text_problem(body):
    """The first reason the raw text of a region body is refused before anything reads it, or "":
    a control character other than newline and tab, or a backslash before the end of a line with
    only whitespace between (g++ splices such lines, a form feed or vertical tab between
    included)."""
    control = re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u0085]", body)
    if control:
        return (f"the character U+{ord(control.group()):04X} is not allowed in an exercise region: "
                "of the control characters only newlines and tabs are")
    if re.search(r"\\\s*$", body, re.M) or body.rstrip(" \t").endswith("\\"):
        return "a backslash at the end of a line (line splicing) is not allowed in an exercise region"
    return ""


# The macros a region may name (the solutions name these); any other macro name, of the system
# headers, the CUDA toolkit's or the project's own, is refused: a macro expands only in the real
# build, where neither the lint nor the compiler's reading of the region alone sees it (glibc's
# __CONCAT and the project's FA_CONCAT paste any name together, __END_DECLS is a '}').
ALLOWED_MACROS = {"INFINITY", "NAN", "HUGE_VALF", "HUGE_VAL", "FLT_MAX", "FLT_MIN", "FLT_EPSILON", "DBL_MAX",
                  "INT_MAX", "INT_MIN", "UINT_MAX", "INT64_MAX", "INT32_MAX", "SIZE_MAX", "__shared__", "CUDA_CHECK",
                  "CUDA_CHECK_LAUNCH"}
HEADER_MACROS = {}


# Macros no header defines: the grader's own -D for a CPU runner, what -O2 defines, and nvcc's
# (a region may name these no more than the headers' macros).
COMMAND_LINE_MACROS = {"FA_RUNNER_TASKS", "NDEBUG", "__OPTIMIZE__", "__OPTIMIZE_SIZE__", "__NO_INLINE__", "__CUDA_ARCH__",
                       "__CUDA_ARCH_LIST__", "__CUDACC__", "__CUDACC_RDC__", "__CUDACC_DEBUG__", "__CUDACC_VER_MAJOR__",
                       "__CUDACC_VER_MINOR__", "__CUDACC_VER_BUILD__", "__NVCC__", "__CUDA_ARCH_FEAT_SM90_ALL"}


def header_macros():
    """Every macro name the C++ standard library and the POSIX headers define (g++ -dM), and the
    names the project's sources and the CUDA toolkit's headers #define."""
    if "names" not in HEADER_MACROS:
        headers = ("bits/stdc++.h", "unistd.h", "fcntl.h", "sys/stat.h", "sys/types.h", "sys/mman.h", "sys/wait.h",
                   "sys/socket.h", "signal.h", "dlfcn.h", "pthread.h", "dirent.h", "spawn.h", "sys/syscall.h",
                   "sys/resource.h", "sys/prctl.h", "netinet/in.h", "arpa/inet.h", "poll.h", "sched.h")
        text = "".join(f"#include <{h}>\n" for h in headers)
        done = subprocess.run(["g++", "-std=c++17", "-x", "c++", "-E", "-dM", "-"], input=text, capture_output=True,
                              text=True, errors="replace", timeout=120)
        names = set(re.findall(r"^#define ([A-Za-z_][A-Za-z0-9_]*)", done.stdout, re.M))
        if done.returncode != 0 or len(names) < 500:
            raise RuntimeError("grade: g++ could not list the headers' macros: " + done.stderr[-300:])
        # The project's own macros (FA_CONCAT pastes names too) and the CUDA toolkit's, read from
        # their #define lines: g++ cannot read the CUDA headers, and a GPU region sees them.
        trees = [os.path.join(ROOT, d) for d in ("common", "chapters", "classroom/grader")]
        cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
        trees += [os.path.join(cuda, "include")] if os.path.isdir(os.path.join(cuda, "include")) else []
        for top in trees:
            for base, _, files in os.walk(top):
                for name in files:
                    if name.endswith((".h", ".hpp", ".cuh", ".cu", ".cpp", ".inl")):
                        try:
                            with open(os.path.join(base, name), encoding="utf-8", errors="replace") as f:
                                names.update(re.findall(r"^\s*#\s*define\s+([A-Za-z_][A-Za-z0-9_]*)", f.read(), re.M))
                        except OSError:
                            continue
        HEADER_MACROS["names"] = names | COMMAND_LINE_MACROS
    return HEADER_MACROS["names"]


CONTROL_WORDS = {"if", "for", "while", "switch", "catch", "return", "sizeof", "decltype", "do", "else"}


def enclosing_functions(text):
    """For each BEGIN SOLUTION marker of `text`, in order, the set holding the name of the function
    it is written in (the nearest block above it whose head is `name(...) {` with a name that is
    not if/for/while/...), or an empty set when none is found."""
    raw = text.split("\n")
    lines = [line.split("//")[0] for line in raw]
    out = []
    for at, line in enumerate(raw):
        if "// BEGIN SOLUTION" not in line:
            continue
        depth, name = 0, None
        for k in range(at - 1, -1, -1):
            depth += lines[k].count("}") - lines[k].count("{")
            if depth >= 0:
                continue
            # lines[k] opens a block the marker is in; its head ends at that line's last '{'.
            head = (" ".join(lines[max(0, k - 6):k]) + " " + lines[k][:lines[k].rfind("{")]).rstrip()
            for suffix in ("override", "noexcept", "const"):
                if head.endswith(suffix):
                    head = head[:-len(suffix)].rstrip()
            if head.endswith(")"):
                paren, i = 0, len(head) - 1
                while i >= 0:
                    paren += {")": 1, "(": -1}.get(head[i], 0)
                    if paren == 0:
                        break
                    i -= 1
                m = re.search(r"([A-Za-z_][A-Za-z0-9_]*)\s*$", head[:max(i, 0)])
                if m and m.group(1) not in CONTROL_WORDS:
                    name = m.group(1)
                    break
            depth = 0  # a loop's or a lambda's block: look further up
        out.append({name} if name else set())
    return out


def lint_region(body, chapter, enclosing=()):
    """The first reason this region body may not be graded, or "" when it is fine. enclosing: the
    names of the function the region is written in (enclosing_functions)."""
    if len(body) > MAX_REGION:
        return f"the region holds {len(body)} characters; at most {MAX_REGION} are graded"
    problem = raw_text_problem(body)
    if problem:
        return problem
    if "??" in body:
        return "'??' is not allowed in an exercise region (trigraphs)"
    glued = []
    code, strings = strip_comments_and_strings(body, glued)
    if glued:
        return ("a character literal right after a number (as in 0x1'a'x') is not allowed in an exercise region: "
                "put a space between them")
    for line in code.splitlines():
        stripped = line.strip()
        if stripped.startswith(("#", "%:")) and not re.fullmatch(r"#\s*pragma\s+unroll(\s+\d+)?", stripped):
            return f"a preprocessor line ('{stripped[:40]}'): regions may hold code only (#pragma unroll is allowed)"
        if "%:" in line or "<%" in line or "%>" in line or "<:" in line or ":>" in line:
            return "digraphs are not allowed"
        if "#" in line and not re.fullmatch(r"#\s*pragma\s+unroll(\s+\d+)?", stripped):
            return "'#' is not allowed in an exercise region outside '#pragma unroll'"
    # Attributes can carry text to the assembler (a section name is written into the assembly as it
    # is, newlines and all: .incbin, .init_array) and change how code is built: none in a region.
    if re.search(r"\[\s*\[", code) or re.search(r"\b(__attribute__|__attribute|__declspec)\b", code):
        return "attributes ([[...]], __attribute__) are not allowed in an exercise region"
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
    macros = header_macros()
    for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", code):
        if word in macros and word not in ALLOWED_MACROS:
            return (f"'{word}' is a macro (of the system, CUDA or project headers, or the compiler's command "
                    "line); a region may name no macro but "
                    + ", ".join(sorted(ALLOWED_MACROS)))
        if word in enclosing:
            return (f"'{word}' is the function this region is written in: a region may not name it (its loop is the "
                    "frame the exercise's step runs in)")
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
    # The region holds whole statements: it ends with ';' or '}' (a trailing `if (false)` or
    # `return` would take over the statement after it) and does not begin with an `else` (which
    # would attach to the statement before it).
    statements = "\n".join(line for line in code.splitlines()
                           if not re.fullmatch(r"\s*#\s*pragma\s+unroll(\s+\d+)?\s*", line)).strip()
    if statements and statements[-1] not in ";}":
        return (f"the region ends in '{statements[-30:]}': a region holds whole statements, so its code ends "
                "with ';' or '}'")
    if re.match(r"else\b", statements):
        return "the region begins with 'else': a region holds whole statements of its own"
    return ""


def blank(body):
    """True for a region with no code in the solution: a marker in a launcher that only says where
    the exercise's code is (its stub throws "not implemented" before the launch)."""
    return not has_code(body)


def splice(root, tree, student_files, exercises, check=None):
    """Writes into `tree` the student copy of the instructor's tree `root` (classroom/handout.py: every
    exercise region stubbed, the instructor's files left out), then puts into each region the
    student's body when the submission has the file and its markers and the body passes the lint
    and `check` (a function of the body giving a reason to refuse it, or ""). So the folder a
    build sees holds the handout and the student's region bodies, nothing else of the
    instructor's. A region that is blank in the solution is never the student's: it is left
    empty once some code of its exercise was taken (wherever it is), else stubbed. Returns
    ({id: [problems]}, {id: True when some student code was taken})."""
    ids = {ex["id"] for ex in exercises}
    chapter_of = {ex["id"]: ex["chapter"] for ex in exercises}
    handout.write_copy(root, tree, exercises)
    problems, taken, pending = {}, {}, []
    for rel in sorted(exercise_files(root)):
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            text = f.read()
        every = regions_in(text, rel)
        enclosing = [names for r, names in zip(every, enclosing_functions(text)) if r[0] in ids]
        solution = [r for r in every if r[0] in ids]
        if not solution:
            continue
        target = os.path.join(tree, rel)
        with open(target, encoding="utf-8") as f:
            stubbed = f.read()
        stubs = [body for _, body in regions_in(stubbed, rel)]
        bodies = [None] * len(solution)
        found = sorted({ex_id for ex_id, _ in solution})
        if rel in student_files:
            try:
                # Universal newlines: a file saved with CRLF line ends reads as the compiler reads it.
                with open(student_files[rel], encoding="utf-8") as f:
                    student = [r for r in regions_in(f.read(), rel) if r[0] in ids]
                if [r[0] for r in student] == [r[0] for r in solution]:
                    bodies = [body for _, body in student]
                else:
                    for ex_id in found:
                        problems.setdefault(ex_id, []).append(
                            f"{rel}: its BEGIN/END SOLUTION lines are not those of the handout (keep them as they were)")
            except (OSError, UnicodeDecodeError, handout.HandoutError) as e:
                for ex_id in found:
                    problems.setdefault(ex_id, []).append(f"{rel}: unreadable ({e.__class__.__name__})")
        for k, ((ex_id, body), mine) in enumerate(zip(solution, bodies)):
            if blank(body):
                bodies[k] = None  # filled below, once every file is read
            elif mine is not None and mine.strip() == stubs[k].strip():
                bodies[k] = None  # the handout's stub, left as it was
            elif mine is not None:
                why = lint_region(mine, chapter_of.get(ex_id, 0), enclosing[k]) or (check(mine) if check else "")
                if why:
                    problems.setdefault(ex_id, []).append(f"{rel}: {why}")
                    bodies[k] = None
                else:
                    taken[ex_id] = True
        pending.append((target, stubbed, solution, bodies))
    for target, stubbed, solution, bodies in pending:
        for k, (ex_id, body) in enumerate(solution):
            if bodies[k] is None and blank(body) and ex_id in taken:
                bodies[k] = ""
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
# A compiler's error line: nvcc's "path(12): error: ..." or gcc's "path:12:5: error: ...".
COMPILE_ERROR = re.compile(r"^(?P<path>[^\s:()][^:()\n]*?)(?:\((?P<nv>\d+)\):|:(?P<gcc>\d+):(?:\d+:)?) ?(?:fatal )?"
                           r"error\b:?\s*(?P<msg>.*)$", re.M)
MAX_ERRORS_SHOWN = 5  # a region's compile errors given to the student


def blame(log, tree, files_of, cwd=None):
    """{exercise id: [(rel, line within the region's body, message)]} for the compile errors that
    fall inside the body of an exercise region of the tree; every other line of the log is left
    out (it could quote any file the compiler read). Relative paths are read from `cwd`."""
    blamed, regions_of = {}, {}
    for m in COMPILE_ERROR.finditer(log):
        path = m.group("path")
        path = os.path.normpath(path if os.path.isabs(path) else os.path.join(cwd or tree, path))
        rel = os.path.relpath(path, tree)
        if rel not in files_of:
            continue
        if rel not in regions_of:
            regions_of[rel] = []
            try:
                with open(os.path.join(tree, rel), encoding="utf-8") as f:
                    handout.stub_regions(f.read(), rel, set(), regions_of[rel])
            except (OSError, handout.HandoutError):
                continue
        line = int(m.group("nv") or m.group("gcc"))
        for ex_id, _, first, last in regions_of[rel]:
            if first < line < last:
                message = m.group("msg").replace(os.path.join(tree, ""), "").strip()
                blamed.setdefault(ex_id, []).append((rel, line - first, message[:300]))
    return blamed


def compile_reason(ex_id, errors):
    """What the student reads for a region that does not compile: the count and the first errors,
    each at its line within their own region."""
    rel, line, message = errors[0]
    count = f"{len(errors)} error" + ("s" if len(errors) > 1 else "")
    lines = [f"region {ex_id} ({rel}) does not compile: {count}, first at line {line} of your region: {message}"]
    lines += [f"  line {n} of your region ({r}): {msg}" for r, n, msg in errors[1:MAX_ERRORS_SHOWN]]
    if len(errors) > MAX_ERRORS_SHOWN:
        lines.append(f"  ... and {len(errors) - MAX_ERRORS_SHOWN} more")
    return lines


def build_until_clean(build, tree, files_of, broken, what, log=print, cwd=None):
    """Runs build() until it succeeds, stubbing the regions its compile errors fall in. Returns
    "" once it builds, else a short reason for the student. The compiler's output reaches the
    student only as the error messages inside their own regions (blame), at lines counted within
    the region: any other line could quote a file the student may not see, so the rest goes to
    the grader's own log."""
    while True:
        ok, out = build()
        if ok:
            return ""
        blamed = {k: v for k, v in blame(out, tree, files_of, cwd).items() if k not in broken}
        if not blamed:
            log(f"grade: {what} does not build; the end of its log:\n" + out[-3000:])
            return (f"{what} does not build, and none of the compiler's errors falls inside an exercise region, "
                    "so there is nothing of yours to show here. A name your region declares can break the code "
                    "after it (a variable that hides one the file uses later): rename what your regions declare "
                    "and build your copy (make build). The grader's own log has the compiler's output; if your "
                    "copy builds, ask the instructor")
        for ex_id, errors in blamed.items():
            broken[ex_id] = ["this exercise's code does not compile, so it was graded as the handout's stub:"] + \
                compile_reason(ex_id, errors)
            for rel, held in files_of.items():
                if ex_id in held:
                    restub(tree, rel, [ex_id])


def gpu_available():
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


CHECKER_SOURCES = ["classroom/grader/checker.cpp", "classroom/grader/runner_process.cpp",
                   "classroom/grader/cases.cpp"] + [f"common/{n}.cpp" for n in (
                       "reference", "problem", "attention_features", "compare", "dtype", "fp8")]


ANSWERS = "classroom/instructor/answers.cpp"  # the step cases' answers: the instructor's alone
NO_ANSWERS = "classroom/grader/answers_absent.cpp"  # in their place in a student copy


def checker_sources(root=ROOT):
    """The checker's sources in `root`: its own, every chapter's case generators
    (classroom/grader/cases/*.cpp), the oracle's part of common/, and the step cases' answers
    (classroom/grader/answers.h: the instructor's file where it is, else none)."""
    answers = ANSWERS if os.path.isfile(os.path.join(root, ANSWERS)) else NO_ANSWERS
    return CHECKER_SOURCES + [answers] + sorted(
        os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "classroom", "grader", "cases", "*.cpp")))


def build_checker(out_dir):
    """fa_check from the instructor's tree (this one), with g++, as the grader's user, in a folder
    only that user can enter (the sandbox user can neither read nor run it). Its sources are
    compiled side by side, then linked."""
    own = os.path.join(out_dir, "checker")
    os.makedirs(own, mode=0o700)
    exe = os.path.join(own, "fa_check")
    flags = ["g++", "-O2", "-std=c++17", "-I", os.path.join(ROOT, "common"), "-I", "/usr/include/eigen3"]
    sources = checker_sources()

    def compile_one(k):
        obj = os.path.join(own, f"{k:03d}_{os.path.basename(sources[k])}.o")
        done = subprocess.run(flags + ["-c", "-o", obj, os.path.join(ROOT, sources[k])], capture_output=True, text=True, errors="replace")
        return obj, done
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        built = list(pool.map(compile_one, range(len(sources))))
    for obj, done in built:
        if done.returncode != 0:
            raise RuntimeError("the checker does not build (an instructor's tree problem):\n" + done.stderr[-3000:])
    done = subprocess.run(flags + ["-o", exe] + [obj for obj, _ in built], capture_output=True, text=True, errors="replace")
    if done.returncode != 0:
        raise RuntimeError("the checker does not link (an instructor's tree problem):\n" + done.stderr[-3000:])
    return exe


def checker_exercises(checker):
    """The exercise ids the checker has case generators for (fa_check --list)."""
    done = subprocess.run([checker, "--list"], capture_output=True, text=True, errors="replace")
    return done.stdout.split()


BUILD_TIMEOUT = 300  # seconds for one chapter's CPU runner (a compile-time loop cannot hold the grader)
# The address space a CPU exercise's runner may take (the largest case needs well under 1 GiB). A
# GPU runner has no such limit: the CUDA driver reserves more address space than any useful limit.
CPU_RUNNER_MEMORY_MB = 4096


def run_build(cmd, timeout, tmp, box=None, cwd=None):
    """(ok, output) of a build command run in a process group of its own, as the sandbox's user
    when `box` is active, every process of which is killed when it runs past `timeout` seconds
    (the compiler's own children too) and may map at most BUILD_MEMORY bytes (a few hundred bytes
    of nested templates can ask the compiler for gigabytes); its temporary files go in `tmp`,
    its environment is the few variables a compiler needs."""
    box = box or Sandbox()

    def enter():
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (BUILD_MEMORY, BUILD_MEMORY))
        box.enter()

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                            errors="replace", start_new_session=True, env=box.env(tmp), cwd=cwd or tmp,
                            preexec_fn=enter)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode == 0, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return False, f"the build ran past {timeout} s and was stopped"


# The GPU runners' build: chapters of CUDA kernels, a few minutes on a small machine; well under
# grade_batch's default time per student, so that a build that never ends is stopped first.
GPU_BUILD_TIMEOUT = 900


def cpu_tasks(chapter):
    """The CPU runner's tasks file of a chapter, relative to classroom/grader/: it includes that
    chapter's algorithm.h and nothing of another chapter's."""
    return f"tasks/cpu_ch{chapter:02d}.h"


def cpu_runner_builder(tree, chapter, out_dir, box=None):
    exe = os.path.join(out_dir, f"runner_cpu_ch{chapter:02d}")
    sources = [os.path.join(tree, "classroom/grader/runner_cpu.cpp")] + [os.path.join(tree, f"common/{n}.cpp")
                                                                        for n in ("problem", "dtype", "fp8")]
    cmd = (["g++", "-O2", "-std=c++17", f'-DFA_RUNNER_TASKS="{cpu_tasks(chapter)}"', "-I", os.path.join(tree, "common"),
            "-o", exe] + sources)

    def build():
        return run_build(cmd, BUILD_TIMEOUT, os.path.join(out_dir, "tmp"), box, cwd=out_dir)
    return exe, build


def gpu_runner_builder(tree, build_dir, chapters, cmake_args, box=None, tmp=None):
    """build() of the GPU runners of `chapters` from `tree` in `build_dir` (as the sandbox's user
    when `box` is active)."""
    tmp = tmp or build_dir

    def build():
        conf = run_build(["cmake", "-S", tree, "-B", build_dir, "-DFA_BUILD_TESTS=OFF"] + cmake_args.split(), 600, tmp,
                         box, cwd=build_dir)
        if not conf[0]:
            return conf
        targets = []
        for c in chapters:
            targets += ["--target", f"fa_runner_ch{c:02d}"]
        return run_build(["cmake", "--build", build_dir, "-j", str(os.cpu_count() or 2)] + targets, GPU_BUILD_TIMEOUT,
                         tmp, box,
                         cwd=build_dir)
    return build


# ---- the sandbox ------------------------------------------------------------------------------

# As root, each grading builds and runs the student's code as a user of its own: a uid (also its
# gid) from this range that no account holds, with no supplementary groups, taken for the whole
# grading by a lock in STATE_DIR. So the instructor's tree (made unreadable to others), the
# checker and other gradings' files are out of its reach, and killing every process of that user
# after each case touches this grading's runners only.
SANDBOX_IDS = range(61000, 61200)
STATE_DIR = "/run/fa_grade" if os.path.isdir("/run") else os.path.join(tempfile.gettempdir(), "fa_grade_state")


class SandboxError(Exception):
    pass


# The shared writable places a sandbox user can leave files in (the checker's sweep_user after
# each case goes through the same ones).
SHARED_PLACES = ("/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue", "/run/lock")


def remove_tree(path):
    """`path` and everything under it, at any depth, links not followed (GNU rm walks any depth,
    where shutil.rmtree's recursion stops at Python's limit and leaves the rest)."""
    if os.path.isabs(path) and os.path.lexists(path):
        subprocess.run(["rm", "-rf", "--one-file-system", "--", path], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)


def sweep_user_files(uid):
    """As root: every file and folder of `uid` in the shared writable places, whole, at any depth
    (what a grading killed before its own sweep left there)."""
    for place in SHARED_PLACES:
        if os.path.isdir(place):
            # The user's own entries go whole; another's folder is searched wherever the user could
            # enter it (open to others, or to the user's group), so that a folder open to writes
            # below one that is closed to them (a chroot's tmp) is searched too.
            subprocess.run(["find", place, "-xdev", "-mindepth", "1",
                            "(", "-user", str(uid), "-prune", "-exec", "rm", "-rf", "--one-file-system", "--", "{}", "+",
                            ")", "-o", "(", "-type", "d", "!", "-perm", "-0001", "!", "(", "-perm", "-0010", "-group",
                            str(uid), ")", "-prune", ")"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stale_folder(path):
    """Whether `path` is a grading's own folder (tempfile's fa_grade_, fa_sandbox_, fa_reference_
    or fa_upload_), the only kind a lock's record may name for removal."""
    return (os.path.dirname(path) == tempfile.gettempdir() and not os.path.islink(path) and
            re.fullmatch(r"fa_(grade|sandbox|reference|upload)_[A-Za-z0-9_]+", os.path.basename(path)) is not None)


class Sandbox:
    """The user that builds and runs a submission's code. Active as root (a uid of its own);
    otherwise the grader's own user, which is no sandbox (a student checking their own work)."""

    def __init__(self, uid=None, lock=None):
        self.uid, self.lock = uid, lock

    @property
    def active(self):
        return self.uid is not None

    def enter(self):
        """In a child before exec: no core files, then (when active) this sandbox's user."""
        import resource
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.umask(0o022)
        if self.active:
            os.setgroups([])
            os.setgid(self.uid)
            os.setuid(self.uid)

    def env(self, tmp):
        """A compiler's environment: PATH, the CUDA toolkit's variables, TMPDIR; nothing else of the
        grader's (which could hold a secret the build would see)."""
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent", "TMPDIR": tmp, "LC_ALL": "C"}
        for keep in ("LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "CUDACXX", "CXX", "CC", "CUDA_VISIBLE_DEVICES"):
            if keep in os.environ:
                env[keep] = os.environ[keep]
        return env

    def as_user(self, action):
        """action() run in a child that took this sandbox's user; True when it returned True."""
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.setgroups([])
                os.setgid(self.uid)
                os.setuid(self.uid)
                code = 0 if action() else 1
            finally:
                os._exit(code)
        return os.waitpid(pid, 0)[1] == 0

    def can_reach(self, path):
        """Whether this sandbox's user can list `path` or open what is under it."""
        def reach():
            for probe in (lambda: os.listdir(path), lambda: os.stat(os.path.join(path, "."))):
                try:
                    probe()
                    return True
                except OSError:
                    pass
            return False
        return self.active and self.as_user(reach)

    def alive(self):
        """Whether a process of this sandbox's user is alive (zombies, which wait to be reaped, not)."""
        me = os.getpid()
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == me:
                continue
            try:
                with open(f"/proc/{entry}/status") as f:
                    status = dict(line.split(":", 1) for line in f if ":" in line)
            except OSError:
                continue
            if int(status.get("Uid", "-1").split()[0]) == self.uid and "Z" not in status.get("State", ""):
                return True
        return False

    def kill_all(self):
        """Kills every process of this sandbox's user, signalling as that user (so it can signal no
        other), until none is left. kill(-1) itself tells nothing: it succeeds while any other
        process exists."""
        def kill():
            for _ in range(1000):
                try:
                    os.kill(-1, signal.SIGKILL)
                except ProcessLookupError:
                    break
                if not self.alive():
                    break
                time.sleep(0.001)
            return True
        if self.active:
            self.as_user(kill)

    def own(self, path):
        """Gives `path` (a new empty folder) to this sandbox's user, for its build to write in."""
        if self.active:
            os.chown(path, self.uid, self.uid)

    def take_back(self, path):
        """Every file and folder under `path` back to the grader's user, links not followed, once
        the sandbox's user is done writing there (its processes are killed first): a runner of
        that user can then change nothing the grader reads or runs."""
        if not self.active:
            return
        self.kill_all()
        os.lchown(path, 0, 0)
        for base, dirs, names in os.walk(path):
            for name in dirs + names:
                os.lchown(os.path.join(base, name), 0, 0)

    def protect(self, paths, log=print):
        """Makes each of `paths` unreachable to this sandbox's user (group and others lose their
        access to the folder itself, when they had it), and checks that it is."""
        for path in paths:
            if not self.can_reach(path):
                continue
            mode = os.stat(path).st_mode
            os.chmod(path, mode & ~0o077)
            log(f"grade: {path} was open to other users; it is now mode {mode & ~0o077 & 0o7777:o}, so that the "
                "sandbox's user cannot read it")
            if self.can_reach(path):
                raise SandboxError(f"{path} is still readable by the sandbox's user (uid {self.uid}) after chmod go-rwx "
                                   "(an ACL?); make it readable by its owner only")

    def record(self, folder):
        """Notes `folder` in this sandbox's lock file: if this grading is killed before it removes
        it, the next grading to claim this user removes it before running anything."""
        if self.lock is not None:
            os.lseek(self.lock, 0, os.SEEK_END)
            os.write(self.lock, f"folder {folder}\n".encode())

    def close(self):
        if self.lock is not None:
            self.kill_all()
            os.close(self.lock)
            self.lock = None


def private_dir(path):
    """`path`, a folder of this user's own that no one else may enter, made when missing."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError as e:
        raise SandboxError(f"the grader's state folder {path} cannot be made ({e.strerror})") from None
    import stat as st_mod
    if not st_mod.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise SandboxError(f"{path} must be a folder of uid {os.geteuid()}'s with mode 0700 (it is not): remove it")
    return path


def id_in_use(n):
    """Whether an account or a group holds the id n."""
    import grp
    import pwd
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(n)
            return True
        except KeyError:
            pass
    return False


def claim_sandbox(ids=SANDBOX_IDS, state=None):
    """As root, a Sandbox with a uid of its own for this grading; otherwise an inactive one."""
    if os.geteuid() != 0:
        return Sandbox()
    import fcntl
    state = private_dir(state or STATE_DIR)
    for n in ids:
        if id_in_use(n):
            continue
        fd = os.open(os.path.join(state, f"uid_{n}.lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        # What a grading of this user that was killed midway left: its processes, its folders (the
        # lock file names them) and its files in the shared places.
        stale = os.pread(fd, 1 << 16, 0).decode("utf-8", "replace").splitlines()
        box = Sandbox(n, fd)
        box.kill_all()
        for line in stale:
            if line.startswith("folder ") and stale_folder(line[len("folder "):]):
                remove_tree(line[len("folder "):])
        sweep_user_files(n)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)
        return box
    raise SandboxError(f"no sandbox user is free: every id from {ids.start} to {ids.stop - 1} is an account's or "
                       "another grading's; wait for a grading to end")


def gpu_turn(state=None, log=print):
    """As root, a descriptor holding the machine's GPU lock (gradings run their GPU cases one at a
    time, so timed cases do not share the GPU); None otherwise. Blocks until the lock is free,
    saying so when another grading holds it."""
    if os.geteuid() != 0:
        return None
    import fcntl
    path = os.path.join(private_dir(state or STATE_DIR), "gpu.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        log(f"grade: waiting for the GPU: another grading on this machine is running its GPU cases ({path} is "
            "held); this one goes on when that one's case ends")
        fcntl.flock(fd, fcntl.LOCK_EX)
        log("grade: the GPU is free; going on")
    return fd


PRAGMA_UNROLL = re.compile(r"[ \t]*#[ \t]*pragma[ \t]+unroll([ \t]+\d+)?[ \t]*")


def compiler_view(body, box, work):
    """The first reason the compiler's own reading of a region body shows it is not plain code
    that stays where it is written, or "". g++ reads the body (as the sandbox's user, in `work`):
      1. tokenized only (-fpreprocessed: no directives, no macros) and fully preprocessed, with a
         last line holding __LINE__ and __FILE__: the two must agree up to that line and the line
         must be the body's own, else the body holds a directive, a macro, a splice or a #line;
      2. as g++ splits it into tokens (-fdebug-cpp marks each one): its (), [] and {} must pair
         up, so it cannot close the function it sits in or add code outside it; a comment or a
         literal left open is an error of the preprocessor's.
    #pragma unroll lines (the lint checked their form) are blanked before both."""
    problem = raw_text_problem(body)
    if problem:
        return problem
    text = "\n".join("" if PRAGMA_UNROLL.fullmatch(line) else line for line in body.split("\n"))
    nonce = secrets.token_hex(8)
    sentinel = f"fa_region_end_{nonce}"
    probe = text + f"\n{sentinel} __LINE__ __FILE__\n"
    gxx = ["g++", "-x", "c++", "-std=c++17", "-nostdinc", "-undef"]
    tmp = os.path.join(work, "tmp")

    def run(cmd, stdin):
        """(exit status 0 and nothing on stderr, stdout, stderr) of g++ on `stdin`."""
        try:
            done = subprocess.run(cmd, input=stdin, capture_output=True, text=True, errors="replace", timeout=30, env=box.env(tmp),
                                  cwd=work, preexec_fn=box.enter, start_new_session=True)
        except subprocess.TimeoutExpired:
            return False, "", "<stdin>:1: the compiler ran past 30 s on it"
        return done.returncode == 0 and not done.stderr.strip(), done.stdout, done.stderr

    ok_tokens, tokens, err_tokens = run(gxx + ["-E", "-P", "-fpreprocessed", "-w", "-"], probe)
    ok_full, full, err_full = run(gxx + ["-E", "-P", "-"], probe)
    if not ok_tokens or not ok_full:
        said = first_diagnostic(err_tokens if not ok_tokens else err_full)
        if said == "no message":  # what it said is about another file: the region included one
            return ("as the compiler reads it, the region holds a preprocessor directive, a macro, a line splice or a "
                    "#line: regions may hold code only (#pragma unroll is allowed)")
        return "the compiler's preprocessor refuses the region: " + said
    line = probe.count("\n")
    head_tokens, _, _ = tokens.partition(sentinel)
    head_full, _, tail_full = full.partition(sentinel)
    ok_macros, macros, _ = run(gxx + ["-E", "-dM", "-"], probe)
    if (head_tokens != head_full or tail_full.split() != [str(line), '"<stdin>"'] or not ok_macros
            or any(out_line.lstrip().startswith("#") for out_line in head_full.splitlines())
            or sorted(macros.splitlines()) != predefined_macros(box, work)):
        return ("as the compiler reads it, the region holds a preprocessor directive, a macro, a line splice or a "
                "#line: regions may hold code only (#pragma unroll is allowed)")
    # The compiler's own tokens: -fdebug-cpp writes a marker before each one. A region whose text
    # holds "{P:" could forge a marker inside a literal, so it is refused.
    if "{P:" in text:
        return "the text '{P:' is not allowed in an exercise region"
    ok, marked, err = run(gxx + ["-E", "-P", "-fpreprocessed", "-fdebug-cpp", "-"], text)
    if not ok:
        return "the compiler's preprocessor refuses the region: " + first_diagnostic(err)
    marks = list(DEBUG_MARK.finditer(marked))
    stack = []
    for m, after in zip(marks, marks[1:] + [None]):
        token = marked[m.end():after.start() if after else len(marked)].strip()
        kind = BRACKETS.get(token)
        if kind is None:
            continue
        if kind in "([{":
            stack.append((kind, m.group(1)))
        elif not stack or {"(": ")", "[": "]", "{": "}"}[stack.pop()[0]] != kind:
            return (f"line {m.group(1)} of your region: an unmatched '{token}' as the compiler reads it: a region may "
                    "not close the function or block it sits in")
    if stack:
        return (f"line {stack[-1][1]} of your region: a '{stack[-1][0]}' the region does not close, as the compiler reads "
                "it: its braces, parentheses and brackets must pair up inside it")
    return ""


# The marker g++ -E -fdebug-cpp writes before each token (its line L and column C in the input).
DEBUG_MARK = re.compile(r"\{P:<stdin>;F:[^;{}]*;L:(\d+);C:(\d+);S:\d+;M:[^;{}]*;E:\d+,LOC:\d+,R:\d+\}")
BRACKETS = {"(": "(", "[": "[", "<:": "[", "{": "{", "<%": "{", ")": ")", "]": "]", ":>": "]", "}": "}", "%>": "}"}


PREDEFINED = {}


def predefined_macros(box, work):
    """g++'s -dM listing for an empty input (with -undef: the macros no header defined)."""
    if "macros" not in PREDEFINED:
        done = subprocess.run(["g++", "-x", "c++", "-std=c++17", "-nostdinc", "-undef", "-E", "-dM", "-"], input="",
                              capture_output=True, text=True, errors="replace", timeout=30, env=box.env(os.path.join(work, "tmp")),
                              cwd=work, preexec_fn=box.enter)
        PREDEFINED["macros"] = sorted(done.stdout.splitlines())
    return PREDEFINED["macros"]


def first_diagnostic(out, offset=0):
    """The compiler's first error or warning on a region fed on stdin, its line counted within the
    region (`offset` lines of a frame come before the region's first)."""
    for line in out.splitlines():
        m = re.match(r"<stdin>:(\d+):(?:\d+:)?\s*(.*)", line)
        if m:
            return f"line {max(1, int(m.group(1)) - offset)} of your region: {m.group(2)[:200]}"
    return "no message"


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


NOT_HERE = "needs an NVIDIA GPU; grade it with classroom/grade_batch.py on a GPU machine"


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


# A handout (classroom/handout.py leaves classroom/instructor/ out) grades its own copy as a
# self-check: the exercises whose expected answers come from the solution, and the speed parts,
# are not checked there.
STUDENT_COPY = not os.path.isdir(os.path.join(ROOT, "classroom", "instructor"))


def grade(submission, build_dir, config, cpu_only=False, timeout=120, cmake_args="", seed=None, log=print,
          private=(), sandbox_ids=SANDBOX_IDS):
    """(results.json's dict, the reason a submission was refused or None). As root, the student's
    code is built and run by a sandbox user of this grading's own, which can read neither the
    instructor's tree nor any folder of `private` (each is made so, and checked)."""
    exercises = handout.load_config(config)
    check_graded(exercises)
    box = claim_sandbox(sandbox_ids)
    try:
        if box.active:
            log(f"grade: the student's code is built and run as uid {box.uid}, which cannot read the instructor's tree")
            box.protect([ROOT] + [os.path.abspath(p) for p in private], log)
        else:
            log("grade: not run as root, so the sandbox is not in effect: the student's code is built and run as this "
                "user and can read whatever this user can (a self-check; grade submissions as root)")
        return grade_in_sandbox(exercises, submission, build_dir, cpu_only, timeout, cmake_args, seed, log, box)
    finally:
        box.close()


def check_graded(exercises):
    """Refuses (one line) an exercise the grader has no runner for: a CPU exercise whose chapter
    has no tasks file for the CPU runner."""
    for ex in exercises:
        tasks = os.path.join("classroom", "grader", cpu_tasks(ex["chapter"]))
        if ex["device"] == "cpu" and not os.path.isfile(os.path.join(ROOT, tasks)):
            raise handout.HandoutError(f"exercise '{ex['id']}' is a CPU exercise of chapter {ex['chapter']:02d}, which "
                                       f"has no {tasks} (the CPU runner's tasks of that chapter)")


def every_exercise(exercises):
    """The tree's exercises (classroom/exercises.json) and any other of `exercises`: the student's
    tree is made with every one of them stubbed, whichever are graded."""
    every = handout.catalog(ROOT)
    ids = {ex["id"] for ex in every}
    return every + [ex for ex in exercises if ex["id"] not in ids]


def grade_in_sandbox(exercises, submission, build_dir, cpu_only, timeout, cmake_args, seed, log, box):
    """grade() once this grading's sandbox user is claimed. Folders: `work` (the grader's alone:
    the checker, the reference build) and `sandbox` (open to the sandbox's user alone: the
    student's tree made from the handout, their runners' build)."""
    work = tempfile.mkdtemp(prefix="fa_grade_")
    sandbox = tempfile.mkdtemp(prefix="fa_sandbox_")
    box.record(work)
    box.record(sandbox)
    if box.active:
        os.chown(sandbox, 0, box.uid)
        os.chmod(sandbox, 0o750)
    has_gpu = not cpu_only and gpu_available()
    try:
        try:
            student_files = locate(submission or ROOT, ROOT, box)
        except SubmissionError as e:
            return results_json(exercises, refused_outcomes(exercises, has_gpu, str(e))), str(e)
        return grade_files(exercises, student_files, work, sandbox, has_gpu, build_dir, timeout, cmake_args, seed, log,
                           box)
    finally:
        box.kill_all()
        for ref_box in REFERENCE_BOXES:
            ref_box.close()
        REFERENCE_BOXES.clear()
        for folder in UNPACKED + REFERENCE_FOLDERS + [work, sandbox]:
            remove_tree(folder)
        UNPACKED.clear()
        REFERENCE_FOLDERS.clear()


def open_tree(path):
    """Folders 0755 and files 0644 (0755 when executable) under `path`: the student's tree is
    read by the sandbox's user, whatever modes the instructor's files had."""
    for base, dirs, names in os.walk(path):
        os.chmod(base, 0o755)
        for name in names:
            full = os.path.join(base, name)
            if not os.path.islink(full):
                os.chmod(full, 0o755 if os.stat(full).st_mode & 0o100 else 0o644)


def sandbox_folder(box, parent, name):
    """A new folder under `parent` that the sandbox's user writes in (its build), with a tmp/ in it."""
    path = os.path.join(parent, name)
    os.makedirs(os.path.join(path, "tmp"))
    for p in (path, os.path.join(path, "tmp")):
        box.own(p)
    return path


def runner_file(path):
    """`path` when it is a regular file (not a link the build could have left), else None."""
    import stat as st_mod
    try:
        return path if st_mod.S_ISREG(os.lstat(path).st_mode) else None
    except OSError:
        return None


def grade_files(exercises, student_files, work, sandbox, has_gpu, build_dir, timeout, cmake_args, seed, log, box):
    """grade() once the submission's files are found."""
    outcomes = {}
    log("grade: the submission's " + ", ".join(sorted(student_files)))
    tree = os.path.join(sandbox, "tree")
    check_dir = sandbox_folder(box, sandbox, "check")
    # Every exercise of the tree is stubbed (and the student's bodies taken for it), so the
    # build sees no solution; only `exercises` are graded.
    problems, taken = splice(ROOT, tree, student_files, every_exercise(exercises),
                             check=lambda body: compiler_view(body, box, check_dir))
    open_tree(tree)
    files_of = exercise_files(ROOT)
    broken = {}
    for ex_id, why in problems.items():
        broken[ex_id] = ["this exercise was graded as the handout's stub:"] + why
        for rel, held in files_of.items():
            if ex_id in held:
                restub(tree, rel, [ex_id])
    checker = build_checker(work)
    known = checker_exercises(checker)
    unknown = [ex["id"] for ex in exercises if ex["id"] not in known]
    if unknown:
        raise handout.HandoutError(f"the checker has no cases for exercise '{unknown[0]}'; register them with "
                                   "FA_EXERCISE_CASES in classroom/grader/cases/chNN.cpp (known: "
                                   f"{', '.join(known)})")
    runners, build_errors, reference_runners = {}, {}, {}
    reference_uid = None
    # Runners only for chapters with an exercise the submission holds code for.
    wanted = [ex for ex in exercises if ex["id"] in taken and ex["id"] not in broken]
    cpu_chapters = sorted({ex["chapter"] for ex in wanted if ex["device"] == "cpu"})
    cpu_build = sandbox_folder(box, sandbox, "cpu")
    for chapter in cpu_chapters:
        exe, build = cpu_runner_builder(tree, chapter, cpu_build, box)
        log(f"grade: building chapter {chapter:02d}'s CPU runner")
        error = build_until_clean(build, tree, files_of, broken, f"chapter {chapter:02d}'s CPU runner", log, cpu_build)
        if error:
            build_errors[("cpu", chapter)] = error
        else:
            runners[("cpu", chapter)] = exe
    gpu_chapters = sorted({ex["chapter"] for ex in wanted if ex["device"] == "gpu"})
    if has_gpu and gpu_chapters:
        gpu_build = sandbox_folder(box, sandbox, "gpu")
        log(f"grade: building the GPU runners of chapters {', '.join(f'{c:02d}' for c in gpu_chapters)} in {gpu_build}")
        error = build_until_clean(gpu_runner_builder(tree, gpu_build, gpu_chapters, cmake_args, box,
                                                     os.path.join(gpu_build, "tmp")), tree, files_of, broken,
                                  "the GPU runners", log, gpu_build)
        for chapter in gpu_chapters:
            if error:
                build_errors[("gpu", chapter)] = error
            else:
                runners[("gpu", chapter)] = os.path.join(gpu_build, "bin", f"fa_runner_ch{chapter:02d}")
        # The speed parts compare with the instructor's own kernels, built from this tree by the
        # grader's user (kept between gradings in --build-dir's .reference: it does not change),
        # run from a folder of the sandbox as files the sandbox's user may run but not read.
        timed = sorted({ex["chapter"] for ex in wanted if ex["device"] == "gpu" and ex.get("timed")})
        if STUDENT_COPY:
            timed = []  # no reference solution to time against
        if timed:
            ref_build = (os.path.abspath(build_dir).rstrip("/") + ".reference" if build_dir
                         else os.path.join(work, "reference"))
            os.makedirs(ref_build, mode=0o700, exist_ok=True)
            os.chmod(ref_build, 0o700)
            log(f"grade: building the reference runners of chapters {', '.join(f'{c:02d}' for c in timed)} in {ref_build}")
            ok, out = gpu_runner_builder(ROOT, ref_build, timed, cmake_args)()
            if not ok:
                raise RuntimeError("the reference runners do not build (an instructor's tree problem):\n" + out[-3000:])
            # As root the reference runs as a second user of this grading's, from a folder only
            # that user's group may enter: the student's runners (the first user) can neither
            # read nor run it, so they cannot hand its answers or its speed on as their own.
            shown = tempfile.mkdtemp(prefix="fa_reference_")
            box.record(shown)
            REFERENCE_FOLDERS.append(shown)
            ref_box = claim_sandbox() if box.active else Sandbox()
            REFERENCE_BOXES.append(ref_box)
            if ref_box.active:
                os.chown(shown, 0, ref_box.uid)
            os.chmod(shown, 0o750 if ref_box.active else 0o700)
            for chapter in timed:
                exe = os.path.join(shown, f"reference_gpu_ch{chapter:02d}")
                shutil.copyfile(os.path.join(ref_build, "bin", f"fa_runner_ch{chapter:02d}"), exe)
                if ref_box.active:
                    os.chown(exe, 0, ref_box.uid)
                os.chmod(exe, 0o750 if ref_box.active else 0o700)
                reference_runners[chapter] = exe
            if ref_box.active:
                reference_uid = ref_box.uid
    # The sandbox's user wrote its builds; from here on it owns nothing the grader uses.
    for folder in (check_dir, cpu_build) + ((gpu_build,) if has_gpu and gpu_chapters else ()):
        box.take_back(folder)
    runners = {key: exe for key, exe in runners.items() if runner_file(exe)}
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
        if ex["device"] == "cpu":
            cmd += ["--memory-mb", str(CPU_RUNNER_MEMORY_MB)]
        if box.active:
            cmd += ["--uid", str(box.uid)]
        if ex["device"] == "gpu" and ex["chapter"] in reference_runners:
            cmd += ["--reference-runner", reference_runners[ex["chapter"]]]
            if reference_uid is not None:
                cmd += ["--reference-uid", str(reference_uid)]
        if STUDENT_COPY:
            cmd.append("--student-copy")
        turn = gpu_turn(log=log) if ex["device"] == "gpu" else None
        try:
            # The seed goes in the environment: other users can read a command line, not that.
            done = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=dict(os.environ, FA_CHECK_SEED=str(run_seed)))
        finally:
            if turn is not None:
                os.close(turn)
        try:
            verdict = json.loads(done.stdout)
        except json.JSONDecodeError:
            log(f"grade: the checker failed on {ex['id']} (status {done.returncode}):\n" + done.stderr[-3000:])
            outcomes[ex["id"]] = ("graded", 0, ["the grader's checker failed on this exercise (not a verdict on your "
                                                "code); the grader's own log has its message (ask the instructor)"])
            continue
        value, lines = score_verdict(ex, verdict)
        outcomes[ex["id"]] = ("graded", value, lines)
    return results_json(exercises, outcomes), None


def cmake_args_joined(argv):
    """argv with `--cmake-args VALUE` written as `--cmake-args=VALUE`: the value starts with '-'
    ("-DFA_CUDA_ARCHITECTURES=90"), which argparse would take for an option."""
    out = list(argv)
    for i in range(len(out) - 1):
        if out[i] == "--cmake-args":
            out[i:i + 2] = ["--cmake-args=" + out[i + 1]]
            break
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--submission", help="the student's tree, a zip of it, or the files they edited")
    parser.add_argument("--build-dir", default=None,
                        help="the reference runners (GPU speed parts) are built and kept in BUILD_DIR.reference "
                             "(default: a new folder, removed after)")
    parser.add_argument("--private", action="append", default=[],
                        help="a folder the sandbox's user must not read (made so as root); may be repeated")
    parser.add_argument("--out", default="results.json")
    parser.add_argument("--config", default=os.path.join(ROOT, "classroom", "exercises.json"),
                        help="the exercises to grade: classroom/exercises.json (the default) or an assignment "
                             "listing some of its ids, e.g. one week's")
    parser.add_argument("--cpu-only", action="store_true", help="grade the CPU exercises only, even with a GPU")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per runner process (default 120)")
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cmake-args", default=os.environ.get("CMAKE_ARGS", ""),
                        help='passed to CMake for the GPU runners, e.g. --cmake-args="-DFA_CUDA_ARCHITECTURES=90"')
    args = parser.parse_args(cmake_args_joined(sys.argv[1:]))
    if args.timeout < 1:
        print(f"grade: error: --timeout must be at least 1, got {args.timeout}", file=sys.stderr)
        return 1
    start = time.time()
    # A stop (grade_batch.py's time limit sends SIGTERM first) ends the grading through its
    # cleanup: the sandbox user's processes killed, its folders removed.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(f"grade: stopped by signal {signum}"))
    try:
        results, refused = grade(args.submission, args.build_dir, args.config, args.cpu_only, args.timeout,
                                 args.cmake_args, args.seed, private=args.private)
    except (handout.HandoutError, SandboxError) as e:
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
