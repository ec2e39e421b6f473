// Chapter 03 on the CPU: the online softmax, first over a materialized row (variant 1), then
// fused into attention so no score matrix exists at all (variant 2). Same loops, same step
// size and same order of operations as the kernels in online_softmax.cu.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "../01_naive_attention/algorithm.h"
#include "not_implemented.h"

namespace fa::online {

/// Variant 1, one row in place: pass 1 keeps a running max m and a running sum l of
/// exp(s - m), rescaling l whenever m grows; pass 2 writes P. Returns the row's LSE.
//! [online_softmax_row_cpu]
inline float online_softmax_row(float* row, int n) {
  // BEGIN SOLUTION ch03_online_row: one pass keeping a running max m and sum l of exp(s - m), then P = exp(s - m) / l; return m + log(l) (all-masked rows: P = 0, return -inf)
  float m = -INFINITY, l = 0.0f;
  for (int j = 0; j < n; ++j) {
    float m_new = std::fmax(m, row[j]);
    if (m_new == -INFINITY) continue;  // nothing visible yet
    l = l * std::exp(m - m_new) + std::exp(row[j] - m_new);
    m = m_new;
  }
  if (m == -INFINITY) {
    std::fill(row, row + n, 0.0f);
    return -INFINITY;
  }
  for (int j = 0; j < n; ++j) row[j] = std::exp(row[j] - m) / l;
  return m + std::log(l);
  // END SOLUTION
}
//! [online_softmax_row_cpu]

inline void online_softmax_attention_cpu(const AttentionShape& s, const float* q, const float* k, const float* v,
                                         float* o, float* lse) {
  naive::materialized_attention_cpu(
      s, q, k, v, o, lse, naive::Products::Tiled, [&](std::vector<float>& scores, float* lse_head) {
        for (int i = 0; i < s.seq_q; ++i)
          lse_head[i] = online_softmax_row(scores.data() + std::size_t(i) * s.seq_kv, s.seq_kv);
      });
}

/// Keys per step of the fused loop: one per lane of a warp in the kernel.
constexpr int kKeysPerStep = 32;

/// Variant 2: for each query row, walk the visible keys kKeysPerStep at a time. Each step finds
/// the new max, rescales the running sum and the running output by exp(m_old - m_new), and adds
/// the step's exp(s - m_new) and exp(s - m_new) * v. O is divided by l once, at the end.
inline void fused_online_attention_cpu(const AttentionShape& s, const float* q, const float* k, const float* v,
                                       float* o, float* lse) {
  const int d = s.head_dim;
  const float scale = float(s.softmax_scale());
  std::vector<float> q_scaled(d), acc(d), p(kKeysPerStep);
  for (int bh = 0; bh < s.batch * s.heads_q; ++bh) {
    const float* k_head = k + s.kv_head_offset(bh);
    const float* v_head = v + s.kv_head_offset(bh);
    for (int i = 0; i < s.seq_q; ++i) {
      const float* q_row = q + s.q_head_offset(bh) + int64_t(i) * d;
      for (int c = 0; c < d; ++c) q_scaled[c] = q_row[c] * scale;
      std::fill(acc.begin(), acc.end(), 0.0f);
      const int visible = s.visible_keys(i);
      float m = -INFINITY, l = 0.0f;
      //! [fused_step_cpu]
      for (int j0 = 0; j0 < visible; j0 += kKeysPerStep) {
        const int keys = std::min(kKeysPerStep, visible - j0);
        float step_max = -INFINITY;
        for (int jj = 0; jj < keys; ++jj) {
          const float* k_row = k_head + int64_t(j0 + jj) * d;
          float dot = 0.0f;
          for (int c = 0; c < d; ++c) dot += q_scaled[c] * k_row[c];
          p[jj] = dot;
          step_max = std::fmax(step_max, dot);
        }
        const float m_new = std::fmax(m, step_max);
        const float correction = std::exp(m - m_new);
        float step_sum = 0.0f;
        for (int jj = 0; jj < keys; ++jj) {
          p[jj] = std::exp(p[jj] - m_new);
          step_sum += p[jj];
        }
        l = l * correction + step_sum;
        for (int c = 0; c < d; ++c) acc[c] *= correction;
        for (int jj = 0; jj < keys; ++jj) {
          const float* v_row = v_head + int64_t(j0 + jj) * d;
          for (int c = 0; c < d; ++c) acc[c] += p[jj] * v_row[c];
        }
        m = m_new;
      }
      //! [fused_step_cpu]
      float* o_row = o + s.q_head_offset(bh) + int64_t(i) * d;
      for (int c = 0; c < d; ++c) o_row[c] = visible > 0 ? acc[c] / l : 0.0f;
      lse[int64_t(bh) * s.seq_q + i] = visible > 0 ? m + std::log(l) : -INFINITY;
    }
  }
}

}  // namespace fa::online
