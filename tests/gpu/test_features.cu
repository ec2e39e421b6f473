// Chapter 09's kernels on chapter 09's shape list (test_shapes.h: windows, softcap on large
// logits, ALiBi, a bias, packed batches with empty and length-1 sequences), against the fp64
// oracle, every row. Fresh random inputs and packings per test (the seed is printed on
// failure); outputs poisoned before each launch. The plain shape list runs these kernels too
// (test_forward_kernels.cu).
#include <gtest/gtest.h>

#include "registry.h"
#include "runner.h"
#include "../test_shapes.h"

namespace fa {
namespace {

struct FeatureCase {
  const ForwardKernel* kernel;
  FeatureProblem problem;
};

void PrintTo(const FeatureCase& c, std::ostream* out) { *out << c.kernel->name << " on " << c.problem.to_string(); }

std::vector<FeatureCase> feature_cases() {
  std::vector<FeatureCase> cases;
  for (const ForwardKernel& k : forward_kernels()) {
    if (k.features == 0) continue;
    for (const FeatureProblem& p : feature_shapes()) cases.push_back({&k, p});
  }
  return cases;
}

class FeatureKernelTest : public ::testing::TestWithParam<FeatureCase> {};

TEST_P(FeatureKernelTest, MatchesOracle) {
  SKIP_WITHOUT_GPU();
  const FeatureCase& c = GetParam();
  const std::string why = support_reason(*c.kernel, c.problem.shape, c.problem.features);
  if (!why.empty()) GTEST_SKIP() << c.kernel->name << " does not support " << c.problem.to_string() << ": " << why;
  const uint64_t seed = fresh_seed();
  Problem problem(c.problem.shape, seed, /*full_check=*/true, c.problem.features);
  RunOptions options;
  options.iters = 0;
  const RunResult r = run_forward(*c.kernel, problem, options);
  ASSERT_TRUE(r.error.empty()) << r.error;
  ASSERT_TRUE(r.ran) << r.skipped;
  EXPECT_TRUE(r.report.passed()) << c.kernel->name << " on " << c.problem.to_string() << ", seed " << seed << "\n"
                                 << r.report.details();
}

INSTANTIATE_TEST_SUITE_P(Features, FeatureKernelTest, ::testing::ValuesIn(feature_cases()), [](const auto& info) {
  return info.param.kernel->name + "__" + info.param.problem.to_identifier();
});

}  // namespace
}  // namespace fa
