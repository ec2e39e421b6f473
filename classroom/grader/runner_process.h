// The checker's process side: one runner process per case, run as a hostile program. It runs in
// a process group of its own, in an empty read-only folder, with a cleared environment, no core
// files, no file writes (RLIMIT_FSIZE 0), a CPU-time limit and a wall-clock limit; as root it
// first drops to the grading's sandbox user and, once the case is over, every process of that
// user is killed (that user only: another grading's runners are another user's) and what it left
// in the shared writable places is swept. Without root the checker kills the orphans it adopts as
// a subreaper (checker.cpp makes it one).
#pragma once

#include <string>
#include <vector>

#include "protocol.h"

namespace fa::grader {

struct RunLimits {
  double timeout_s = 60;  // wall clock per runner process; the CPU-time limit is this + 5 s
  int uid = 65534;        // as root, the user the runner runs as (the grading's sandbox user)
  // The runner's address space in MiB (RLIMIT_AS; 0: no limit). For CPU runners only: the CUDA
  // driver reserves more address space than the device has memory, so a GPU runner under any
  // such limit fails in its first CUDA call. A runner with this limit may start no thread
  // (RLIMIT_NPROC 1 for its user).
  std::size_t memory_mb = 0;
};

struct Reply {
  bool ok = false;
  std::string error;  // why there are no values: the runner's own "error ..." line, a crash, a timeout
  std::vector<float> out;
  double ms = -1, wall_ms = 0;
  int iters = 0;
  double q_scale = 1;  // a timed answer: the factor its launch's Q was scaled by (protocol.h)
  bool timed_out = false;
};

/// Runs `runner` with `header` and `input` on its stdin (protocol.h) and returns what it
/// answered. `expect_values` (0: any number) bounds what it may write before it is cut off.
Reply ask(const RunLimits& limits, const std::string& runner, const Header& header, const std::vector<float>& input,
          std::size_t expect_values);

}  // namespace fa::grader
