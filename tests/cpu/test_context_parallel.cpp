// Chapter 10's CPU side: ring attention and DeepSpeed-Ulysses, forward and backward, N ranks
// simulated in one process, against the fp64 oracle on the whole sequence. Every rank count from
// 1 to 8, contiguous and zigzag splits, causal or not, GQA and MQA, lengths the split divides
// and lengths it does not (down to ranks holding no token at all), and packed documents. Then
// the work plan: the zigzag split evens out the causal work, the contiguous split does not, and
// the GPU's chunk-pair launches cover exactly the planned scores.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "../../chapters/10_context_parallel/algorithm.h"
#include "../../chapters/10_context_parallel/ulysses.h"
#include "attention_features.h"
#include "feature_inputs.h"
#include "random.h"
#include "reference.h"
#include "../test_shapes.h"

namespace fa::context_parallel {

// gtest prints parameters in failures: the split's name, not its bytes.
void PrintTo(Split kind, std::ostream* out) { *out << split_name(kind); }

namespace {

double max_abs_diff(const std::vector<float>& got, const std::vector<double>& want) {
  double m = 0;
  for (std::size_t i = 0; i < got.size(); ++i) m = std::max(m, std::fabs(got[i] - want[i]));
  return m;
}

/// Fresh random Q, K, V and dO for `s`, the oracle's forward and backward on the whole
/// sequence, and the inputs cut into shards by `split`.
struct Problem {
  AttentionShape shape;
  SequenceSplit split;
  uint64_t seed = 0;
  std::vector<float> q, k, v, d_o;
  BackwardReference ref;  // o, lse, dq, dk, dv of the whole sequence, in fp64
  Shards q_shards, k_shards, v_shards, do_shards;

