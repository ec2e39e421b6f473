// Chapter 09's features in the oracle, checked against rules written out here a second time:
// the window as an explicit mask, ALiBi's slopes as the numbers models use, a packed batch as
// separate batches of one, and the backward of softcap, ALiBi and the bias by finite
// differences. Then validate(), the FLOP count, and the registry turning features away from
// kernels that do not take them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "compare.h"
#include "reference.h"
#include "registry.h"
#include "runner.h"
#include "../test_shapes.h"

namespace fa {
namespace {

std::vector<float> normal_values(int64_t n, uint64_t seed, uint64_t stream) {
  std::vector<float> x(n);
  fill_random_normal(x, seed, stream);
  return x;
}

/// Attention for one (batch, head) written from the definitions: double loops, the mask as a
/// condition on (i, j), ALiBi from the given slope, softcap by std::tanh.
void direct_attention(const AttentionShape& s, const AttentionFeatures& f, const float* q, const float* k,
                      const float* v, const float* bias, double slope, std::vector<double>& o,
                      std::vector<double>& lse) {
  const int d = s.head_dim, nq = s.seq_q, nk = s.seq_kv, offset = nk - nq;
  o.assign(int64_t(nq) * d, 0.0);
  lse.assign(nq, -std::numeric_limits<double>::infinity());
  for (int i = 0; i < nq; ++i) {
    std::vector<double> x(nk, -std::numeric_limits<double>::infinity());
    double mx = -std::numeric_limits<double>::infinity();
    for (int j = 0; j < nk; ++j) {
      bool seen = true;
      if (s.causal && j > i + offset) seen = false;
      if (f.window_left >= 0 && j < i + offset - f.window_left) seen = false;
      if (f.window_right >= 0 && j > i + offset + f.window_right) seen = false;
      if (!seen) continue;
      double dot = 0;
      for (int c = 0; c < d; ++c) dot += double(q[int64_t(i) * d + c]) * k[int64_t(j) * d + c];
      double y = dot * s.softmax_scale();
      if (f.softcap > 0) y = f.softcap * std::tanh(y / f.softcap);
      if (f.alibi) y -= slope * std::abs(i + offset - j);
      if (bias) y += bias[int64_t(i) * nk + j];
      x[j] = y;
      mx = std::max(mx, y);
    }
    if (mx == -std::numeric_limits<double>::infinity()) continue;
    double sum = 0;
    for (int j = 0; j < nk; ++j) sum += x[j] == -std::numeric_limits<double>::infinity() ? 0.0 : std::exp(x[j] - mx);
    for (int j = 0; j < nk; ++j) {
      if (x[j] == -std::numeric_limits<double>::infinity()) continue;
      const double p = std::exp(x[j] - mx) / sum;
      for (int c = 0; c < d; ++c) o[int64_t(i) * d + c] += p * v[int64_t(j) * d + c];
    }
    lse[i] = mx + std::log(sum);
  }
}

void expect_close(const std::vector<double>& a, const std::vector<double>& b, double tol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      ASSERT_EQ(a[i], b[i]) << what << " at " << i;
    } else {
      ASSERT_NEAR(a[i], b[i], tol) << what << " at " << i;
    }
  }
}

TEST(FeatureOracle, AlibiSlopesAreTheOnesModelsUse) {
  // 8 heads: 2^-1 .. 2^-8.
  for (int h = 0; h < 8; ++h) EXPECT_DOUBLE_EQ(AttentionFeatures::alibi_slope(8, h), std::pow(2.0, -(h + 1))) << h;
  // 12 heads (BLOOM's rule): the 8 slopes for 8 heads, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5.
  const double expected[12] = {0.5,
                               0.25,
                               0.125,
                               0.0625,
                               0.03125,
                               0.015625,
                               0.0078125,
                               0.00390625,
                               0.7071067811865476,
                               0.35355339059327373,
                               0.17677669529663687,
                               0.08838834764831843};
  for (int h = 0; h < 12; ++h) EXPECT_NEAR(AttentionFeatures::alibi_slope(12, h), expected[h], 1e-15) << h;
}

