#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image; this repository (the
# instructor's copy, solutions included) is unpacked in /autograder/source. The image also needs
# the CUDA toolkit (nvcc 12 or newer), installed the way NVIDIA documents for its Ubuntu release,
# and a GPU at grading time for the GPU exercises (without one their tests skip and score 0).
set -euo pipefail
cd /autograder/source
bash tools/setup.sh  # CMake, a C++ compiler, Eigen, GoogleTest, Python 3 (Debian/Ubuntu packages)
