"""`pip install ./python` from the source tree: builds libfa_kernels.so with CMake and installs it
inside the package, as a platform wheel, with libfa_torch.so (attention()'s eager operator in
C++) when CMake finds torch through python3.

Where the library comes from, in order:
  1. attention_kernels/libfa_kernels.so already next to the package (the build folder's copy that
     `make build` makes in build/python): installed as it is.
  2. Otherwise the source tree above this folder is configured and built, target fa_python (the
     two libraries), in FA_BUILD_DIR (default: the tree's build/, so a `make build` done before is
     reused);
     FA_CUDA_ARCHITECTURES (e.g. 90 for an H100 alone) and CMAKE_ARGS are passed to CMake, and
     FA_BUILD_JOBS sets the parallel jobs (default: every core).
The build needs CMake and nvcc on PATH; on a machine without internet, add --no-build-isolation.
"""
import os
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent
PACKAGE = HERE / "attention_kernels"
LIBRARY = "libfa_kernels.so"
TORCH_LIBRARY = "libfa_torch.so"


def built_library():
    """The path of libfa_kernels.so: next to the package, or built from the source tree."""
    beside = PACKAGE / LIBRARY
    if beside.is_file():
        return beside
    root = HERE.parent
    if not (root / "CMakeLists.txt").is_file() or not (root / "common" / "c_api.h").is_file():
        raise RuntimeError(f"{LIBRARY} is not in {PACKAGE} and {root} is not the tutorial's source tree; "
                           "run `make build` and install build/python, or install from a clone")
    for tool in ("cmake", "nvcc"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"building {LIBRARY} needs {tool} on PATH (the CUDA Toolkit and CMake >= 3.24)")
    build = Path(os.environ.get("FA_BUILD_DIR") or root / "build").resolve()
    configure = ["cmake", "-S", str(root), "-B", str(build)]  # Release unless the folder says otherwise
    if os.environ.get("FA_CUDA_ARCHITECTURES"):
        configure.append(f"-DFA_CUDA_ARCHITECTURES={os.environ['FA_CUDA_ARCHITECTURES']}")
    configure += os.environ.get("CMAKE_ARGS", "").split()
    jobs = os.environ.get("FA_BUILD_JOBS") or str(os.cpu_count() or 1)
    subprocess.run(configure, check=True)
    # fa_python: libfa_kernels.so, and libfa_torch.so when CMake found torch
    subprocess.run(["cmake", "--build", str(build), "--target", "fa_python", "-j", jobs], check=True)
    library = build / "lib" / LIBRARY
    if not library.is_file():
        raise RuntimeError(f"the build finished without {library}")
    return library


class BuildWithLibrary(build_py):
    """Copies the package, then libfa_kernels.so into it, and libfa_torch.so (attention()'s
    eager operator in C++) when it was built beside it."""

    def run(self):
        super().run()
        source = built_library()
        for name in (LIBRARY, TORCH_LIBRARY):
            found = source.with_name(name)
            target = Path(self.build_lib) / "attention_kernels" / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if found.is_file() and found.resolve() != target.resolve():
                shutil.copy2(found, target)


class PlatformDistribution(Distribution):
    """The wheel holds a shared library, so it is tagged for this platform, not 'any'."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithLibrary}, distclass=PlatformDistribution)