TEST(FeatureOracle, DenseFeaturesMatchTheDefinitions) {
  const uint64_t seed = fresh_seed();
  for (const auto& [shape, f] : feature_shapes()) {
    if (f.varlen()) continue;
    SCOPED_TRACE(describe(shape, f) + ", seed " + std::to_string(seed));
    Problem problem(shape, seed, true, f);
    const HostInputs& in = problem.host(DType::F32);
    const AttentionExtras extras = problem.host_extras();
    const ForwardReference& ref = problem.reference(DType::F32);
    size_t entry = 0;
    for (int b = 0; b < shape.batch; ++b)
      for (int h = 0; h < shape.heads_q; ++h, ++entry) {
        const AttentionShape one = sequence_shape(shape, shape.seq_q, shape.seq_kv);
        const int64_t q0 = (int64_t(b) * shape.heads_q + h) * shape.seq_q;
        const int64_t kv0 = (int64_t(b) * shape.heads_kv + shape.kv_head(h)) * shape.seq_kv;
        std::vector<double> o, lse;
        direct_attention(one, f, in.q.data() + q0 * shape.head_dim, in.k.data() + kv0 * shape.head_dim,
                         in.v.data() + kv0 * shape.head_dim, f.bias ? extras.bias + q0 * shape.seq_kv : nullptr,
                         AttentionFeatures::alibi_slope(shape.heads_q, h), o, lse);
        expect_close(ref.o[entry], o, 1e-9, "O");
        expect_close(ref.lse[entry], lse, 1e-9, "LSE");
      }
  }
}

TEST(FeatureOracle, CallerSlopesReachTheOracleAndChapter09sLoop) {
  // flash-attn's alibi_slopes: one per head, or one per (batch, head). The oracle against the
  // definition with those slopes, then chapter 09's CPU loop (registered as ch09_features_cpu)
  // against the oracle.
  const uint64_t seed = fresh_seed();
  const CpuAlgorithm* loop = nullptr;
  for (const CpuAlgorithm* a : cpu_algorithms_of_chapter(9))
    if (a->name == "ch09_features_cpu") loop = a;
  ASSERT_NE(loop, nullptr);
  for (bool per_sequence : {false, true}) {
    const AttentionShape shape = shape_of(2, 4, 2, 70, 90, 64, true);
    AttentionFeatures f;
    f.alibi = true;
    f.window_left = 40;
    SCOPED_TRACE(std::string(per_sequence ? "per (batch, head)" : "per head") + ", seed " + std::to_string(seed));
    Problem problem(shape, seed, true, f);
    const HostInputs& in = problem.host(DType::F32);
    std::vector<float> slopes = normal_values(per_sequence ? shape.batch * shape.heads_q : shape.heads_q, seed, 11);
    for (float& x : slopes) x = 0.05f + 0.4f * std::fabs(x);
    AttentionExtras extras = problem.host_extras();
    extras.alibi_slopes = slopes.data();
    extras.alibi_slopes_per_sequence = per_sequence;
    const CheckPlan plan = full_check_plan(shape);
    const ForwardReference ref = reference_forward(shape, in.q.data(), in.k.data(), in.v.data(), plan, f, &extras);
    size_t entry = 0;
    for (int b = 0; b < shape.batch; ++b)
      for (int h = 0; h < shape.heads_q; ++h, ++entry) {
        const int64_t q0 = (int64_t(b) * shape.heads_q + h) * shape.seq_q;
        const int64_t kv0 = (int64_t(b) * shape.heads_kv + shape.kv_head(h)) * shape.seq_kv;
        std::vector<double> o, lse;
        direct_attention(sequence_shape(shape, shape.seq_q, shape.seq_kv), f, in.q.data() + q0 * shape.head_dim,
                         in.k.data() + kv0 * shape.head_dim, in.v.data() + kv0 * shape.head_dim, nullptr,
                         slopes[(per_sequence ? b * shape.heads_q : 0) + h], o, lse);
        expect_close(ref.o[entry], o, 1e-9, "O");
        expect_close(ref.lse[entry], lse, 1e-9, "LSE");
      }
    std::vector<float> o(std::size_t(shape.o_elems())), lse(std::size_t(shape.lse_elems()));
    loop->run_extras(shape, f, extras, in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data());
    entry = 0;
    for (int bh = 0; bh < shape.batch * shape.heads_q; ++bh, ++entry)
      for (int i = 0; i < shape.seq_q; ++i) {
        EXPECT_NEAR(lse[std::size_t(bh) * shape.seq_q + i], ref.lse[entry][std::size_t(i)], 1e-4) << bh << " " << i;
        for (int x = 0; x < shape.head_dim; ++x)
          EXPECT_NEAR(o[(std::size_t(bh) * shape.seq_q + i) * shape.head_dim + x],
                      ref.o[entry][std::size_t(i) * shape.head_dim + x], 1e-4);
      }
  }
}

