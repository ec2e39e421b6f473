// Chapter 07's backward by recomputation (algorithm.h, float) against the fp64 backward oracle,
// which tests/cpu/test_oracle.cpp checks against finite differences of the forward.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "../../chapters/07_backward/algorithm.h"
#include "random.h"
#include "reference.h"
#include "../test_shapes.h"

namespace fa {
namespace {

class BackwardCpu : public ::testing::TestWithParam<AttentionShape> {};

TEST_P(BackwardCpu, MatchesOracle) {
  const AttentionShape s = GetParam();
  const uint64_t seed = fresh_seed();
  std::vector<float> q(s.q_elems()), k(s.kv_elems()), v(s.kv_elems()), d_o(s.o_elems());
  for (int64_t i = 0; i < s.q_elems(); ++i) q[i] = random_normal(seed, 0, i), d_o[i] = random_normal(seed, 3, i);
  for (int64_t i = 0; i < s.kv_elems(); ++i) k[i] = random_normal(seed, 1, i), v[i] = random_normal(seed, 2, i);
  const BackwardReference ref = reference_backward(s, q.data(), k.data(), v.data(), d_o.data());
  // The forward's outputs, as a forward kernel would have left them (float).
  std::vector<float> o(ref.o.begin(), ref.o.end()), lse(ref.lse.begin(), ref.lse.end());
  std::vector<float> dq(s.q_elems()), dk(s.kv_elems()), dv(s.kv_elems());
  backward::flash_backward_cpu(s, q.data(), k.data(), v.data(), o.data(), lse.data(), d_o.data(), dq.data(), dk.data(),
                               dv.data());
  EXPECT_LT(rel_error(dq, ref.dq), 1e-4) << "dQ on " << s.to_string() << ", seed " << seed;
  EXPECT_LT(rel_error(dk, ref.dk), 1e-4) << "dK on " << s.to_string() << ", seed " << seed;
  EXPECT_LT(rel_error(dv, ref.dv), 1e-4) << "dV on " << s.to_string() << ", seed " << seed;
}

// Tails of both tile sizes, causal rows that see nothing (seq_q > seq_kv), GQA and MQA.
INSTANTIATE_TEST_SUITE_P(Shapes, BackwardCpu,
                         ::testing::Values(shape_of(1, 1, 1, 1, 1, 32, false), shape_of(1, 2, 2, 17, 17, 64, true),
                                           shape_of(2, 4, 2, 65, 65, 32, false), shape_of(1, 4, 1, 70, 70, 64, true),
                                           shape_of(1, 2, 2, 31, 100, 64, true), shape_of(1, 2, 1, 100, 31, 32, true),
                                           shape_of(1, 2, 2, 130, 130, 128, false)),
                         [](const auto& info) { return info.param.to_identifier(); });

}  // namespace
}  // namespace fa
