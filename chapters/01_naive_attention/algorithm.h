// Chapter 01 on the CPU: the same three steps as the kernels, in float, one loop nest each.
// This is what to read next to naive_attention.cu: each loop here is one kernel there, and the
// tests check it against the fp64 oracle in CI (no GPU needed).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "not_implemented.h"
#include "problem.h"

namespace fa::naive {

/// How the two products are computed; the same switch the kernels have (naive_kernels.cuh).
enum class Products { PerThread, Tiled };

/// Output tile and inner step of the tiled products, as in the kernels.
constexpr int kTileCpu = 64;
constexpr int kTileDepthCpu = 16;

/// Step 1 for one head: S[i][j] = scale * q_i . k_j, or -inf where the causal mask hides key j.
/// PerThread: one dot product per (i, j), like one thread each. Tiled: the loops blocked the way
/// the tiled kernel's blocks are, a 64 x 64 tile of S at a time, 16 dimensions per step. Every
/// S[i][j] still sums its products in the order c = 0, 1, ..., so both give the same bits.
inline void scores_cpu(const AttentionShape& s, const float* q_head, const float* k_head, std::vector<float>& scores,
                       Products products) {
  // BEGIN SOLUTION ch01_scores_cpu: S = scale * Q K^T for one head into `scores` (seq_q x seq_kv, resized here), -inf where s.visible(i, j) is false; PerThread: one dot product per (i, j); Tiled: 64 x 64 tiles of S, 16 dimensions per step, each S[i][j] still summed in the order c = 0, 1, ...
  scores.assign(std::size_t(s.seq_q) * s.seq_kv, 0.0f);
  const float scale = float(s.softmax_scale());
  const int d = s.head_dim;
  if (products == Products::PerThread) {
    for (int i = 0; i < s.seq_q; ++i) {
      for (int j = 0; j < s.seq_kv; ++j) {
        float dot = 0.0f;
        for (int c = 0; c < d; ++c) dot += q_head[int64_t(i) * d + c] * k_head[int64_t(j) * d + c];
        scores[std::size_t(i) * s.seq_kv + j] = dot;
      }
    }
  } else {
    for (int i0 = 0; i0 < s.seq_q; i0 += kTileCpu) {  // one block's tile of S
      for (int j0 = 0; j0 < s.seq_kv; j0 += kTileCpu) {
        for (int c0 = 0; c0 < d; c0 += kTileDepthCpu) {  // one shared-memory step
          for (int i = i0; i < std::min(i0 + kTileCpu, s.seq_q); ++i) {
            for (int j = j0; j < std::min(j0 + kTileCpu, s.seq_kv); ++j) {
              float& acc = scores[std::size_t(i) * s.seq_kv + j];
              for (int c = c0; c < std::min(c0 + kTileDepthCpu, d); ++c)
                acc += q_head[int64_t(i) * d + c] * k_head[int64_t(j) * d + c];
            }
          }
        }
      }
    }
  }
  for (int i = 0; i < s.seq_q; ++i) {
    for (int j = 0; j < s.seq_kv; ++j) {
      float& x = scores[std::size_t(i) * s.seq_kv + j];
      x = s.visible(i, j) ? x * scale : -INFINITY;
    }
  }
  // END SOLUTION
}

/// Step 3 for one head: O[i][c] = sum_j P[i][j] V[j][c], plain or in 64 x 64 x 16 blocks.
inline void apply_values_cpu(const AttentionShape& s, const std::vector<float>& probs, const float* v_head,
                             float* o_head, Products products) {
  const int d = s.head_dim;
  const int step = products == Products::Tiled ? kTileDepthCpu : s.seq_kv;
  std::fill(o_head, o_head + int64_t(s.seq_q) * d, 0.0f);
  for (int j0 = 0; j0 < s.seq_kv; j0 += step) {
    for (int i = 0; i < s.seq_q; ++i) {
      for (int c = 0; c < d; ++c) {
        float acc = o_head[int64_t(i) * d + c];
        for (int j = j0; j < std::min(j0 + step, s.seq_kv); ++j)
          acc += probs[std::size_t(i) * s.seq_kv + j] * v_head[int64_t(j) * d + c];
        o_head[int64_t(i) * d + c] = acc;
      }
    }
  }
}

/// Runs `softmax_rows(scores, lse_head)` between steps 1 and 3 for every (batch, head).
//! [three_steps_cpu]
template <class SoftmaxRows>
void materialized_attention_cpu(const AttentionShape& s, const float* q, const float* k, const float* v, float* o,
                                float* lse, Products products, SoftmaxRows softmax_rows) {
  std::vector<float> scores;
  for (int bh = 0; bh < s.batch * s.heads_q; ++bh) {
    scores_cpu(s, q + s.q_head_offset(bh), k + s.kv_head_offset(bh), scores, products);
    softmax_rows(scores, lse + int64_t(bh) * s.seq_q);
    apply_values_cpu(s, scores, v + s.kv_head_offset(bh), o + s.q_head_offset(bh), products);
  }
}
//! [three_steps_cpu]

/// Step 2, naive: P = exp(s) / sum exp(s). Overflows to inf (then NaN) once a logit > ~88.
//! [naive_softmax_cpu]
inline void naive_attention_cpu(const AttentionShape& s, const float* q, const float* k, const float* v, float* o,
                                float* lse, Products products) {
  materialized_attention_cpu(s, q, k, v, o, lse, products, [&](std::vector<float>& scores, float* lse_head) {
    for (int i = 0; i < s.seq_q; ++i) {
      float* row = scores.data() + std::size_t(i) * s.seq_kv;
      float sum = 0.0f;
      for (int j = 0; j < s.seq_kv; ++j) sum += std::exp(row[j]);
      float inv_sum = sum > 0.0f ? 1.0f / sum : 0.0f;
      for (int j = 0; j < s.seq_kv; ++j) row[j] = std::exp(row[j]) * inv_sum;
      lse_head[i] = std::log(sum);
    }
  });
}
//! [naive_softmax_cpu]

}  // namespace fa::naive
