#!/usr/bin/env bash
# The CPU tests with host code under AddressSanitizer and UndefinedBehaviorSanitizer
# (-DFA_SANITIZE_HOST=ON). CI runs it after `make test`; it builds into build-asan/ (one GPU
# architecture: device code is not what is checked here).
# Usage: bash tools/asan_ci.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build-asan}
# protect_shadow_gap=0: the CUDA runtime maps memory where ASan's shadow gap would be. Set
# before the build too: the build runs the test programs to list their tests.
export ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
cmake -S . -B "$build" -DFA_SANITIZE_HOST=ON -DFA_WERROR=ON -DFA_CUDA_ARCHITECTURES=90 > /dev/null
cmake --build "$build" -j "$(nproc)"
ctest --test-dir "$build" -L cpu --output-on-failure -j "$(nproc)"
