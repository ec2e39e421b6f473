// Running a backward kernel (chapter 07) against the fp64 backward oracle: inputs, the oracle's
// gradients, one launch on poisoned outputs, the comparison, and the timing. Used by chapter
// 07's program and by tests/gpu/test_backward_kernels.cu.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dtype.h"
#include "problem.h"
#include "reference.h"
#include "registry.h"
#include "runner.h"

namespace fa {

/// Inputs rounded to `dtype`, the forward's O (rounded to dtype) and LSE as a forward kernel
/// would have left them, and the oracle's dQ, dK, dV for the loss sum(O * dO).
struct BackwardProblem {
  AttentionShape shape;
  AttentionFeatures features;  // chapter 09's, none by default
  uint64_t seed = 0;
  DType dtype = DType::F32;
  std::vector<float> q, k, v, d_o, o, lse;
  /// Chapter 09: the bias (float, not rounded) and a packed batch's boundaries (random_packing),
  /// when the features ask for them.
  std::vector<float> bias;
  Packing packing;
  AttentionExtras host_extras() const;
  /// The oracle's gradients for `checked`: the whole problem, or (for big shapes) its first
  /// K/V heads of batch 0 with their query heads. Those are the leading elements of dQ, dK and
  /// dV, so a kernel's outputs are compared on that prefix (and checked written everywhere).
  AttentionShape checked;
  BackwardReference ref;
  bool needs_forward = false;  // o and lse are empty: run a forward kernel to fill them
};
/// check_kv_heads = 0: the oracle over the whole problem, which also gives O and LSE. Otherwise
/// the oracle covers only the first check_kv_heads K/V heads of batch 0, and O and LSE must come
/// from a forward kernel (run_forward_for). check_kv_heads < 0: no oracle at all (timing runs);
/// the kernels' outputs are then only checked to be written everywhere and finite. A problem with
/// chapter 09's features is always checked whole (check_kv_heads > 0 counts as 0).
BackwardProblem make_backward_problem(const AttentionShape& shape, uint64_t seed, DType dtype, int check_kv_heads = 0,
                                      const AttentionFeatures& features = {});

/// Fills problem.o and problem.lse with `forward`'s output on the problem's inputs (a GPU run).
/// Which forward is the caller's choice: chapter 07 runs chapter 04's fp32 kernel
/// (chapters/07_backward/forward_for_backward.h).
void run_forward_for(BackwardProblem& problem, const ForwardKernel& forward);

/// One gradient tensor against the oracle.
struct GradientCheck {
  double rel = 0;  // relative Frobenius error over finite, written elements
  double max_abs = 0;
  int64_t unwritten = 0;  // still the poison pattern
  int64_t nonfinite = 0;
};

struct BackwardRunResult {
  bool ran = false;
  std::string skipped;  // why it did not run (unsupported shape, no GPU)
  std::string error;
  GradientCheck dq, dk, dv;
  double limit = 0;  // on each relative error
  bool passed = false;
  /// A second launch (on freshly poisoned outputs) wrote the same bytes as the first.
  bool repeat_identical = false;
  double time_ms = 0;
  double device_mib = 0;  // peak device memory of the launch: Q, K, V, O, dO, LSE, dQ, dK, dV, workspace (MiB)
  /// "dQ rel 3e-07 max 1e-06, dK ..., dV ..." plus counts of unwritten / non-finite elements.
  std::string summary() const;
};

/// Relative-error limit on each gradient for a backward kernel of `dtype`.
double backward_tolerance(DType dtype);

/// Launches once on poisoned outputs and compares; launches again on poisoned outputs to see
/// whether the bytes repeat; then, when iters > 0, times iters launches (time_launches: median,
/// CUDA events). budget_ms > 0: as many of those iters as fit in about budget_ms, at least one.
/// flush_l2: evict the L2 before each timed launch.
BackwardRunResult run_backward(const BackwardKernel& kernel, const BackwardProblem& problem, int iters,
                               double budget_ms = 0, bool flush_l2 = false);

}  // namespace fa
