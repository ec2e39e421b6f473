#!/usr/bin/env python3
"""Every chapter kernel's resources, held against a committed budget (no GPU needed).

The build (FA_KERNEL_RESOURCES, on by default) keeps, for each kernel file and architecture,
what ptxas -v reports (registers, spill stores and loads, stack frame, shared memory) and the
cubins and PTX nvcc --keep leaves: build/kernel_resources/<target>/. From those this script
reads, per (architecture, kernel):

  registers, spill_stores, spill_loads (bytes), stack (bytes), smem (static shared bytes),
  sass (instructions of the kernel's code in the cubin: 16 bytes each), ptx (instructions).

  kernel_resources.py report BUILD              the table
  kernel_resources.py check BUILD BUDGET        fails (exit 1) on a regression against BUDGET
  kernel_resources.py update BUILD BUDGET       rewrites BUDGET from BUILD (a change made on purpose)
  kernel_resources.py compare BUILD_A BUILD_B   per kernel, B against A (two trees, same flags)

A regression is: a kernel that spills more than its budget, needs more static shared memory or a
larger stack, gains registers past an occupancy step (fewer warps per SM fit the register file:
65536 registers, allocated per warp in steps of 8 per thread), or grows its SASS by more than
10%; a kernel missing from the budget, or a budgeted one that is gone. Architectures the build
has no budget for are named and not checked; a build with none of them exits 77 (skipped).
"""
import csv
import glob
import os
import re
import struct
import sys

FIELDS = ["arch", "kernel", "registers", "spill_stores", "spill_loads", "stack", "smem", "sass", "ptx"]
SASS_GROWTH = 0.10  # allowed growth of a kernel's SASS instruction count
SKIPPED = 77        # CTest's SKIP_RETURN_CODE