TEST(FeatureOracle, PackedBatchIsSeparateBatchesOfOne) {
  const uint64_t seed = fresh_seed();
  for (const auto& [shape, f] : feature_shapes()) {
    if (!f.varlen()) continue;
    SCOPED_TRACE(describe(shape, f) + ", seed " + std::to_string(seed));
    Problem problem(shape, seed, true, f);
    const HostInputs& in = problem.host(DType::F32);
    const Packing& packing = problem.packing();
    const ForwardReference& ref = problem.reference(DType::F32);
    // random_packing's promise: from 3 sequences on, an empty sequence and a length-1 one.
    if (f.sequences >= 3) {
      EXPECT_EQ(packing.cu_q[2] - packing.cu_q[1], 0);
      EXPECT_EQ(packing.cu_q[3] - packing.cu_q[2], 1);
    }
    for (int h = 0; h < shape.heads_q; ++h) {  // the full plan of a packed batch: one entry per head
      for (int b = 0; b < f.sequences; ++b) {
        const int q0 = packing.cu_q[b], k0 = packing.cu_k[b];
        const AttentionShape one = sequence_shape(shape, packing.cu_q[b + 1] - q0, packing.cu_k[b + 1] - k0);
        if (one.seq_q == 0) continue;
        std::vector<double> o, lse;
        const int d = shape.head_dim;
        direct_attention(one, f, in.q.data() + (int64_t(h) * shape.seq_q + q0) * d,
                         in.k.data() + (int64_t(shape.kv_head(h)) * shape.seq_kv + k0) * d,
                         in.v.data() + (int64_t(shape.kv_head(h)) * shape.seq_kv + k0) * d, nullptr,
                         AttentionFeatures::alibi_slope(shape.heads_q, h), o, lse);
        expect_close(
            std::vector<double>(ref.o[h].begin() + int64_t(q0) * d, ref.o[h].begin() + int64_t(q0 + one.seq_q) * d), o,
            1e-9, "O of sequence " + std::to_string(b));
        expect_close(std::vector<double>(ref.lse[h].begin() + q0, ref.lse[h].begin() + q0 + one.seq_q), lse, 1e-9,
                     "LSE of sequence " + std::to_string(b));
      }
    }
  }
}

/// L = sum(O * dO) from the forward oracle, for finite differences.
double loss_of(const AttentionShape& s, const AttentionFeatures& f, const std::vector<float>& q,
               const std::vector<float>& k, const std::vector<float>& v, const std::vector<float>& d_out,
               const AttentionExtras& extras) {
  const ForwardReference r = reference_forward(s, q.data(), k.data(), v.data(), full_check_plan(s), f, &extras);
  double loss = 0;
  size_t at = 0;
  for (const auto& rows : r.o)
    for (double x : rows) loss += x * d_out[at++];
  return loss;
}