  Problem(const AttentionShape& s, int ranks, Split kind) : shape(s), split(split_sequence(s.seq_q, ranks, kind)) {
    seed = fresh_seed();
    q.resize(s.q_elems()), d_o.resize(s.o_elems()), k.resize(s.kv_elems()), v.resize(s.kv_elems());
    for (int64_t i = 0; i < s.q_elems(); ++i) q[i] = random_normal(seed, 0, i), d_o[i] = random_normal(seed, 3, i);
    for (int64_t i = 0; i < s.kv_elems(); ++i) k[i] = random_normal(seed, 1, i), v[i] = random_normal(seed, 2, i);
    ref = reference_backward(s, q.data(), k.data(), v.data(), d_o.data());
    q_shards = scatter_rows(q.data(), q_outer(), s.head_dim, split);
    k_shards = scatter_rows(k.data(), kv_outer(), s.head_dim, split);
    v_shards = scatter_rows(v.data(), kv_outer(), s.head_dim, split);
    do_shards = scatter_rows(d_o.data(), q_outer(), s.head_dim, split);
  }
  int64_t q_outer() const { return int64_t(shape.batch) * shape.heads_q; }
  int64_t kv_outer() const { return int64_t(shape.batch) * shape.heads_kv; }
  std::string describe() const {
    return shape.to_string() + ", " + std::to_string(split.ranks) + " ranks, " + split_name(split.kind) +
           " split, seed " + std::to_string(seed);
  }
};

/// The forward's outputs against the oracle's: O by relative error, LSE by absolute error
/// (every row of self-attention sees at least itself, so no LSE is -inf).
void expect_forward_matches(const Problem& p, const Shards& o, const Shards& lse) {
  const std::vector<float> o_all = gather_rows(o, p.q_outer(), p.shape.head_dim, p.split);
  const std::vector<float> lse_all = gather_rows(lse, p.q_outer(), 1, p.split);
  EXPECT_LT(rel_error(o_all, p.ref.o), 1e-5) << "O on " << p.describe();
  EXPECT_LT(max_abs_diff(lse_all, p.ref.lse), 1e-4) << "LSE on " << p.describe();
}

/// The backward's shards of dQ, dK and dV against the oracle's, by relative error.
void expect_backward_matches(const Problem& p, const Shards& dq, const Shards& dk, const Shards& dv) {
  const int d = p.shape.head_dim;
  EXPECT_LT(rel_error(gather_rows(dq, p.q_outer(), d, p.split), p.ref.dq), 1e-4) << "dQ on " << p.describe();
  EXPECT_LT(rel_error(gather_rows(dk, p.kv_outer(), d, p.split), p.ref.dk), 1e-4) << "dK on " << p.describe();
  EXPECT_LT(rel_error(gather_rows(dv, p.kv_outer(), d, p.split), p.ref.dv), 1e-4) << "dV on " << p.describe();
}

// Shapes per rank count: one that 2N divides, GQA with batch 2, MQA on a prime length (no
// split divides it), and 5 tokens (from 3 ranks on, the zigzag split leaves chunks empty; from
// 6 on, the contiguous split leaves whole ranks without a token).
std::vector<AttentionShape> shapes_for(int ranks, bool causal) {
  return {shape_of(1, 2, 2, 16 * ranks, 16 * ranks, 32, causal), shape_of(2, 4, 2, 8 * ranks, 8 * ranks, 64, causal),
          shape_of(1, 3, 1, 97, 97, 32, causal), shape_of(1, 2, 2, 5, 5, 16, causal)};
}

using RingCase = std::tuple<int, Split, bool>;  // ranks, split, causal

std::string ring_case_name(const ::testing::TestParamInfo<RingCase>& info) {
  const auto& [ranks, kind, causal] = info.param;
  return std::to_string(ranks) + "ranks_" + split_name(kind) + (causal ? "_causal" : "");
}

class RingAttention : public ::testing::TestWithParam<RingCase> {};

TEST_P(RingAttention, ForwardMatchesOracle) {
  const auto& [ranks, kind, causal] = GetParam();
  for (const AttentionShape& s : shapes_for(ranks, causal)) {
    const Problem p(s, ranks, kind);
    const RingForward f = ring_attention_forward(s, p.split, p.q_shards, p.k_shards, p.v_shards);
    expect_forward_matches(p, f.o, f.lse);
    // The loops computed exactly the scores the plan names, and K/V went N - 1 hops.
    for (int r = 0; r < ranks; ++r) {
      for (int t = 0; t < ranks; ++t)
        EXPECT_EQ(f.counts.work[r][t], p.q_outer() * step_work(p.split, r, t, causal))
            << "rank " << r << " step " << t << " on " << p.describe();
      int64_t expected_sent = 0;
      for (int t = 0; t + 1 < ranks; ++t)
        expected_sent += 2 * p.kv_outer() * p.split.rows(source_rank(r, t, ranks)) * s.head_dim;
      EXPECT_EQ(f.counts.floats_sent[r], expected_sent) << "rank " << r << " on " << p.describe();
    }
  }
}

TEST_P(RingAttention, BackwardMatchesOracle) {
  const auto& [ranks, kind, causal] = GetParam();
  for (const AttentionShape& s : shapes_for(ranks, causal)) {
    const Problem p(s, ranks, kind);
    // The forward's O and LSE as the ring forward left them (float), as in training.
    const RingForward f = ring_attention_forward(s, p.split, p.q_shards, p.k_shards, p.v_shards);
    const RingBackward b =
        ring_attention_backward(s, p.split, p.q_shards, p.k_shards, p.v_shards, f.o, f.lse, p.do_shards);
    expect_backward_matches(p, b.dq, b.dk, b.dv);
    for (int r = 0; r < ranks; ++r) {
      for (int t = 0; t < ranks; ++t)
        EXPECT_EQ(b.counts.work[r][t], p.q_outer() * step_work(p.split, r, t, causal)) << p.describe();
      // K and V make N - 1 hops, dK and dV N (the last one home); one rank sends nothing.
      int64_t expected_sent = 0;
      for (int t = 0; t < ranks && ranks > 1; ++t)
        expected_sent += (t + 1 < ranks ? 4 : 2) * p.kv_outer() * p.split.rows(source_rank(r, t, ranks)) * s.head_dim;
      EXPECT_EQ(b.counts.floats_sent[r], expected_sent) << "rank " << r << " on " << p.describe();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, RingAttention,
                         ::testing::Combine(::testing::Range(1, 9), ::testing::Values(Split::Contiguous, Split::Zigzag),
                                            ::testing::Bool()),
                         ring_case_name);

// Packed documents (chapter 09's varlen batch): the split cuts across them, and a query sees
// only its own document's keys, wherever the ring brings them from.
using PackedCase = std::tuple<int, Split, bool>;  // ranks, split, causal

class RingPacked : public ::testing::TestWithParam<PackedCase> {};

TEST_P(RingPacked, ForwardAndBackwardMatchOracle) {
  const auto& [ranks, kind, causal] = GetParam();
  for (int seq : {97, 16 * ranks + 3}) {
    const AttentionShape s = shape_of(1, 4, 2, seq, seq, 32, causal);
    AttentionFeatures features;
    features.sequences = 5;
    const uint64_t seed = fresh_seed();
    const Packing packing = random_packing(s, features, seed);  // empty documents among them
    AttentionExtras extras;
    extras.cu_seqlens_q = extras.cu_seqlens_k = packing.cu_q.data();
    for (std::size_t i = 0; i + 1 < packing.cu_q.size(); ++i)
      extras.max_seqlen_q = extras.max_seqlen_k = std::max(extras.max_seqlen_q, packing.cu_q[i + 1] - packing.cu_q[i]);
    std::vector<float> q(s.q_elems()), k(s.kv_elems()), v(s.kv_elems()), d_o(s.o_elems());
    for (int64_t i = 0; i < s.q_elems(); ++i) q[i] = random_normal(seed, 0, i), d_o[i] = random_normal(seed, 3, i);
    for (int64_t i = 0; i < s.kv_elems(); ++i) k[i] = random_normal(seed, 1, i), v[i] = random_normal(seed, 2, i);
    const BackwardReference ref = reference_backward(s, q.data(), k.data(), v.data(), d_o.data(), features, &extras);
    const SequenceSplit split = split_sequence(seq, ranks, kind);
    const Documents docs{packing.cu_q};
    const int d = s.head_dim;
    const auto shard = [&](const std::vector<float>& t, int heads) { return scatter_rows(t.data(), heads, d, split); };
    const Shards qs = shard(q, s.heads_q), ks = shard(k, s.heads_kv), vs = shard(v, s.heads_kv),
                 dos = shard(d_o, s.heads_q);
    const RingForward f = ring_attention_forward(s, split, qs, ks, vs, &docs);
    const RingBackward b = ring_attention_backward(s, split, qs, ks, vs, f.o, f.lse, dos, &docs);
    const std::string what = std::to_string(ranks) + " ranks, " + split_name(kind) + ", seq " + std::to_string(seq) +
                             (causal ? ", causal" : "") + ", seed " + std::to_string(seed);
    EXPECT_LT(rel_error(gather_rows(f.o, s.heads_q, d, split), ref.o), 1e-5) << "O, " << what;
    EXPECT_LT(max_abs_diff(gather_rows(f.lse, s.heads_q, 1, split), ref.lse), 1e-4) << "LSE, " << what;
    EXPECT_LT(rel_error(gather_rows(b.dq, s.heads_q, d, split), ref.dq), 1e-4) << "dQ, " << what;
    EXPECT_LT(rel_error(gather_rows(b.dk, s.heads_kv, d, split), ref.dk), 1e-4) << "dK, " << what;
    EXPECT_LT(rel_error(gather_rows(b.dv, s.heads_kv, d, split), ref.dv), 1e-4) << "dV, " << what;
    for (int r = 0; r < ranks; ++r)
      for (int t = 0; t < ranks; ++t)
        EXPECT_EQ(f.counts.work[r][t], s.heads_q * step_work(split, r, t, causal, &docs)) << what;
  }
}

TEST_P(RingPacked, VarlenPairsComputeExactlyThePlannedScores) {
  // Each packed pair as chapter 09's varlen problem (packed_pairs_for): its sequences' scores
  // (causal squares on the diagonal, rectangles elsewhere) add up to what step_work plans.
  const auto& [ranks, kind, causal] = GetParam();
  for (int seq : {97, 16 * ranks + 3, 5}) {
    const AttentionShape s = shape_of(1, 2, 1, seq, seq, 16, causal);
    AttentionFeatures features;
    features.sequences = 4;
    const Documents docs{random_packing(s, features, fresh_seed()).cu_q};
    const SequenceSplit split = split_sequence(seq, ranks, kind);
    for (int r = 0; r < ranks; ++r)
      for (int t = 0; t < ranks; ++t) {
        int64_t scores = 0;
        for (const PackedPairLaunch& p : packed_pairs_for(s, split, r, source_rank(r, t, ranks), docs)) {
          ASSERT_EQ(p.cu_q.size(), p.cu_k.size());
          ASSERT_EQ(p.cu_q.back(), p.pair.shape.seq_q);
          ASSERT_EQ(p.cu_k.back(), p.pair.shape.seq_kv);
          for (std::size_t i = 0; i + 1 < p.cu_q.size(); ++i) {
            const int64_t q = p.cu_q[i + 1] - p.cu_q[i], k = p.cu_k[i + 1] - p.cu_k[i];
            if (p.pair.shape.causal) {
              ASSERT_EQ(q, k) << "a diagonal pair's sequence is a square";
            }
            scores += p.pair.shape.causal ? q * (q + 1) / 2 : q * k;
          }
        }
        EXPECT_EQ(scores, step_work(split, r, t, causal, &docs))
            << ranks << " ranks, " << split_name(kind) << ", seq " << seq << ", rank " << r << ", step " << t;
      }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, RingPacked,
                         ::testing::Combine(::testing::Range(1, 9), ::testing::Values(Split::Contiguous, Split::Zigzag),
                                            ::testing::Bool()),
                         ring_case_name);

TEST(RingPacked, BadDocumentsAreRefused) {
  const AttentionShape s = shape_of(1, 2, 2, 16, 16, 16, true);
  const SequenceSplit split = split_sequence(16, 2, Split::Zigzag);
  const Shards q(2, std::vector<float>(2 * 8 * 16)), kv(2, std::vector<float>(2 * 8 * 16));
  for (const std::vector<int>& starts : std::vector<std::vector<int>>{{0, 9}, {1, 16}, {0, 10, 4, 16}, {0}}) {
    const Documents docs{starts};
    EXPECT_THROW(ring_attention_forward(s, split, q, kv, kv, &docs), std::invalid_argument);
  }
  const AttentionShape two = shape_of(2, 2, 2, 16, 16, 16, true);
  const Documents docs{{0, 16}};
  const Shards q2(2, std::vector<float>(2 * 2 * 8 * 16)), kv2(2, std::vector<float>(2 * 2 * 8 * 16));
  EXPECT_THROW(ring_attention_forward(two, split, q2, kv2, kv2, &docs), std::invalid_argument);
}

TEST(ContextParallelSplit, PositionsCoverTheSequenceOnce) {
  for (int ranks = 1; ranks <= 8; ++ranks)
    for (Split kind : {Split::Contiguous, Split::Zigzag})
      for (int seq : {1, 5, 16, 97, 128}) {
        const SequenceSplit split = split_sequence(seq, ranks, kind);
        std::vector<int> seen(seq, 0);
        int most = 0, fewest = seq;
        for (int r = 0; r < ranks; ++r) {
          for (int pos : split.positions(r)) ++seen[pos];
          most = std::max(most, split.rows(r));
          fewest = std::min(fewest, split.rows(r));
        }
        for (int pos = 0; pos < seq; ++pos) EXPECT_EQ(seen[pos], 1) << "position " << pos;
        EXPECT_LE(most - fewest, kind == Split::Zigzag ? 2 : 1) << seq << " tokens on " << ranks << " ranks";
      }
  // Zigzag on 4 ranks of 16 tokens: rank 1 holds chunks 1 and 6 of 8.
  EXPECT_EQ(split_sequence(16, 4, Split::Zigzag).positions(1), (std::vector<int>{2, 3, 12, 13}));
}

TEST(ContextParallelSplit, BadSizesAreRefused) {
  EXPECT_THROW(split_sequence(16, 0, Split::Zigzag), std::invalid_argument);
  EXPECT_THROW(split_sequence(0, 4, Split::Contiguous), std::invalid_argument);
  const AttentionShape cross = shape_of(1, 2, 2, 16, 32, 32, false);  // not self-attention
  const SequenceSplit split = split_sequence(16, 2, Split::Contiguous);
  const Shards q(2, std::vector<float>(2 * 8 * 32)), kv(2, std::vector<float>(2 * 16 * 32));
  try {
    ring_attention_forward(cross, split, q, kv, kv);
    FAIL() << "seq_q != seq_kv was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("seq_q (16) must equal seq_kv (32)"), std::string::npos) << e.what();
  }
}

/// Causal work per rank over the whole ring (one batch and head), for a long sequence.
std::vector<int64_t> rank_work(int seq, int ranks, Split kind) {
  const SequenceSplit split = split_sequence(seq, ranks, kind);
  std::vector<int64_t> work(ranks, 0);
  for (int r = 0; r < ranks; ++r)
    for (int t = 0; t < ranks; ++t) work[r] += step_work(split, r, t, /*causal=*/true);
  return work;
}

TEST(ContextParallelWork, ZigzagBalancesCausalWorkContiguousDoesNot) {
  for (int ranks = 2; ranks <= 8; ++ranks) {
    const int seq = 1024 * 2 * ranks;
    const std::vector<int64_t> contiguous = rank_work(seq, ranks, Split::Contiguous);
    const std::vector<int64_t> zigzag = rank_work(seq, ranks, Split::Zigzag);
    // Every causal pair is computed exactly once, whichever the split: S (S + 1) / 2.
    const int64_t pairs = int64_t(seq) * (seq + 1) / 2;
    int64_t sum_c = 0, sum_z = 0;
    for (int r = 0; r < ranks; ++r) sum_c += contiguous[r], sum_z += zigzag[r];
    EXPECT_EQ(sum_c, pairs);
    EXPECT_EQ(sum_z, pairs);
    // Contiguous: rank 0 has only its diagonal block, c (c + 1) / 2 pairs; the last rank has
    // N - 1 full blocks more, (N - 1) c^2 + c (c + 1) / 2: about 2N - 1 times as much.
    const double c = seq / ranks;
    EXPECT_EQ(contiguous.front(), int64_t(c * (c + 1) / 2));
    EXPECT_NEAR(double(contiguous.back()) / contiguous.front(), 2 * ranks - 1, 0.01 * (2 * ranks - 1));
    // Zigzag: (2N - 1) full chunk pairs and two diagonal ones on every rank, the same count.
    const auto [fewest, most] = std::minmax_element(zigzag.begin(), zigzag.end());
    EXPECT_EQ(*most, *fewest) << ranks << " ranks";
    // A length 2N does not divide stays within 1%.
    const std::vector<int64_t> uneven = rank_work(seq - 3, ranks, Split::Zigzag);
    const auto [low, high] = std::minmax_element(uneven.begin(), uneven.end());
    EXPECT_LT(double(*high) / *low, 1.01) << ranks << " ranks";
  }
}

TEST(ContextParallelWork, ZigzagStepsAreBalancedToo) {
  // The ring runs in lockstep: a step lasts as long as its busiest rank. Zigzag gives every rank
  // 2 (S / 2N)^2 pairs at every step after the first; contiguous leaves the ranks r < t idle at step t.
  const int ranks = 4, seq = 64 * 2 * ranks;
  const SequenceSplit zigzag = split_sequence(seq, ranks, Split::Zigzag);
  const SequenceSplit contiguous = split_sequence(seq, ranks, Split::Contiguous);
  const int64_t chunk = seq / (2 * ranks);
  for (int t = 1; t < ranks; ++t)
    for (int r = 0; r < ranks; ++r) {
      EXPECT_EQ(step_work(zigzag, r, t, true), 2 * chunk * chunk) << "rank " << r << " step " << t;
      EXPECT_EQ(step_work(contiguous, r, t, true), r < t ? 0 : 4 * chunk * chunk) << "rank " << r << " step " << t;
    }
}

TEST(ContextParallelWork, GpuPairsComputeExactlyThePlannedScores) {
  // The GPU ring launches one attention problem per (query chunk, key chunk) pair (pairs_for);
  // together they must cover exactly the scores step_work plans, on every rank and step: no pair
  // missed, none twice, each diagonal a plain causal square. Lengths 2N divides, a prime, and 5
  // (empty zigzag chunks from N = 3).
  for (int ranks = 1; ranks <= 8; ++ranks)
    for (int seq : {16 * ranks, 97, 5})
      for (Split kind : {Split::Contiguous, Split::Zigzag})
        for (bool causal : {false, true}) {
          const SequenceSplit split = split_sequence(seq, ranks, kind);
          AttentionShape s{1, 2, 1, seq, seq, 32, causal, 0.0};
          for (int r = 0; r < ranks; ++r)
            for (int t = 0; t < ranks; ++t) {
              int64_t scores = 0;
              for (const PairLaunch& p : pairs_for(s, split, r, source_rank(r, t, ranks))) {
                ASSERT_GT(p.shape.seq_q, 0);
                ASSERT_GT(p.shape.seq_kv, 0);
                if (p.shape.causal) {
                  ASSERT_EQ(p.shape.seq_q, p.shape.seq_kv);
                }
                EXPECT_DOUBLE_EQ(p.shape.softmax_scale(), s.softmax_scale());
                scores += p.shape.causal ? int64_t(p.shape.seq_q) * (p.shape.seq_q + 1) / 2
                                         : int64_t(p.shape.seq_q) * p.shape.seq_kv;
              }
              EXPECT_EQ(scores, step_work(split, r, t, causal))
                  << ranks << " ranks, seq " << seq << ", " << split_name(kind) << (causal ? ", causal" : "")
                  << ", rank " << r << ", step " << t;
            }
        }
}

// ---------------------------------------------------------------------------------------------
// Ulysses

using UlyssesCase = std::tuple<int, int, Split, bool>;  // ranks, heads_kv, split, causal

std::string ulysses_case_name(const ::testing::TestParamInfo<UlyssesCase>& info) {
  const auto& [ranks, heads_kv, kind, causal] = info.param;
  return std::to_string(ranks) + "ranks_kv" + std::to_string(heads_kv) + "_" + split_name(kind) +
         (causal ? "_causal" : "");
}

class Ulysses : public ::testing::TestWithParam<UlyssesCase> {};

TEST_P(Ulysses, ForwardMatchesOracle) {
  const auto& [ranks, heads_kv, kind, causal] = GetParam();
  // 8 query heads: K/V heads split over the ranks (8), copied to several (1 and 2 on 4 or 8 ranks).
  for (int seq : {8 * ranks, 61}) {
    const AttentionShape s = shape_of(2, 8, heads_kv, seq, seq, 32, causal);
    const Problem p(s, ranks, kind);
    const UlyssesForward f = ulysses_attention_forward(s, p.split, p.q_shards, p.k_shards, p.v_shards);
    expect_forward_matches(p, f.o, f.lse);
    // Every rank computes the same share: the whole sequence for heads_q / N heads.
    for (int r = 0; r < ranks; ++r) EXPECT_EQ(f.work[r], f.work[0]) << p.describe();
    if (seq % ranks == 0) {
      // Each rank keeps 1/N of what it holds and sends the rest: Q, K, V in; O and LSE out.
      const int64_t rows = seq / ranks;
      const int64_t kv_sent =
          2 * (ranks - 1) * int64_t(s.batch) * (s.heads_kv % ranks == 0 ? s.heads_kv / ranks : 1) * rows * s.head_dim;
      const int64_t q_sent = (ranks - 1) * int64_t(s.batch) * (s.heads_q / ranks) * rows * (2 * s.head_dim + 1);
      for (int r = 0; r < ranks; ++r) EXPECT_EQ(f.floats_sent[r], kv_sent + q_sent) << p.describe();
    }
  }
}

TEST_P(Ulysses, BackwardMatchesOracle) {
  const auto& [ranks, heads_kv, kind, causal] = GetParam();
  for (int seq : {8 * ranks, 61}) {
    const AttentionShape s = shape_of(2, 8, heads_kv, seq, seq, 32, causal);
    const Problem p(s, ranks, kind);
    const UlyssesForward f = ulysses_attention_forward(s, p.split, p.q_shards, p.k_shards, p.v_shards);
    const UlyssesBackward b =
        ulysses_attention_backward(s, p.split, p.q_shards, p.k_shards, p.v_shards, f.o, f.lse, p.do_shards);
    expect_backward_matches(p, b.dq, b.dk, b.dv);
  }
}

INSTANTIATE_TEST_SUITE_P(Heads, Ulysses,
                         ::testing::Combine(::testing::Values(1, 2, 4, 8), ::testing::Values(8, 2, 1),
                                            ::testing::Values(Split::Contiguous, Split::Zigzag), ::testing::Bool()),
                         ulysses_case_name);

std::string ulysses_error(const AttentionShape& s, int ranks) {
  const Problem p(s, ranks, Split::Contiguous);
  try {
    ulysses_attention_forward(s, p.split, p.q_shards, p.k_shards, p.v_shards);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(UlyssesHeads, RanksThatDoNotDivideTheHeadsAreRefused) {
  EXPECT_EQ(ulysses_error(shape_of(1, 6, 6, 16, 16, 16, false), 4),
            "Ulysses splits the query heads over the ranks: heads_q (6) must be a multiple of ranks (4); "
            "allowed ranks: 1, 2, 3, 6");
  EXPECT_EQ(ulysses_error(shape_of(1, 12, 6, 16, 16, 16, true), 4),
            "Ulysses splits the K/V heads over the ranks, or copies each to several ranks: heads_kv (6) and "
            "ranks (4) must divide one another");
  // The ring has no such limit: 6 heads on 4 ranks.
  const AttentionShape s = shape_of(1, 6, 6, 16, 16, 16, true);
  const Problem p(s, 4, Split::Zigzag);
  const RingForward f = ring_attention_forward(s, p.split, p.q_shards, p.k_shards, p.v_shards);
  expect_forward_matches(p, f.o, f.lse);
}

}  // namespace
}  // namespace fa::context_parallel
