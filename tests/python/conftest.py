"""pytest: the package from the build folder (CTest sets PYTHONPATH), and one line naming why a
module's tests are skipped when torch or a GPU is missing."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def pytest_report_header(config):
    from attention_reference import SEED

    return f"input seed: {SEED} (FA_TEST_SEED={SEED} repeats this run's inputs)"
