// Every registered backward kernel (chapter 07) against the fp64 backward oracle: fresh random
// inputs, dQ/dK/dV poisoned before the launch, every element compared; kernels that promise
// determinism must also write the same bytes on a second launch, and each run's reported peak
// device memory must be what it holds. Without a GPU each test reports SKIPPED with the reason.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backward_runner.h"
#include "cuda_check.h"
#include "registry.h"
#include "../test_shapes.h"

namespace fa {
namespace {

struct BackwardCase {
  const BackwardKernel* kernel;
  AttentionShape shape;
  AttentionFeatures features;  // chapter 09's, for the kernels that take them

  std::string to_string() const { return describe(shape, features); }
};

void PrintTo(const BackwardCase& c, std::ostream* out) { *out << c.kernel->name << " on " << c.to_string(); }

std::vector<BackwardCase> backward_cases() {
  // Tails of the 64-row and 64-key tiles, causal rows that see no key (seq_q > seq_kv), GQA, MQA,
  // head_dim 32 to 256 (96: the Hopper kernel's zero-filled columns; 256: its wide kernels).
  const std::vector<AttentionShape> shapes = {
      shape_of(1, 1, 1, 1, 1, 64, false),      shape_of(1, 2, 2, 17, 17, 64, true),
      shape_of(2, 4, 2, 65, 65, 32, false),    shape_of(1, 4, 1, 70, 70, 64, true),
      shape_of(1, 2, 2, 31, 100, 64, true),    shape_of(1, 2, 1, 100, 31, 32, true),
      shape_of(2, 4, 2, 300, 301, 128, true),  shape_of(1, 2, 2, 257, 257, 128, false),
      shape_of(2, 4, 2, 200, 333, 96, true),   shape_of(1, 2, 1, 257, 130, 96, false),
      shape_of(1, 2, 2, 17, 17, 256, true),    shape_of(2, 4, 2, 200, 333, 256, true),
      shape_of(1, 2, 1, 257, 130, 256, false), shape_of(1, 2, 1, 100, 31, 256, true)};
  std::vector<BackwardCase> cases;
  for (const BackwardKernel& k : backward_kernels()) {
    for (const AttentionShape& s : shapes) cases.push_back({&k, s, {}});
    // Chapter 09's shape list, for the kernels that take its features.
    if (k.features != 0)
      for (const FeatureProblem& p : feature_shapes()) cases.push_back({&k, p.shape, p.features});
  }
  return cases;
}

class BackwardKernelTest : public ::testing::TestWithParam<BackwardCase> {};

TEST_P(BackwardKernelTest, MatchesOracle) {
  const BackwardCase& c = GetParam();
  const GpuInfo& gpu = detect_gpu();
  if (!gpu.available) GTEST_SKIP() << "no GPU: " << gpu.reason;
  const std::string why = support_reason(*c.kernel, c.shape, c.features);
  if (!why.empty()) GTEST_SKIP() << c.kernel->name << " does not support " << c.to_string() << ": " << why;
  const uint64_t seed = fresh_seed();
  const BackwardProblem problem = make_backward_problem(c.shape, seed, c.kernel->dtype, 0, c.features);
  const BackwardRunResult r = run_backward(*c.kernel, problem, 0);
  ASSERT_TRUE(r.ran) << r.skipped << r.error;
  EXPECT_TRUE(r.passed) << c.kernel->name << " on " << c.to_string() << ", seed " << seed << ": " << r.summary()
                        << " (unwritten dQ/dK/dV " << r.dq.unwritten << "/" << r.dk.unwritten << "/" << r.dv.unwritten
                        << ")";
  // The peak device memory it reports is what it holds: Q, O, dO and dQ at Q's size, K, V, dK and
  // dV at K's, in the kernel's dtype, the float LSE and the workspace (no bias or packing here).
  if (!c.features.bias && !c.features.varlen()) {
    const std::size_t element = dtype_size(c.kernel->dtype);
    const std::size_t expected = (std::size_t(c.shape.q_elems()) + std::size_t(c.shape.kv_elems())) * 4 * element +
                                 std::size_t(c.shape.lse_elems()) * sizeof(float) +
                                 (c.kernel->workspace_bytes ? c.kernel->workspace_bytes(c.shape) : 0);
    EXPECT_DOUBLE_EQ(r.device_mib, double(expected) / (1 << 20)) << c.kernel->name << " on " << c.to_string();
  }
  if (c.kernel->deterministic)
    EXPECT_TRUE(r.repeat_identical) << c.kernel->name
                                    << " promises bitwise-identical gradients, but a second launch on " << c.to_string()
                                    << " wrote different bytes; seed " << seed;
}

INSTANTIATE_TEST_SUITE_P(All, BackwardKernelTest, ::testing::ValuesIn(backward_cases()), [](const auto& info) {
  return info.param.kernel->name + "__" + info.param.shape.to_identifier() + info.param.features.to_identifier();
});

}  // namespace
}  // namespace fa
