// The oracle is what every kernel is judged by, so it is checked first: against values worked
// out by hand, against properties softmax attention must have, and (backward) against finite
// differences of the forward.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "reference.h"
#include "tensor.h"
#include "../test_shapes.h"

namespace fa {
namespace {

ForwardReference full_forward(const AttentionShape& s, const HostInputs& in) {
  return reference_forward(s, in.q.data(), in.k.data(), in.v.data(), full_check_plan(s));
}

TEST(Oracle, HandComputedTwoKeys) {
  // One query, two keys, head_dim 1, scale 1: scores (0, 1).
  AttentionShape s = shape_of(1, 1, 1, 1, 2, 1, false);
  s.scale = 1.0;
  std::vector<float> q = {1}, k = {0, 1}, v = {1, 3};
  ForwardReference ref = reference_forward(s, q.data(), k.data(), v.data(), full_check_plan(s));
  const double e = std::exp(1.0);
  EXPECT_NEAR(ref.o[0][0], (1 + 3 * e) / (1 + e), 1e-14);
  EXPECT_NEAR(ref.lse[0][0], std::log(1 + e), 1e-14);
}

TEST(Oracle, HandComputedCausalBottomRight) {
  // seq_q 2, seq_kv 3, causal: row 0 sees keys 0..1, row 1 sees keys 0..2.
  AttentionShape s = shape_of(1, 1, 1, 2, 3, 1, true);
  s.scale = 1.0;
  std::vector<float> q = {0, 0}, k = {5, -2, 7}, v = {1, 2, 6};
  ForwardReference ref = reference_forward(s, q.data(), k.data(), v.data(), full_check_plan(s));
  // Zero queries: uniform weights over the visible keys.
  EXPECT_NEAR(ref.o[0][0], (1 + 2) / 2.0, 1e-14);
  EXPECT_NEAR(ref.o[0][1], (1 + 2 + 6) / 3.0, 1e-14);
  EXPECT_NEAR(ref.lse[0][0], std::log(2.0), 1e-14);
  EXPECT_NEAR(ref.lse[0][1], std::log(3.0), 1e-14);
}

TEST(Oracle, RowsOfPSumToOne) {
  // With V = identity (seq_kv == head_dim), O's rows are P's rows.
  const int n = 16;
  AttentionShape s = shape_of(1, 2, 2, 9, n, n, true);
  HostInputs in = make_random_inputs(s, fresh_seed());
  for (int h = 0; h < 2; ++h) {
    for (int j = 0; j < n; ++j) {
      for (int c = 0; c < n; ++c) in.v[(h * n + j) * n + c] = j == c ? 1.0f : 0.0f;
    }
  }
  ForwardReference ref = full_forward(s, in);
  for (size_t e = 0; e < ref.o.size(); ++e) {
    for (int r = 0; r < s.seq_q; ++r) {
      double sum = 0;
      for (int c = 0; c < n; ++c) {
        double p = ref.o[e][r * n + c];
        EXPECT_GE(p, 0.0);
        if (!s.visible(r, c)) {
          EXPECT_EQ(p, 0.0) << "masked key has weight";
        }
        sum += p;
      }
      EXPECT_NEAR(sum, 1.0, 1e-12);
    }
  }
}

TEST(Oracle, ShiftingEveryScoreOfARowChangesOnlyLse) {
  // k_j -> k_j + u adds scale * q_i.u to every score of row i: O is unchanged, LSE shifts by it.
  AttentionShape s = shape_of(1, 1, 1, 7, 11, 8, false);
  HostInputs in = make_random_inputs(s, fresh_seed());
  HostInputs shifted = in;
  std::vector<float> u = {0.5f, -1.0f, 2.0f, 0.25f, 0.0f, 1.5f, -0.75f, 1.0f};
  for (int j = 0; j < s.seq_kv; ++j) {
    for (int c = 0; c < 8; ++c) shifted.k[j * 8 + c] += u[c];
  }
  ForwardReference a = full_forward(s, in), b = full_forward(s, shifted);
  for (int i = 0; i < s.seq_q; ++i) {
    double qu = 0;
    for (int c = 0; c < 8; ++c) qu += double(in.q[i * 8 + c]) * u[c];
    EXPECT_NEAR(b.lse[0][i] - a.lse[0][i], s.softmax_scale() * qu, 1e-5);
    for (int c = 0; c < 8; ++c) EXPECT_NEAR(a.o[0][i * 8 + c], b.o[0][i * 8 + c], 1e-5);
  }
}

TEST(Oracle, CausalRowsMatchTruncatedKeys) {
  // Bottom-right causal with seq_q < seq_kv: row i equals full attention over keys 0..i+offset.
  AttentionShape s = shape_of(1, 1, 1, 4, 9, 4, true);
  HostInputs in = make_random_inputs(s, fresh_seed());
  ForwardReference causal = full_forward(s, in);
  for (int i = 0; i < s.seq_q; ++i) {
    int keys = s.visible_keys(i);
    EXPECT_EQ(keys, i + 5 + 1);
    AttentionShape t = shape_of(1, 1, 1, 1, keys, 4, false);
    std::vector<float> q(in.q.begin() + i * 4, in.q.begin() + i * 4 + 4);
    ForwardReference truncated = reference_forward(t, q.data(), in.k.data(), in.v.data(), full_check_plan(t));
    for (int c = 0; c < 4; ++c) EXPECT_NEAR(causal.o[0][i * 4 + c], truncated.o[0][c], 1e-12);
    EXPECT_NEAR(causal.lse[0][i], truncated.lse[0][0], 1e-12);
  }
}

TEST(Oracle, RowsThatSeeNoKeyAreZeroWithMinusInfLse) {
  // seq_q 5 > seq_kv 3, causal: rows 0 and 1 see nothing, row 2 sees key 0 only.
  AttentionShape s = shape_of(1, 1, 1, 5, 3, 4, true);
  HostInputs in = make_random_inputs(s, fresh_seed());
  ForwardReference ref = full_forward(s, in);
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(std::isinf(ref.lse[0][i]) && ref.lse[0][i] < 0);
    for (int c = 0; c < 4; ++c) EXPECT_EQ(ref.o[0][i * 4 + c], 0.0);
  }
  for (int c = 0; c < 4; ++c) EXPECT_NEAR(ref.o[0][2 * 4 + c], in.v[c], 1e-12);
}

TEST(Oracle, GroupedQueryHeadsEqualRepeatedKvHeads) {
  // heads_q 4 over heads_kv 2 must equal plain multi-head attention with each K/V head repeated.
  AttentionShape gqa = shape_of(2, 4, 2, 6, 10, 8, true);
  HostInputs in = make_random_inputs(gqa, fresh_seed());
  AttentionShape mha = gqa;
  mha.heads_kv = 4;
  HostInputs rep;
  rep.q = in.q;
  const int per_head = gqa.seq_kv * gqa.head_dim;
  for (int b = 0; b < 2; ++b) {
    for (int h = 0; h < 4; ++h) {
      int src = (b * 2 + h / 2) * per_head;
      rep.k.insert(rep.k.end(), in.k.begin() + src, in.k.begin() + src + per_head);
      rep.v.insert(rep.v.end(), in.v.begin() + src, in.v.begin() + src + per_head);
    }
  }
  ForwardReference a = full_forward(gqa, in), b = full_forward(mha, rep);
  ASSERT_EQ(a.o.size(), b.o.size());
  for (size_t e = 0; e < a.o.size(); ++e) {
    for (size_t i = 0; i < a.o[e].size(); ++i) EXPECT_DOUBLE_EQ(a.o[e][i], b.o[e][i]);
    for (size_t i = 0; i < a.lse[e].size(); ++i) EXPECT_DOUBLE_EQ(a.lse[e][i], b.lse[e][i]);
  }
}

TEST(Oracle, LseMatchesDirectSum) {
  AttentionShape s = shape_of(1, 1, 1, 3, 20, 4, false);
  HostInputs in = make_random_inputs(s, fresh_seed());
  ForwardReference ref = full_forward(s, in);
  for (int i = 0; i < 3; ++i) {
    long double sum = 0;
    for (int j = 0; j < 20; ++j) {
      long double dot = 0;
      for (int c = 0; c < 4; ++c) dot += (long double)in.q[i * 4 + c] * in.k[j * 4 + c];
      sum += std::exp(dot * (long double)s.softmax_scale());
    }
    EXPECT_NEAR(ref.lse[0][i], double(std::log(sum)), 1e-12);
  }
}

TEST(Oracle, LargeLogitsStayFinite) {
  // The oracle subtracts the row max: logits in the thousands are fine.
  AttentionShape s = shape_of(1, 2, 2, 8, 8, 16, false);
  s.scale = 500.0;
  HostInputs in = make_random_inputs(s, fresh_seed());
  ForwardReference ref = full_forward(s, in);
  for (const auto& rows : ref.o) {
    for (double x : rows) EXPECT_TRUE(std::isfinite(x));
  }
  for (const auto& rows : ref.lse) {
    for (double x : rows) EXPECT_TRUE(std::isfinite(x));
  }
}

TEST(Oracle, SampledPlanAgreesWithFullPlan) {
  AttentionShape s = shape_of(2, 3, 1, 40, 33, 8, true);
  uint64_t seed = fresh_seed();
  HostInputs in = make_random_inputs(s, seed);
  CheckPlan sampled = sampled_check_plan(s, seed, 3, 5);
  EXPECT_FALSE(sampled.full);
  EXPECT_EQ(sampled.heads.front().batch, 0);
  EXPECT_EQ(sampled.heads.front().head, 0);
  EXPECT_EQ(sampled.heads.back().batch, 1);
  EXPECT_EQ(sampled.heads.back().head, 2);
  ForwardReference part = reference_forward(s, in.q.data(), in.k.data(), in.v.data(), sampled);
  ForwardReference full = full_forward(s, in);
  for (size_t e = 0; e < sampled.heads.size(); ++e) {
    const HeadRows& h = sampled.heads[e];
    EXPECT_EQ(h.rows.front(), 0);
    EXPECT_EQ(h.rows.back(), s.seq_q - 1);
    size_t full_index = size_t(h.batch * s.heads_q + h.head);
    for (size_t r = 0; r < h.rows.size(); ++r) {
      // Same math on fewer rows; Eigen may block the products differently, so allow the last bits.
      double lse_part = part.lse[e][r], lse_full = full.lse[full_index][h.rows[r]];
      if (std::isinf(lse_full)) {
        EXPECT_EQ(lse_part, lse_full);  // a row that sees no key: -inf in both
      } else {
        EXPECT_NEAR(lse_part, lse_full, 1e-13);
      }
      for (int c = 0; c < s.head_dim; ++c)
        EXPECT_NEAR(part.o[e][r * 8 + c], full.o[full_index][h.rows[r] * 8 + c], 1e-13);
    }
  }
}

TEST(Oracle, ChoosesFullCheckForSmallAndSampleForLarge) {
  EXPECT_TRUE(choose_check_plan(shape_of(1, 2, 2, 128, 128, 64, false), 1).full);
  CheckPlan big = choose_check_plan(shape_of(8, 16, 16, 2048, 2048, 128, false), 1);
  EXPECT_FALSE(big.full);
  EXPECT_EQ(big.heads.size(), 4u);
  EXPECT_EQ(big.heads.front().rows.size(), 64u);
}

// ---- backward: dQ, dK, dV against central finite differences of L = sum(O * dO) ------------

double loss(const AttentionShape& s, const HostInputs& in, const std::vector<float>& d_out) {
  ForwardReference ref = full_forward(s, in);
  double total = 0;
  for (size_t e = 0; e < ref.o.size(); ++e) {
    for (size_t i = 0; i < ref.o[e].size(); ++i) total += ref.o[e][i] * d_out[e * ref.o[e].size() + i];
  }
  return total;
}

class OracleBackward : public ::testing::TestWithParam<AttentionShape> {};

TEST_P(OracleBackward, MatchesFiniteDifferences) {
  const AttentionShape s = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  HostInputs in = make_random_inputs(s, seed);
  std::vector<float> d_out(s.q_elems());
  fill_random_normal(d_out, seed, 4);
  BackwardReference grad = reference_backward(s, in.q.data(), in.k.data(), in.v.data(), d_out.data());

  // Forward values agree with the forward oracle.
  ForwardReference fwd = full_forward(s, in);
  for (size_t e = 0; e < fwd.o.size(); ++e) {
    for (size_t i = 0; i < fwd.o[e].size(); ++i) ASSERT_NEAR(grad.o[e * fwd.o[e].size() + i], fwd.o[e][i], 1e-12);
  }

  // Inputs are float, so a step is rounded where the input plus the step crosses a power of two;
  // the difference is divided by the step the float inputs really took. A central difference is
  // off by about h^2 / 6 times the loss's third derivative, which at h = 2^-10 can reach the
  // tolerance where the softmax curves sharply; Richardson's step, (4 D(h/2) - D(h)) / 3, cancels
  // that term.
  const float h = 1.0f / 1024;
  std::mt19937 rng{uint32_t(seed)};
  struct Target {
    std::vector<float>* tensor;
    const std::vector<double>* grad;
    const char* name;
  };
  for (Target t : {Target{&in.q, &grad.dq, "dQ"}, Target{&in.k, &grad.dk, "dK"}, Target{&in.v, &grad.dv, "dV"}}) {
    for (int trial = 0; trial < 12; ++trial) {
      size_t index = std::uniform_int_distribution<size_t>(0, t.tensor->size() - 1)(rng);
      const float original = (*t.tensor)[index];
      const auto central = [&](float step) {
        const float plus = original + step, minus = original - step;
        (*t.tensor)[index] = plus;
        const double up = loss(s, in, d_out);
        (*t.tensor)[index] = minus;
        const double down = loss(s, in, d_out);
        (*t.tensor)[index] = original;
        return (up - down) / (double(plus) - double(minus));
      };
      const double numeric = (4.0 * central(h / 2) - central(h)) / 3.0;
      EXPECT_NEAR((*t.grad)[index], numeric, 2e-5 * (1 + std::fabs(numeric))) << t.name << "[" << index << "]";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, OracleBackward,
                         ::testing::Values(shape_of(1, 1, 1, 5, 5, 4, false), shape_of(1, 2, 2, 6, 6, 8, true),
                                           shape_of(2, 4, 2, 5, 7, 4, true),   // GQA, seq_q < seq_kv
                                           shape_of(1, 2, 1, 7, 4, 4, true)),  // MQA, rows that see nothing
                         [](const auto& info) { return info.param.to_identifier(); });

}  // namespace
}  // namespace fa
