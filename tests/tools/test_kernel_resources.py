#!/usr/bin/env python3
"""tools/kernel_resources.py against planted regressions: a small kernel compiled by nvcc the way
the build compiles the chapters (ptxas -v kept by tools/ptxas_report.sh, nvcc --keep), its
budget written, then the same kernel with more code, with spills, and renamed. Each must fail
the check with its reason; the kernel as budgeted must pass.

  test_kernel_resources.py NVCC
"""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "kernel_resources.py")
LAUNCHER = os.path.join(ROOT, "tools", "ptxas_report.sh")

KERNEL = r"""
// A row of scores masked by a run [0, end), as the chapters' tiles are; PLANT_RULE adds a second
// rule per score (a window's left edge), as a kernel that evaluates a later chapter's mask would.
template <int N>
__global__ void mask_row(float* s, int end, int left) {
  float x[N];
#pragma unroll
  for (int i = 0; i < N; ++i) x[i] = s[threadIdx.x * N + i];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    bool hidden = i >= end;
#ifdef PLANT_RULE
    hidden = hidden || (left >= 0 && i < end - left) || (left > 3 && i * i > end * left);
    if (!hidden) x[i] = x[i] * 0.5f + __expf(x[i] - float(left));
#endif
    if (hidden) x[i] = -1e30f;
  }
  float m = x[0];
#pragma unroll
  for (int i = 1; i < N; ++i) m = fmaxf(m, x[i]);
#pragma unroll
  for (int i = 0; i < N; ++i) s[threadIdx.x * N + i] = __expf(x[i] - m);
}
#ifdef PLANT_NAME
template __global__ void mask_row<48>(float*, int, int);
#else
template __global__ void mask_row<64>(float*, int, int);
#endif
"""


def build(nvcc, where, *flags):
    """Compiles KERNEL into where/kernel_resources/t/ as the build does; returns `where`."""
    keep = os.path.join(where, "kernel_resources", "t")
    os.makedirs(keep)
    source = os.path.join(where, "k.cu")
    open(source, "w").write(KERNEL)
    cmd = ["bash", LAUNCHER, keep, nvcc, "-x", "cu", "-c", source, "-o", os.path.join(where, "k.o"),
           "-gencode", "arch=compute_80,code=sm_80", "-Xptxas=-v", "--keep", f"--keep-dir={keep}", *flags]
    subprocess.run(cmd, check=True)
    return where


def run(*args):
    r = subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def main():
    nvcc = sys.argv[1] if len(sys.argv) > 1 else "nvcc"
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        base = build(nvcc, os.path.join(tmp, "base"))
        budget = os.path.join(tmp, "budget.csv")
        code, out = run("update", base, budget)
        if code != 0:
            failures.append(f"update failed: {out}")
        code, out = run("check", base, budget)
        if code != 0:
            failures.append(f"the budgeted kernel fails its own budget: {out}")
        planted = {
            "a second mask rule": (build(nvcc, os.path.join(tmp, "rule"), "-DPLANT_RULE"), ("SASS", "registers")),
            "spills": (build(nvcc, os.path.join(tmp, "spill"), "-maxrregcount=24"), ("spill stores",)),
            "a new kernel": (build(nvcc, os.path.join(tmp, "name"), "-DPLANT_NAME"), ("not in the budget",)),
        }
        for what, (tree, reasons) in planted.items():
            code, out = run("check", tree, budget)
            if code != 1 or not any(r in out for r in reasons):
                failures.append(f"{what}: expected exit 1 naming one of {reasons}, got {code}:\n{out}")
            else:
                print(f"planted {what}: caught ({out.splitlines()[1].strip()})")
        code, out = run("check", os.path.join(tmp, "name"), budget)
        if "in the budget but not built" not in out:
            failures.append(f"a kernel gone from the build is not named:\n{out}")
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
