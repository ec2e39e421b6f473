// Chapter 03 on the CPU: the online softmax, first over a materialized row (variant 1), then
// fused into attention so no score matrix exists at all (variant 2). Same loops, same step
// size and same order of operations as the kernels in online_softmax.cu.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "../01_naive_attention/algorithm.h"
#include "not_implemented.h"
#include "problem.h"

namespace fa::online {

/// The running state of a softmax: the max m seen so far and the sum l of exp(s - m). The same
/// two functions run on the CPU here and in the kernels of online_softmax.cu.
struct MaxSum {
  float m;
  float l;
};

//! [online_update_and_merge]
/// Folds one score in. The old sum is rescaled by exp(m_old - m_new) whenever the max grows.
FA_HD inline MaxSum online_update(MaxSum state, float score) {
  // BEGIN SOLUTION ch03_online_update: return the state after one more score: m_new = max(m, score), l_new = l * exp(m - m_new) + exp(score - m_new); while nothing is visible (m_new = -inf) the state stays (-inf, l) and never computes -inf - (-inf); a NaN score makes l NaN
  const float m_new = fmaxf(state.m, score);  // fmaxf skips a NaN score; l still picks it up:
  if (m_new == -INFINITY) return {m_new, score != score ? score : state.l};  // nothing visible yet
  return {m_new, state.l * expf(state.m - m_new) + expf(score - m_new)};     // exp(NaN - m) is NaN
  // END SOLUTION
}

/// Combines two partial states of disjoint parts of a row (associative, so any tree works).
FA_HD inline MaxSum online_merge(MaxSum a, MaxSum b) {
  // BEGIN SOLUTION ch03_online_merge: return the state of the two parts together: m = max(m_a, m_b), l = l_a exp(m_a - m) + l_b exp(m_b - m); two empty states (m = -inf) give (-inf, l_a + l_b)
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, a.l + b.l};  // both empty: 0 + 0 (or a NaN that came in)
  return {m, a.l * expf(a.m - m) + b.l * expf(b.m - m)};
  // END SOLUTION
}
//! [online_update_and_merge]

/// Variant 1, one row in place: pass 1 folds the scores into (m, l) one at a time, reading each
/// once; pass 2 writes P. Returns the row's LSE.
//! [online_softmax_row_cpu]
inline float online_softmax_row(float* row, int n) {
  MaxSum state{-INFINITY, 0.0f};
  for (int j = 0; j < n; ++j) state = online_update(state, row[j]);  // pass 1
  if (state.m == -INFINITY) {
    std::fill(row, row + n, 0.0f);
    return -INFINITY;
  }
  for (int j = 0; j < n; ++j) row[j] = std::exp(row[j] - state.m) / state.l;  // pass 2
  return state.m + std::log(state.l);
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
