"""CTest's entry to the pytest suite: runs the named test files and exits 77 (CTest's "skipped")
with the reason when nothing ran because pytest, torch or a GPU is missing."""
import sys
from pathlib import Path

SKIP = 77


def skip(reason):
    print(f"SKIPPED: {reason}")
    sys.exit(SKIP)


def main(files):
    try:
        import pytest
    except ImportError:
        skip(f"pytest is not installed for {sys.executable} (pip install pytest)")
    try:
        import torch
    except ImportError:
        skip(f"torch is not installed for {sys.executable}; the tests on tensors need PyTorch with CUDA")

    class Outcomes:
        def __init__(self):
            self.ran = 0
            self.skips = set()

        def pytest_runtest_logreport(self, report):
            if report.when == "call" and not report.skipped:
                self.ran += 1
            if report.skipped and isinstance(report.longrepr, tuple):
                self.skips.add(report.longrepr[2])

        def pytest_collectreport(self, report):
            # A module that skips itself (no CUDA device) is skipped at collection.
            if report.skipped and isinstance(report.longrepr, tuple):
                self.skips.add(report.longrepr[2])

    here = Path(__file__).resolve().parent
    outcomes = Outcomes()
    status = pytest.main(["-q", "-rfE", "-p", "no:cacheprovider", *[str(here / f) for f in files]], plugins=[outcomes])
    # Exit status 5: nothing was collected, which is what a module skipped at collection leaves.
    if status in (0, 5) and outcomes.ran == 0:
        skip("; ".join(sorted(outcomes.skips)) or "no test ran")
    sys.exit(int(status))


if __name__ == "__main__":
    main(sys.argv[1:])
