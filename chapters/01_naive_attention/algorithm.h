// Chapter 01 on the CPU: the same three steps as the kernels, in float, one loop nest each.
// This is what to read next to naive_attention.cu: each loop here is one kernel there, and the
// tests check it against the fp64 oracle in CI (no GPU needed).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "problem.h"

namespace fa::naive {

/// Step 1 for one head: S[i][j] = scale * q_i . k_j, or -inf where the causal mask hides key j.
inline void scores_cpu(const AttentionShape& s, const float* q_head, const float* k_head, std::vector<float>& scores) {
  scores.assign(std::size_t(s.seq_q) * s.seq_kv, 0.0f);
  const float scale = float(s.softmax_scale());
  for (int i = 0; i < s.seq_q; ++i) {
    for (int j = 0; j < s.seq_kv; ++j) {
      float dot = 0.0f;
      for (int c = 0; c < s.head_dim; ++c) dot += q_head[int64_t(i) * s.head_dim + c] * k_head[int64_t(j) * s.head_dim + c];
      scores[std::size_t(i) * s.seq_kv + j] = s.visible(i, j) ? dot * scale : -INFINITY;
    }
  }
}

/// Step 3 for one head: O[i][c] = sum_j P[i][j] V[j][c].
inline void apply_values_cpu(const AttentionShape& s, const std::vector<float>& probs, const float* v_head, float* o_head) {
  for (int i = 0; i < s.seq_q; ++i) {
    for (int c = 0; c < s.head_dim; ++c) {
      float acc = 0.0f;
      for (int j = 0; j < s.seq_kv; ++j) acc += probs[std::size_t(i) * s.seq_kv + j] * v_head[int64_t(j) * s.head_dim + c];
      o_head[int64_t(i) * s.head_dim + c] = acc;
    }
  }
}

/// Runs `softmax_rows(scores, lse_head)` between steps 1 and 3 for every (batch, head).
template <class SoftmaxRows>
void materialized_attention_cpu(const AttentionShape& s, const float* q, const float* k, const float* v, float* o,
                                float* lse, SoftmaxRows softmax_rows) {
  std::vector<float> scores;
  for (int bh = 0; bh < s.batch * s.heads_q; ++bh) {
    scores_cpu(s, q + s.q_head_offset(bh), k + s.kv_head_offset(bh), scores);
    softmax_rows(scores, lse + int64_t(bh) * s.seq_q);
    apply_values_cpu(s, scores, v + s.kv_head_offset(bh), o + s.q_head_offset(bh));
  }
}

/// Step 2, naive: P = exp(s) / sum exp(s). Overflows to inf (then NaN) once a logit > ~88.
inline void naive_attention_cpu(const AttentionShape& s, const float* q, const float* k, const float* v, float* o,
                                float* lse) {
  materialized_attention_cpu(s, q, k, v, o, lse, [&](std::vector<float>& scores, float* lse_head) {
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

}  // namespace fa::naive
