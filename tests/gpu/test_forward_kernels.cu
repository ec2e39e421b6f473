// Every registered forward kernel against the fp64 oracle on the shared shape list, plus the
// large-logit experiment and run-to-run determinism. Fresh random inputs per test (the seed is
// printed on failure); outputs poisoned before each launch; every row checked. Without a GPU
// every test here reports SKIPPED with the reason.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <random>

#include "cuda_check.h"
#include "registry.h"
#include "runner.h"
#include "../test_shapes.h"

namespace fa {
namespace {

/// The shared shape list: seq 1, 17, 127, 1000, 1024 (tails that are not a multiple of any
/// tile), head_dim 32/64/96/128/256 (and one odd size), causal on and off, seq_q != seq_kv both ways
/// (causal rows that see no key), heads_kv < heads_q (GQA and MQA).
std::vector<AttentionShape> gpu_shapes() {
  return {
      shape_of(1, 1, 1, 1, 1, 64, false),       shape_of(3, 2, 2, 1, 1, 128, true),
      shape_of(1, 2, 2, 17, 17, 64, true),      shape_of(2, 4, 2, 17, 17, 32, false),
      shape_of(2, 4, 2, 127, 127, 32, true),    shape_of(1, 2, 2, 127, 127, 128, false),
      shape_of(1, 4, 1, 1000, 1000, 64, true),  shape_of(1, 2, 2, 1000, 1000, 128, false),
      shape_of(1, 2, 2, 1024, 1024, 128, true), shape_of(2, 2, 1, 1024, 1024, 32, false),
      shape_of(1, 4, 2, 127, 1000, 64, true),   shape_of(1, 4, 2, 1000, 127, 128, true),
      shape_of(1, 2, 2, 1, 1024, 64, true),     shape_of(1, 2, 2, 100, 100, 48, false),
      shape_of(2, 4, 2, 17, 300, 96, true),     shape_of(1, 2, 2, 1000, 1000, 96, false),
      shape_of(1, 4, 1, 1000, 1000, 96, true),  shape_of(2, 2, 2, 17, 17, 256, false),
      shape_of(1, 4, 2, 127, 1000, 256, true),  shape_of(1, 2, 2, 1000, 1000, 256, false),
      shape_of(1, 2, 1, 1024, 1024, 256, true),
  };
}

struct Case {
  const ForwardKernel* kernel;
  AttentionShape shape;
};

// gtest prints parameters in test listings and failures: make that readable.
void PrintTo(const Case& c, std::ostream* out) { *out << c.kernel->name << " on " << c.shape.to_string(); }

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const ForwardKernel& k : forward_kernels()) {
    for (const AttentionShape& s : gpu_shapes()) cases.push_back({&k, s});
  }
  return cases;
}

class ForwardKernelTest : public ::testing::TestWithParam<Case> {};

TEST_P(ForwardKernelTest, MatchesOracle) {
  SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  std::string why = support_reason(*c.kernel, c.shape);
  if (!why.empty()) GTEST_SKIP() << c.kernel->name << " does not support " << c.shape.to_string() << ": " << why;
  const uint64_t seed = fresh_seed();
  Problem problem(c.shape, seed, /*full_check=*/true);
  RunOptions options;
  options.iters = 0;
  RunResult r = run_forward(*c.kernel, problem, options);
  ASSERT_TRUE(r.error.empty()) << r.error;
  ASSERT_TRUE(r.ran) << r.skipped;
  EXPECT_TRUE(r.report.passed()) << c.kernel->name << " on " << c.shape.to_string() << ", seed " << seed << "\n"
                                 << r.report.details();
}

INSTANTIATE_TEST_SUITE_P(All, ForwardKernelTest, ::testing::ValuesIn(all_cases()), [](const auto& info) {
  return info.param.kernel->name + "__" + info.param.shape.to_identifier();
});

class ForwardKernelProperty : public ::testing::TestWithParam<const ForwardKernel*> {};

// The property tests run at head_dim 64, or at 128 for kernels that take only that.
std::optional<AttentionShape> at_supported_dim(const ForwardKernel& k, AttentionShape s) {
  for (int d : {64, 128}) {
    s.head_dim = d;
    if (!k.supports || k.supports(s).empty()) return s;
  }
  return std::nullopt;
}