TEST(FeatureOracle, BackwardMatchesFiniteDifferences) {
  const uint64_t seed = fresh_seed();
  std::vector<FeatureProblem> cases;
  const AttentionShape base = shape_of(2, 2, 1, 9, 11, 8, true);
  for (int c = 0; c < 5; ++c) {
    AttentionShape s = base;
    AttentionFeatures f;
    if (c == 0) f.softcap = 2.0, s.scale = 3.0;
    if (c == 1) f.alibi = true;
    if (c == 2) f.bias = true;
    if (c == 3) f.window_left = 3, f.window_right = 0, s.causal = false;
    if (c == 4) f.sequences = 3, s.batch = 1, f.softcap = 5.0, f.alibi = true, f.window_left = 4;
    cases.push_back({s, f});
  }
  for (const auto& [s, f] : cases) {
    SCOPED_TRACE(describe(s, f) + ", seed " + std::to_string(seed));
    Problem problem(s, seed, true, f);
    const HostInputs& in = problem.host(DType::F32);
    const AttentionExtras extras = problem.host_extras();
    const std::vector<float> d_out = normal_values(s.q_elems(), seed, 11);
    const BackwardReference ref =
        reference_backward(s, in.q.data(), in.k.data(), in.v.data(), d_out.data(), f, &extras);
    // A central difference over the step the float inputs really took (x + h and x - h rounded
    // to float), so that only the truncation error, of order h^2, remains.
    const double step = 1.0 / 1024;
    auto check = [&](const std::vector<float>& x, const std::vector<double>& grad, int which) {
      for (int64_t i = 0; i < int64_t(x.size()); i += 7) {
        std::vector<float> up = x, down = x;
        up[i] += float(step);
        down[i] -= float(step);
        auto loss = [&](const std::vector<float>& t) {
          return loss_of(s, f, which == 0 ? t : in.q, which == 1 ? t : in.k, which == 2 ? t : in.v, d_out, extras);
        };
        const double numeric = (loss(up) - loss(down)) / (double(up[i]) - double(down[i]));
        ASSERT_NEAR(grad[i], numeric, 2e-3 * (1 + std::abs(numeric))) << "d"
                                                                      << "qkv"[which] << "[" << i << "]";
      }
    };
    check(in.q, ref.dq, 0);
    check(in.k, ref.dk, 1);
    check(in.v, ref.dv, 2);
  }
}

/// How far apart two oracle outputs of the same plan are, in the check's two measures of O: the
/// Frobenius distance relative to the larger of the two (one of them may be all zeros: a packed
/// batch whose rows see no key), and the largest absolute difference.
struct Distance {
  double rel_fro = 0, max_abs = 0;
};
Distance distance_between(const ForwardReference& a, const ForwardReference& b) {
  double diff = 0, norm_a = 0, norm_b = 0, max_abs = 0;
  for (size_t e = 0; e < a.o.size(); ++e)
    for (size_t i = 0; i < a.o[e].size(); ++i) {
      const double d = a.o[e][i] - b.o[e][i];
      diff += d * d;
      max_abs = std::max(max_abs, std::abs(d));
      norm_a += a.o[e][i] * a.o[e][i];
      norm_b += b.o[e][i] * b.o[e][i];
    }
  return {std::sqrt(diff / std::max(norm_a, norm_b)), max_abs};
}

