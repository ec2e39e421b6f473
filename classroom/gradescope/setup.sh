#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image ("Ubuntu 22.04" base
# image); the autograder zip (make autograder) is unpacked in /autograder/source, and Gradescope
# itself copies run_autograder to /autograder/run_autograder. Gradescope has no GPU, so this
# installs only what grading the CPU exercises needs (classroom/grade.py --cpu-only): g++ for C++17,
# Eigen 3.3 or newer in /usr/include/eigen3 (the checker's fp64 oracle) and python3 3.7 or newer.
# No CUDA toolkit, no CMake: the GPU exercises are listed as "not graded here".
# Each requirement that is not met stops this with one line naming what was found.
set -euo pipefail

fail() {
  echo "setup.sh: $*" >&2
  exit 1
}
# version A >= version B, compared field by field
at_least() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }

packages=(python3 g++ libeigen3-dev)
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq || fail "apt-get update failed (see above); the packages ${packages[*]} cannot be installed"
for p in "${packages[@]}"; do
  apt-cache show "$p" >/dev/null 2>&1 ||
    fail "apt has no package $p; on Ubuntu it is in 'main' or 'universe': enable both in /etc/apt/sources.list"
done
apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null ||
  fail "apt-get install ${packages[*]} failed (see above)"

py=$(python3 -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])') || fail "python3 does not run"
at_least "$py" 3.7 || fail "python3 is $py; classroom/grade.py needs 3.7 or newer"

gxx=$(g++ -dumpfullversion -dumpversion) || fail "g++ does not run"
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
cat >"$probe/c17.cpp" <<'CPP'
#include <optional>
#include <tuple>
int main() {
  auto [a, b] = std::make_tuple(1, 2);
  std::optional<int> c = a + b;
  if constexpr (sizeof(int) >= 2) return *c == 3 ? 0 : 1;
  return 1;
}
CPP
if ! g++ -std=c++17 -o "$probe/c17" "$probe/c17.cpp" >/dev/null 2>&1 || ! "$probe/c17"; then
  fail "g++ $gxx does not build and run C++17 (-std=c++17); the grader needs g++ 7 or newer"
fi

macros=/usr/include/eigen3/Eigen/src/Core/util/Macros.h
[ -f "$macros" ] || fail "no Eigen headers in /usr/include/eigen3 (classroom/grade.py looks there); install libeigen3-dev"
eigen=$(awk '/#define EIGEN_(WORLD|MAJOR|MINOR)_VERSION/ {printf "%s%s", sep, $3; sep = "."}' "$macros")
at_least "$eigen" 3.3 || fail "Eigen is $eigen; the checker needs Eigen 3.3 or newer"

echo "setup.sh: ok (python3 $py, g++ $gxx, Eigen $eigen; CPU exercises only: no GPU here, so no CUDA or CMake)"
