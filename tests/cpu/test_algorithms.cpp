// Every chapter's algorithm.h (registered as a CpuAlgorithm) against the fp64 oracle on the
// shape list, plus the large-logit experiment: the safe chapters stay finite, chapter 01 does not.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "registry.h"
#include "runner.h"
#include "../test_shapes.h"

namespace fa {
namespace {

// Small enough for plain float loops in CI, covering the cases that break index math:
// seq 1, odd lengths, seq_q != seq_kv both ways (causal rows that see nothing), GQA and MQA.
std::vector<AttentionShape> cpu_shapes() {
  return {shape_of(1, 1, 1, 1, 1, 32, false),    shape_of(1, 2, 2, 17, 17, 64, true),
          shape_of(2, 4, 2, 33, 33, 32, false),  shape_of(1, 4, 1, 65, 65, 64, true),
          shape_of(1, 2, 2, 31, 70, 128, true),  shape_of(1, 2, 1, 70, 31, 32, true),
          shape_of(1, 2, 2, 100, 100, 48, false)};
}

struct Case {
  const CpuAlgorithm* algorithm;
  AttentionShape shape;
  AttentionFeatures features;  // chapter 09's, for the algorithms that take them

  std::string to_string() const { return describe(shape, features); }
};

// gtest prints parameters in test listings and failures: make that readable.
void PrintTo(const Case& c, std::ostream* out) { *out << c.algorithm->name << " on " << c.to_string(); }

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const CpuAlgorithm& a : cpu_algorithms()) {
    for (const AttentionShape& s : cpu_shapes()) cases.push_back({&a, s, {}});
    // Chapter 09's shape list, for the algorithms that take its features.
    if (a.features != 0)
      for (const FeatureProblem& p : feature_shapes()) cases.push_back({&a, p.shape, p.features});
  }
  return cases;
}

class CpuAlgorithmTest : public ::testing::TestWithParam<Case> {};

TEST_P(CpuAlgorithmTest, MatchesOracle) {
  const Case& c = GetParam();
  std::string why = support_reason(*c.algorithm, c.shape, c.features);
  if (!why.empty()) GTEST_SKIP() << c.algorithm->name << " does not support " << c.to_string() << ": " << why;
  const uint64_t seed = fresh_seed();
  Problem problem(c.shape, seed, /*full_check=*/true, c.features);
  RunResult r = run_cpu_algorithm(*c.algorithm, problem, RunOptions{});
  ASSERT_TRUE(r.ran) << r.skipped << r.error;
  EXPECT_TRUE(r.report.passed()) << c.algorithm->name << " on " << c.to_string() << ", seed " << seed << "\n"
                                 << r.report.details();
}

INSTANTIATE_TEST_SUITE_P(All, CpuAlgorithmTest, ::testing::ValuesIn(all_cases()), [](const auto& info) {
  return info.param.algorithm->name + "__" + info.param.shape.to_identifier() + info.param.features.to_identifier();
});

TEST(CpuAlgorithms, EveryChapterHasOne) {
  for (int chapter : {1, 2, 3, 4, 5, 9})
    EXPECT_FALSE(cpu_algorithms_of_chapter(chapter).empty()) << "chapter " << chapter;
}

// Logits of about +-100: exp overflows float above ~88.7.
TEST(CpuAlgorithms, LargeLogitsOverflowOnlyTheNaiveSoftmax) {
  AttentionShape s = shape_of(1, 2, 2, 32, 32, 64, false);
  s.scale = 40.0 / std::sqrt(64.0);
  Problem problem(s, fresh_seed(), true);
  for (const CpuAlgorithm& a : cpu_algorithms()) {
    RunResult r = run_cpu_algorithm(a, problem, RunOptions{});
    ASSERT_TRUE(r.ran) << a.name << ": " << r.skipped << r.error;
    if (a.chapter == 1) {
      // Expected: the naive softmax overflows, and the check says so instead of passing.
      EXPECT_GT(r.report.nonfinite + r.report.lse_bad, 0) << a.name << " was expected to overflow";
      EXPECT_FALSE(r.report.passed());
    } else {
      EXPECT_TRUE(r.report.passed()) << a.name << "\n" << r.report.details();
    }
  }
}

}  // namespace
}  // namespace fa
