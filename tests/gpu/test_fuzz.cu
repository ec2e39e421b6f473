// Shapes and values nobody chose: every forward and backward kernel on random shapes, and NaN
// inputs that must reach exactly the outputs they touch.
//
// Fuzzed shapes. Each seed draws one shape: batch 1-2, heads_kv 1-2 with 1, 2 or 4 query heads
// each (MHA, GQA), seq_q and seq_kv from 1 to 2048 (a quarter of them primes, a quarter at most
// 64), head_dim 32, 48, 64, 96, 128 or 256, causal or not. A kernel that does not take the drawn head_dim
// runs at 64 or 128 instead, so every kernel runs on every seed. A fixed list of seeds always
// runs (the test name holds the seed). More seeds, running the test program itself (CTest's list
// of tests is made at build time):
//   FA_FUZZ_SEED=s FA_FUZZ_COUNT=n build/bin/fa_gpu_tests --gtest_filter='Seeds/FuzzShapes.*'
// adds seeds s, s+1, ..., s+n-1 (FA_FUZZ_COUNT alone: from a fresh seed, which the names show).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <string>

#include "../../chapters/07_backward/forward_for_backward.h"
#include "backward_runner.h"
#include "registry.h"
#include "runner.h"
#include "../test_shapes.h"

namespace fa {
namespace {

// Runs while tests are being registered (before main), so a bad value ends the program at once.
uint64_t env_number(const char* name, uint64_t fallback, uint64_t max) {
  const char* text = std::getenv(name);
  if (!text) return fallback;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (*text == '\0' || *end != '\0' || text[0] == '-' || value > max) {
    std::fprintf(stderr, "%s expects an integer from 0 to %llu, got '%s'\n", name, (unsigned long long)max, text);
    std::exit(2);
  }
  return value;
}

std::vector<uint64_t> fuzz_seeds() {
  std::vector<uint64_t> seeds = {1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233};  // always run
  const uint64_t count = env_number("FA_FUZZ_COUNT", std::getenv("FA_FUZZ_SEED") ? 1 : 0, 10000);
  const uint64_t first = env_number("FA_FUZZ_SEED", fresh_seed(), UINT64_MAX - 10000);
  for (uint64_t i = 0; i < count; ++i)
    if (std::find(seeds.begin(), seeds.end(), first + i) == seeds.end()) seeds.push_back(first + i);
  return seeds;
}

AttentionShape fuzz_shape(uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  static const int primes[] = {2, 3, 5, 7, 13, 31, 61, 67, 127, 131, 257, 509, 521, 1021, 1031, 2039};
  auto seq = [&] {
    switch (pick(0, 3)) {
      case 0: return primes[pick(0, int(std::size(primes)) - 1)];
      case 1: return pick(1, 64);
      default: return pick(1, 2048);
    }
  };
  static const int dims[] = {32, 48, 64, 96, 128, 256};
  const int heads_kv = pick(1, 2), group = 1 << pick(0, 2);
  const int batch = pick(1, 2), seq_q = seq(), seq_kv = seq(), dim = dims[pick(0, int(std::size(dims)) - 1)];
  return shape_of(batch, heads_kv * group, heads_kv, seq_q, seq_kv, dim, pick(0, 1) == 1);
}

/// The drawn shape, or the same at head_dim 64 or 128 for a kernel that does not take it.
template <class Kernel>
std::optional<AttentionShape> shape_for(const Kernel& k, AttentionShape s) {
  if (support_reason(k, s).empty()) return s;
  for (int d : {64, 128}) {
    s.head_dim = d;
    if (support_reason(k, s).empty()) return s;
  }
  return std::nullopt;
}

class FuzzShapes : public ::testing::TestWithParam<uint64_t> {};

TEST_P(FuzzShapes, EveryKernelMatchesTheOracle) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = GetParam();
  const AttentionShape drawn = fuzz_shape(seed);
  std::printf("seed %llu: %s\n", (unsigned long long)seed, drawn.to_string().c_str());
  std::map<int, Problem> problems;  // by head_dim
  int ran = 0;
  for (const ForwardKernel& k : forward_kernels()) {
    const std::optional<AttentionShape> s = shape_for(k, drawn);
    if (!s) continue;
    Problem& problem = problems.try_emplace(s->head_dim, *s, seed).first->second;
    RunOptions options;
    options.iters = 0;
    const RunResult r = run_forward(k, problem, options);
    EXPECT_TRUE(r.error.empty() && r.ran) << k.name << " on " << s->to_string() << ": " << r.error << r.skipped;
    EXPECT_TRUE(r.report.passed()) << k.name << " on " << s->to_string() << ", fuzz seed " << seed << "\n"
                                   << r.report.details();
    ++ran;
  }
  // Backward: the oracle on the first K/V head of batch 0 and its query heads (all rows), with O
  // and LSE from chapter 04's register kernel, as chapter 07's program does for big shapes.
  const ForwardKernel forward = backward::forward_for_backward();
  std::map<std::pair<int, DType>, BackwardProblem> backward_problems;
  for (const BackwardKernel& k : backward_kernels()) {
    std::optional<AttentionShape> s = shape_for(k, drawn);
    if (s && !support_reason(forward, *s).empty()) s.reset();
    if (!s) continue;
    auto key = std::make_pair(s->head_dim, k.dtype);
    auto found = backward_problems.find(key);
    if (found == backward_problems.end()) {
      BackwardProblem p = make_backward_problem(*s, seed, k.dtype, 1);
      if (p.needs_forward) run_forward_for(p, forward);
      found = backward_problems.emplace(key, std::move(p)).first;
    }
    const BackwardRunResult r = run_backward(k, found->second, 0);
    EXPECT_TRUE(r.ran && r.passed) << k.name << " on " << s->to_string() << ", fuzz seed " << seed << ": " << r.error
                                   << r.skipped << r.summary();
    ++ran;
  }
  EXPECT_GT(ran, 0);
}

INSTANTIATE_TEST_SUITE_P(Seeds, FuzzShapes, ::testing::ValuesIn(fuzz_seeds()),
                         [](const auto& info) { return "seed_" + std::to_string(info.param); });

// ---- NaN inputs -------------------------------------------------------------------------------
// A NaN in K[b, g, j, c] makes the scores of key j NaN for every query row of K/V head g's
// query heads in batch b, so those rows' O and LSE are NaN, and nothing else changes. A NaN in
// V[b, g, j, c] reaches column c of the same rows' O only; LSE does not read V. "Nothing else
// changes" is checked bit for bit against a run without the NaN. No mask here: with one, a
// kernel may multiply a masked key's P = 0 by the NaN (0 * NaN = NaN) in a partly masked tile,
// which is a choice, not a bug. The FP8 kernels are left out: a NaN in a block poisons that
// block's scale, so it spreads by design.

class NanInputs : public ::testing::TestWithParam<const ForwardKernel*> {};

struct Outputs {
  std::vector<float> o, lse;
};

TEST_P(NanInputs, ReachOnlyTheOutputsTheyTouch) {
  SKIP_WITHOUT_GPU();
  const ForwardKernel& k = *GetParam();
  if (k.tolerance) GTEST_SKIP() << k.name << " is an FP8 kernel: a NaN spreads through its block's scale";
  const std::optional<AttentionShape> shape = shape_for(k, shape_of(2, 4, 2, 70, 77, 64, false));
  if (!shape) GTEST_SKIP() << k.name << " takes neither head_dim 64 nor 128";
  const AttentionShape s = *shape;
  const uint64_t seed = fresh_seed();
  const HostInputs clean = make_random_inputs(s, seed);
  auto run = [&](const HostInputs& in) {
    Outputs out;
    launch_forward_on(k, s, in.q, in.k, in.v, out.o, out.lse);
    return out;
  };
  const Outputs base = run(clean);
  const int d = s.head_dim, group = s.heads_q / s.heads_kv;
  const int b = 1, g = 1, j = 40, c = 5;  // the poisoned element: batch 1, K/V head 1, key 40, column 5
  const int64_t kv_index = ((int64_t(b) * s.heads_kv + g) * s.seq_kv + j) * d + c;
  for (const char* which : {"K", "V"}) {
    HostInputs in = clean;
    (which[0] == 'K' ? in.k : in.v)[kv_index] = NAN;
    const Outputs got = run(in);
    int64_t wrong = 0;
    std::string first;
    auto expect = [&](bool nan, float value, float before, const std::string& where) {
      const bool ok = nan ? std::isnan(value) : std::memcmp(&value, &before, sizeof value) == 0;
      if (!ok && wrong++ == 0)
        first = where + ": expected " + (nan ? std::string("NaN") : std::to_string(before)) + ", got " +
                std::to_string(value);
    };
    for (int bb = 0; bb < s.batch; ++bb)
      for (int h = 0; h < s.heads_q; ++h) {
        const bool reached = bb == b && h / group == g;
        for (int i = 0; i < s.seq_q; ++i) {
          const int64_t row = (int64_t(bb) * s.heads_q + h) * s.seq_q + i;
          const std::string at =
              "(batch " + std::to_string(bb) + ", head " + std::to_string(h) + ", row " + std::to_string(i);
          expect(reached && which[0] == 'K', got.lse[row], base.lse[row], "LSE" + at + ")");
          for (int col = 0; col < d; ++col)
            expect(reached && (which[0] == 'K' || col == c), got.o[row * d + col], base.o[row * d + col],
                   "O" + at + ", col " + std::to_string(col) + ")");
        }
      }
    EXPECT_EQ(wrong, 0) << k.name << " on " << s.to_string() << ", NaN in " << which << " (batch " << b << ", K/V head "
                        << g << ", key " << j << ", col " << c << "), seed " << seed << ": " << wrong
                        << " outputs wrong; first " << first;
  }
}

INSTANTIATE_TEST_SUITE_P(All, NanInputs, ::testing::ValuesIn(forward_kernel_pointers()),
                         [](const auto& info) { return info.param->name; });

}  // namespace
}  // namespace fa
