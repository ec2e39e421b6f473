#!/usr/bin/env bash
# Installs what the build needs, and only what is missing.
#
# Checked: a C++17 compiler, CMake >= 3.25, the CUDA toolkit (nvcc), Eigen 3, GoogleTest, python3;
# with --docs (make docs) also doxygen and libjs-mathjax; with --format (tools/format.sh, CI's
# format check) also Debian's clang-format (14 on bookworm, the version .clang-format is tuned
# to). The build itself needs neither; the flags combine. NCCL (chapter 10's program) comes
# from PyPI, the nvidia-nccl-cuNN wheel, when neither python3 nor the system has it.
# Missing Debian packages are installed with apt-get when we are root; otherwise the exact
# command is printed and the script exits non-zero. The CUDA toolkit is not a Debian package we
# install: if nvcc is missing we say where to get it and stop.
set -euo pipefail

missing=()
have_header() { [ -f "$1" ]; }

command -v g++ >/dev/null 2>&1 || missing+=(g++)
command -v make >/dev/null 2>&1 || missing+=(make)
if ! command -v cmake >/dev/null 2>&1; then
  missing+=(cmake)
else
  cmake_version=$(cmake --version | head -n1 | awk '{print $3}')
  if [ "$(printf '%s\n%s\n' 3.25 "$cmake_version" | sort -V | head -n1)" != 3.25 ]; then
    echo "setup: cmake $cmake_version is older than 3.25; installing Debian's cmake" >&2
    missing+=(cmake)
  fi
fi
have_header /usr/include/eigen3/Eigen/Core || have_header /usr/local/include/eigen3/Eigen/Core || missing+=(libeigen3-dev)
if ! have_header /usr/include/gtest/gtest.h && ! have_header /usr/local/include/gtest/gtest.h; then
  missing+=(libgtest-dev)
fi
command -v python3 >/dev/null 2>&1 || missing+=(python3)
docs=0 format=0
for arg in "$@"; do
  case "$arg" in
    --docs) docs=1 ;;
    --format) format=1 ;;
    *) echo "setup: unknown option '$arg' (known: --docs, --format)" >&2; exit 2 ;;
  esac
done
if [ "$docs" = 1 ]; then  # make docs: Doxygen and a local MathJax (no CDN)
  command -v doxygen >/dev/null 2>&1 || missing+=(doxygen)
  [ -f /usr/share/javascript/mathjax/MathJax.js ] || missing+=(libjs-mathjax)
fi
if [ "$format" = 1 ]; then  # tools/format.sh
  command -v clang-format >/dev/null 2>&1 || missing+=(clang-format)
fi

if [ ${#missing[@]} -gt 0 ]; then
  cmd="apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing ${missing[*]}; run as root:" >&2
    echo "  $cmd" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

nvcc_bin=$(command -v nvcc || true)
[ -z "$nvcc_bin" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc_bin=/usr/local/cuda/bin/nvcc
if [ -z "$nvcc_bin" ]; then
  echo "setup: nvcc not found; install the CUDA Toolkit (12.x or 13.x) and put its bin/ on PATH" >&2
  exit 1
fi
# NCCL, for chapter 10's program: the PyPI wheel for the toolkit's CUDA major version, unless
# python3 or the system already has it (Debian's libnccl-dev puts nccl.h in /usr/include).
nccl_note="NCCL found"
if ! python3 -c "import nvidia.nccl" >/dev/null 2>&1 && [ ! -f /usr/include/nccl.h ] && [ -z "${NCCL_ROOT:-}" ]; then
  cuda_major=$("$nvcc_bin" --version | grep -o 'release [0-9]*' | awk '{print $2}')
  wheel="nvidia-nccl-cu${cuda_major}"
  if python3 -m pip install --quiet "$wheel"; then
    nccl_note="NCCL installed ($wheel)"
  else
    nccl_note="NCCL missing: 'python3 -m pip install $wheel' failed; chapter 10's program will not be built"
    echo "setup: $nccl_note" >&2
  fi
fi
echo "setup: ok (cmake $(cmake --version | head -n1 | awk '{print $3}'), $("$nvcc_bin" --version | grep -o 'release [0-9.]*'), $nccl_note)"