// A kernel that ignores a feature must fail the shape list: on every shape, dropping any one of
// its features moves O past twice the loosest tolerance a feature kernel is checked against
// (bf16's) in at least one of the check's measures. Both matter: with a random packing, a short
// window can leave most rows as they were (a sequence with fewer keys than the window) and move
// the rest by far more than the limit. Prints the distances (chapter 09's "what goes wrong if you
// skip it").
TEST(FeatureShape, EachFeatureChangesTheAnswer) {
  const Tolerance loosest = tolerance_for(DType::BF16);
  const uint64_t seed = fresh_seed();
  for (const FeatureProblem& problem_spec : feature_shapes()) {
    const AttentionShape& shape = problem_spec.shape;
    const AttentionFeatures& features = problem_spec.features;
    Problem problem(shape, seed, true, features);
    const HostInputs& in = problem.host(DType::F32);
    const AttentionExtras extras = problem.host_extras();
    const ForwardReference& with = problem.reference(DType::F32);
    std::vector<std::pair<std::string, AttentionFeatures>> without;
    auto drop = [&](const char* name, auto change) {
      AttentionFeatures f = features;
      change(f);
      without.push_back({name, f});
    };
    if (features.windowed()) drop("window", [](AttentionFeatures& f) { f.window_left = f.window_right = -1; });
    if (features.softcap > 0) drop("softcap", [](AttentionFeatures& f) { f.softcap = 0; });
    if (features.alibi) drop("alibi", [](AttentionFeatures& f) { f.alibi = false; });
    if (features.bias) drop("bias", [](AttentionFeatures& f) { f.bias = false; });
    // Ignoring cu_seqlens: one sequence of all the packed tokens, attending across the boundaries.
    if (features.varlen()) drop("varlen", [](AttentionFeatures& f) { f.sequences = 0; });
    for (const auto& [name, f] : without) {
      const ForwardReference other =
          reference_forward(shape, in.q.data(), in.k.data(), in.v.data(), full_check_plan(shape), f, &extras);
      const Distance d = distance_between(other, with);
      std::printf("without %-8s %-60s O moves %.3g relative, %.3g at most\n", name.c_str(),
                  problem_spec.to_string().c_str(), d.rel_fro, d.max_abs);
      EXPECT_TRUE(d.rel_fro > 2 * loosest.rel_fro || d.max_abs > 2 * loosest.max_abs)
          << "dropping " << name << " from " << problem_spec.to_string() << " moves O by " << d.rel_fro
          << " relative and " << d.max_abs << " at most, seed " << seed;
    }
  }
}