// Logits of about +-100 (exp overflows float above ~88.7). Chapter 01's softmax is expected to
// overflow -- that is its lesson -- and this test checks that it does and that the check says so.
TEST_P(ForwardKernelProperty, LargeLogits) {
  SKIP_WITHOUT_GPU();
  const ForwardKernel& k = *GetParam();
  const std::optional<AttentionShape> shape = at_supported_dim(k, shape_of(1, 2, 2, 200, 200, 64, true));
  if (!shape) GTEST_SKIP() << k.name << " takes neither head_dim 64 nor 128";
  AttentionShape s = *shape;
  s.scale = 40.0 / std::sqrt(double(s.head_dim));
  Problem problem(s, fresh_seed(), true);
  RunOptions options;
  options.iters = 0;
  RunResult r = run_forward(k, problem, options);
  ASSERT_TRUE(r.ran && r.error.empty()) << r.skipped << r.error;
  if (k.chapter == 1) {
    EXPECT_GT(r.report.nonfinite + r.report.lse_bad, 0) << k.name << " was expected to overflow";
  } else if (k.tolerance) {
    // FP8 (its own tolerance row): e4m3 scores are off by ~2^-4 of |S|, which at |S| ~ 100 reorders
    // the near-one-hot softmax, so accuracy is not expected here; nothing may overflow, though.
    EXPECT_EQ(r.report.nonfinite + r.report.unwritten, 0) << r.report.details();
  } else {
    EXPECT_TRUE(r.report.passed()) << r.report.details();
  }
}

// Same inputs, same launch, twice: bitwise-identical O and LSE.
TEST_P(ForwardKernelProperty, RunToRunBitwiseIdentical) {
  SKIP_WITHOUT_GPU();
  const ForwardKernel& k = *GetParam();
  const std::optional<AttentionShape> shape = at_supported_dim(k, shape_of(2, 4, 2, 300, 301, 64, true));
  if (!shape) GTEST_SKIP() << k.name << " takes neither head_dim 64 nor 128";
  Problem problem(*shape, fresh_seed());
  EXPECT_TRUE(output_bytes(k, problem) == output_bytes(k, problem))
      << k.name << " gave different bits on identical inputs";
}

// The peak device memory a run reports (fa_bench's device_mib) is what it holds: Q, K and V in the
// kernel's dtype, O, LSE and the workspace, counted from the sizes here. GQA (4 query heads on 2
// K/V heads) keeps K and V smaller than Q, and chapter 01's kernel has an N x N workspace; a
// count that took the workspace twice, or missed it, or counted K at Q's size, fails.
TEST_P(ForwardKernelProperty, ReportsItsPeakDeviceMemory) {
  SKIP_WITHOUT_GPU();
  const ForwardKernel& k = *GetParam();
  const std::optional<AttentionShape> shape = at_supported_dim(k, shape_of(2, 4, 2, 300, 301, 64, false));
  if (!shape) GTEST_SKIP() << k.name << " takes neither head_dim 64 nor 128";
  Problem problem(*shape, fresh_seed());
  RunOptions options;
  options.iters = 0;
  const RunResult r = run_forward(k, problem, options);
  ASSERT_TRUE(r.ran) << r.skipped << r.error;
  const std::size_t element = dtype_size(k.dtype);
  const std::size_t expected = (std::size_t(shape->q_elems()) * 2 + std::size_t(shape->kv_elems()) * 2) * element +
                               std::size_t(shape->lse_elems()) * sizeof(float) +
                               (k.workspace_bytes ? k.workspace_bytes(*shape) : 0);
  EXPECT_DOUBLE_EQ(r.device_mib, double(expected) / (1 << 20)) << k.name << " on " << shape->to_string();
}

INSTANTIATE_TEST_SUITE_P(All, ForwardKernelProperty, ::testing::ValuesIn(forward_kernel_pointers()),
                         [](const auto& info) { return info.param->name; });

}  // namespace
}  // namespace fa