def warps_per_sm(registers):
    """Warps of this kernel the 64K-register file holds (per-warp allocation, 8 registers a step)."""
    per_thread = max(8, (registers + 7) // 8 * 8)
    return min(64, 65536 // (per_thread * 32))


ANONYMOUS = re.compile(r"(\d+)(_GLOBAL__N_)")
ANONYMOUS_FILE = re.compile(r"_GLOBAL__N__[0-9a-f]+_\d+_(\w+?)_[0-9a-f]{8}(?:_\d+)?$")


def stable_name(kernel):
    """A kernel's mangled name without the hashes nvcc gives an anonymous namespace, which change
    with the path of the build: the namespace (its length first, as mangling writes it)
    _GLOBAL__N__bba5ec6d_16_decode_runner_cu_f8c9a700 becomes _GLOBAL__N_decode_runner_cu. The
    length's digits may follow a name's own digits (flash2 then 65): the split is the one whose
    namespace has the form above."""
    out, at = [], 0
    for m in ANONYMOUS.finditer(kernel):
        if m.start() < at:
            continue
        digits = m.group(1)
        for k in range(len(digits)):
            n = int(digits[k:])
            f = ANONYMOUS_FILE.match(kernel[m.start(2):m.start(2) + n])
            if f:
                new = "_GLOBAL__N_" + f.group(1)
                out.append(kernel[at:m.start() + k] + str(len(new)) + new)
                at = m.start(2) + n
                break
    return "".join(out) + kernel[at:]


def parse_ptxas(text):
    """{(arch, kernel): {...}} from a ptxas -v report."""
    out, current = {}, None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '([^']+)' for '(sm_\w+)'", line)
        if m:
            current = (m.group(2), stable_name(m.group(1)))
            out[current] = {"registers": 0, "spill_stores": 0, "spill_loads": 0, "stack": 0, "smem": 0}
            continue
        if current is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            out[current].update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            out[current]["registers"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            out[current]["smem"] = int(s.group(1)) if s else 0
            current = None  # the entry's last line
    return out


def file_arch(path, archs):
    """The architecture a kept cubin or PTX file is for: named in it (x.compute_90.sm_90.cubin,
    x.compute_80.cubin, x.compute_90a.ptx), or, in a single-architecture build (x.sm_90.cubin,
    x.cubin, x.ptx), the one architecture its object's ptxas report names (`archs`)."""
    name = os.path.basename(path)
    m = re.search(r"\.(sm_\w+)\.cubin$", name) or re.search(r"\.compute_(\w+)\.(?:cubin|ptx)$", name)
    if m:
        arch = m.group(1)
        return arch if arch.startswith("sm_") else "sm_" + arch
    return next(iter(archs)) if len(archs) == 1 else None


def base_name(path):
    """flash_attention_v2 for flash_attention_v2.compute_90.sm_90.cubin, .ptx, .cu.o.ptxas."""
    return os.path.basename(path).split(".")[0]


def cubin_text_sizes(path):
    """{kernel: instructions} from the .text.<kernel> sections of a cubin (an ELF64 file)."""
    data = open(path, "rb").read()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        return {}
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    sections = []
    for i in range(shnum):
        name, _type, _flags, _addr, offset, size = struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
        sections.append((name, offset, size))
    strtab_offset = sections[shstrndx][1]
    sizes = {}
    for name_offset, _, size in sections:
        end = data.index(b"\0", strtab_offset + name_offset)
        name = data[strtab_offset + name_offset:end].decode()
        if name.startswith(".text."):
            sizes[stable_name(name[len(".text."):])] = size // 16  # one SASS instruction is 128 bits from sm_70 on
    return sizes


def ptx_instruction_counts(path):
    """{kernel: instructions} of each .entry in a PTX file (lines ending in ';' that are not directives)."""
    counts, current, depth = {}, None, 0
    for raw in open(path, errors="replace"):
        line = raw.split("//")[0].strip()
        m = re.match(r"(?:\.visible\s+|\.weak\s+)*\.entry\s+([\w$]+)", line)
        if m:
            current, depth = stable_name(m.group(1)), 0
            counts[current] = 0
            continue
        if current is None:
            continue
        depth += line.count("{") - line.count("}")
        if line.endswith(";") and not line.startswith(".") and depth > 0:
            counts[current] += 1
        if depth <= 0 and "}" in line:
            current = None
    return counts


def collect(build):
    """{(arch, kernel): row} for every kernel the build kept resources of."""
    root = os.path.join(build, "kernel_resources")
    if not os.path.isdir(root):
        sys.exit(f"kernel_resources: {root} does not exist: configure with -DFA_KERNEL_RESOURCES=ON and build")
    rows, archs_of = {}, {}
    for log in sorted(glob.glob(os.path.join(root, "*", "*.ptxas"))):
        key_of_base = (os.path.dirname(log), base_name(log))
        for key, values in parse_ptxas(open(log, errors="replace").read()).items():
            rows[key] = dict(values, arch=key[0], kernel=key[1], sass=0, ptx=0)
            archs_of.setdefault(key_of_base, set()).add(key[0])
    for path in glob.glob(os.path.join(root, "*", "*.cubin")) + glob.glob(os.path.join(root, "*", "*.ptx")):
        arch = file_arch(path, archs_of.get((os.path.dirname(path), base_name(path)), set()))
        counts = cubin_text_sizes(path) if path.endswith(".cubin") else ptx_instruction_counts(path)
        field = "sass" if path.endswith(".cubin") else "ptx"
        for kernel, n in counts.items():
            if (arch, kernel) in rows:  # the PTX of compute_90 feeds sm_90, that of compute_90a sm_90a
                rows[(arch, kernel)][field] = n
    return rows


def read_budget(path):
    rows = {}
    for r in csv.DictReader(open(path, newline="")):
        rows[(r["arch"], r["kernel"])] = {k: (r[k] if k in ("arch", "kernel") else int(r[k])) for k in FIELDS}
    return rows


def write_rows(path, rows):
    with open(path, "w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=FIELDS, lineterminator="\n")
        out.writeheader()
        for key in sorted(rows):
            out.writerow({k: rows[key][k] for k in FIELDS})


def regressions(have, budget):
    """The reasons `have` (one kernel now) fails `budget` (its row), as sentences."""
    why = []
    for field, label in (("spill_stores", "spill stores"), ("spill_loads", "spill loads"), ("stack", "stack frame"),
                         ("smem", "static shared memory")):
        if have[field] > budget[field]:
            why.append(f"{label} {budget[field]} -> {have[field]} bytes")
    if warps_per_sm(have["registers"]) < warps_per_sm(budget["registers"]):
        why.append(f"registers {budget['registers']} -> {have['registers']} "
                   f"({warps_per_sm(budget['registers'])} -> {warps_per_sm(have['registers'])} warps per SM)")
    if have["sass"] > budget["sass"] * (1 + SASS_GROWTH):
        why.append(f"SASS {budget['sass']} -> {have['sass']} instructions "
                   f"(+{100.0 * (have['sass'] / max(1, budget['sass']) - 1):.0f}%, at most +{100 * SASS_GROWTH:.0f}%)")
    return why


def check(build, budget_path):
    have, budget = collect(build), read_budget(budget_path)
    built_archs = {arch for arch, _ in have}
    budget_archs = {arch for arch, _ in budget}
    checked = sorted(built_archs & budget_archs)
    for arch in sorted(built_archs - budget_archs):
        print(f"kernel_resources: no budget for {arch}: not checked")
    if not checked:
        print("kernel_resources: the build has no architecture the budget covers: nothing checked")
        return SKIPPED
    failures = []
    for key in sorted(k for k in have if k[0] in checked):
        if key not in budget:
            failures.append(f"{key[0]} {key[1]}: not in the budget (a new kernel)")
            continue
        for reason in regressions(have[key], budget[key]):
            failures.append(f"{key[0]} {key[1]}: {reason}")
    for key in sorted(k for k in budget if k[0] in checked and k not in have):
        failures.append(f"{key[0]} {key[1]}: in the budget but not built")
    n = sum(1 for k in have if k[0] in checked)
    if failures:
        print(f"kernel_resources: {len(failures)} regressions in {n} kernels ({', '.join(checked)}):")
        for line in failures:
            print("  " + line)
        print(f"A change made on purpose: python3 tools/kernel_resources.py update {build} {budget_path}")
        return 1
    print(f"kernel_resources: {n} kernels ({', '.join(checked)}) within the budget {budget_path}")
    return 0


def report(build):
    rows = collect(build)
    print(",".join(FIELDS))
    for key in sorted(rows):
        print(",".join(str(rows[key][k]) for k in FIELDS))
    return 0


def compare(build_a, build_b):
    """Per kernel in both builds: registers, spills, SASS and PTX of B against A."""
    a, b = collect(build_a), collect(build_b)
    print("arch,kernel,registers_a,registers_b,spills_a,spills_b,sass_a,sass_b,sass_ratio,ptx_a,ptx_b,ptx_ratio")
    for key in sorted(set(a) & set(b)):
        x, y = a[key], b[key]
        print(f"{key[0]},{key[1]},{x['registers']},{y['registers']},{x['spill_stores'] + x['spill_loads']},"
              f"{y['spill_stores'] + y['spill_loads']},{x['sass']},{y['sass']},{y['sass'] / max(1, x['sass']):.3f},"
              f"{x['ptx']},{y['ptx']},{y['ptx'] / max(1, x['ptx']):.3f}")
    return 0


def main(argv):
    if len(argv) >= 2 and argv[0] == "report":
        return report(argv[1])
    if len(argv) == 3 and argv[0] == "check":
        return check(argv[1], argv[2])
    if len(argv) == 3 and argv[0] == "update":
        rows = collect(argv[1])
        # Keep the budget's rows of architectures this build does not have.
        if os.path.exists(argv[2]):
            built = {arch for arch, _ in rows}
            for key, row in read_budget(argv[2]).items():
                if key[0] not in built:
                    rows[key] = row
        write_rows(argv[2], rows)
        print(f"kernel_resources: wrote {len(rows)} kernels to {argv[2]}")
        return 0
    if len(argv) == 3 and argv[0] == "compare":
        return compare(argv[1], argv[2])
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