TEST(FeatureShape, ValidateNamesTheBadField) {
  const AttentionShape s = shape_of(1, 2, 2, 8, 8, 64, false);
  auto message = [&](const AttentionFeatures& f, const AttentionShape& shape) {
    try {
      f.validate(shape);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  AttentionFeatures f;
  f.window_left = -2;
  EXPECT_EQ(message(f, s), "window_left must be -1 (no limit) or between 0 and 4194303, got -2");
  f = AttentionFeatures{};
  f.softcap = -1;
  EXPECT_EQ(message(f, s), "softcap must be a finite number > 0 (or 0 for none), got -1");
  f.softcap = 0;
  f.bias = true;
  f.sequences = 2;
  EXPECT_EQ(message(f, s).rfind("bias and varlen together are not supported", 0), 0u) << message(f, s);
  f.bias = false;
  AttentionShape two = s;
  two.batch = 2;
  EXPECT_EQ(message(f, two),
            "a packed batch lays its sequences along the seq axis of one batch: batch must be 1, got 2");
}

TEST(FeatureShape, NamesCarryTheFeatures) {
  const AttentionShape s = shape_of(1, 2, 2, 8, 8, 64, true);
  AttentionFeatures f;
  f.window_left = 3;
  f.softcap = 30.5;
  f.alibi = true;
  f.sequences = 2;
  EXPECT_EQ(s.to_string(), "b1 h2/2 q8 k8 d64 causal");
  EXPECT_EQ(f.to_string(), "window 3,-1 softcap 30.5 alibi varlen 2");
  EXPECT_EQ(s.to_identifier() + f.to_identifier(), "b1_h2_kv2_q8_k8_d64_causal_window3_n_softcap30p5_alibi_varlen2");
}

TEST(FeatureShape, WindowFlopsCountTheVisiblePairs) {
  const AttentionShape s = shape_of(1, 1, 1, 10, 10, 1, false);
  AttentionFeatures f;
  f.window_left = 2;
  f.window_right = 0;
  // Rows 0, 1 see 1 and 2 keys; rows 2..9 see 3.
  EXPECT_DOUBLE_EQ(f.forward_flops(s), 4.0 * (1 + 2 + 8 * 3));
  f.sequences = 2;
  EXPECT_THROW(f.forward_flops(s), std::invalid_argument);
  const int cu_q[] = {0, 4, 10}, cu_k[] = {0, 4, 10};
  EXPECT_DOUBLE_EQ(f.forward_flops(s, cu_q, cu_k), 4.0 * ((1 + 2 + 3 + 3) + (1 + 2 + 3 * 4)));
}

// WindowMask::rows(key), the backward's view, is the set of rows whose keys(row) holds the key,
// for every window, alignment and length (seq_q above, below and equal to seq_kv).
TEST(FeatureShape, WindowRowsAreTheRowsThatSeeTheKey) {
  for (const bool causal : {false, true})
    for (const int left : {-1, 0, 3, 17})
      for (const int right : {-1, 0, 2, 9})
        for (const auto& [seq_q, seq_kv] : {std::pair{13, 13}, std::pair{7, 20}, std::pair{20, 7}, std::pair{1, 5}}) {
          const AttentionShape s = shape_of(1, 1, 1, seq_q, seq_kv, 8, causal);
          AttentionFeatures f;
          f.window_left = left;
          f.window_right = right;
          const WindowMask mask(s, f);
          for (int key = 0; key < seq_kv + 3; ++key) {
            std::vector<int> seen;
            for (int row = 0; row < seq_q; ++row)
              if (key >= mask.keys(row).begin && key < mask.keys(row).end) seen.push_back(row);
            const KeyRun run = mask.rows(key);
            const std::string where = describe(s, f) + ", key " + std::to_string(key);
            if (seen.empty()) {
              EXPECT_GE(run.begin, run.end) << where;
            } else {
              EXPECT_EQ(run.begin, seen.front()) << where;
              EXPECT_EQ(run.end, seen.back() + 1) << where;
              EXPECT_EQ(int(seen.size()), seen.back() + 1 - seen.front()) << where << ": not one run";
            }
          }
        }
}

// The shape every chapter solves has no window to read: chapter 01's rule, whatever the features.
TEST(FeatureShape, TheSharedShapeKnowsOnlyTheCausalRule) {
  AttentionShape s = shape_of(1, 1, 1, 6, 6, 8, true);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(s.visible_keys(i), i + 1);
    for (int j = 0; j < 6; ++j) EXPECT_EQ(s.visible(i, j), j <= i);
  }
  static_assert(sizeof(AttentionShape) == 7 * sizeof(int) + sizeof(double) ||
                    sizeof(AttentionShape) == 8 * sizeof(int) + sizeof(double),
                "AttentionShape holds batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, causal and scale alone");
}

TEST(FeatureRegistry, KernelsWithoutFeaturesSayWhich) {
  for (const auto& [shape, f] : feature_shapes()) {
    for (const ForwardKernel& k : forward_kernels()) {
      if ((features_of(f) & ~k.features) == 0) continue;
      const std::string why = support_reason(k, shape, f);
      EXPECT_NE(why.find("chapter 09's kernels do"), std::string::npos)
          << k.name << " on " << shape.to_string() << " " << f.to_string() << ": " << why;
    }
    for (const BackwardKernel& k : backward_kernels()) {
      const bool lacks = (features_of(f) & ~k.features) != 0;
      EXPECT_TRUE(!lacks || !support_reason(k, shape, f).empty()) << k.name;
    }
    for (const CpuAlgorithm& a : cpu_algorithms()) {
      const bool lacks = (features_of(f) & ~a.features) != 0;
      EXPECT_TRUE(!lacks || !support_reason(a, shape, f).empty()) << a.name;
    }
  }
}

}  // namespace
}  // namespace fa
