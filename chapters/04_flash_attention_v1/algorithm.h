// Chapter 04 on the CPU: FlashAttention-1's tiles and its three steps per tile, in plain C++.
// The loop order is the only switch between the two variants; the tile steps are the kernels'.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "not_implemented.h"
#include "problem.h"
#include "tiles.h"

namespace fa::flash1 {

/// Scores of query row i against keys j0 .. j0 + count - 1, scaled; -inf where the key is masked
/// or past the end. Returns their maximum (-inf when none is visible).
inline float row_tile_scores(const AttentionShape& s, const float* q_head, const float* k_head, int i, int j0,
                             int count, float scale, float* out) {
  const int d = s.head_dim;
  float tile_max = -INFINITY;
  for (int c = 0; c < count; ++c) {
    const int j = j0 + c;
    float sc = -INFINITY;
    if (j < s.seq_kv && s.visible(i, j)) {
      float dot = 0.0f;
      for (int x = 0; x < d; ++x) dot += q_head[int64_t(i) * d + x] * k_head[int64_t(j) * d + x];
      sc = dot * scale;
    }
    out[c] = sc;
    tile_max = std::fmax(tile_max, sc);
  }
  return tile_max;
}

/// FlashAttention-1's step for one query row and one K/V tile, the output kept normalized.
/// row: the row's `cols` scaled, masked scores against the tile (-inf where hidden), tile_max
/// their max; m, l: the row's running max and sum; o_row: its d outputs, normalized; v_tile: the
/// tile's first V row, of which `keys` exist (the rest of the tile is past the end of the
/// sequence and is not read). The loop below calls it for every (row, tile) pair it visits.
inline void flash1_row_step(float* row, int cols, float tile_max, float& m, float& l, float* o_row, const float* v_tile,
                            int keys, int d) {
  // BEGIN SOLUTION ch04_row_update_cpu: the row's step for this K/V tile: P~ = exp(row - tile_max) in place over the `cols` scores (0 when tile_max is -inf) and its sum l~; m_new = max(m, tile_max) (nothing to do while it is -inf); o_row <- (l e^(m - m_new) / l_new) o_row + (e^(tile_max - m_new) / l_new) P~ V_j with l_new = l e^(m - m_new) + e^(tile_max - m_new) l~, over the tile's `keys` keys; then m and l updated
  float tile_sum = 0.0f;
  for (int c = 0; c < cols; ++c) {
    row[c] = tile_max == -INFINITY ? 0.0f : std::exp(row[c] - tile_max);
    tile_sum += row[c];
  }
  const float m_new = std::fmax(m, tile_max);
  if (m_new == -INFINITY) return;
  const float a = l * std::exp(m - m_new), b = std::exp(tile_max - m_new), l_new = a + b * tile_sum;
  for (int c = 0; c < d; ++c) {
    float acc = 0.0f;
    for (int jj = 0; jj < keys; ++jj) acc += row[jj] * v_tile[int64_t(jj) * d + c];
    o_row[c] = (a / l_new) * o_row[c] + (b / l_new) * acc;
  }
  m = m_new;
  l = l_new;
  // END SOLUTION
}

inline void flash_attention_v1_cpu(const AttentionShape& s, const float* q, const float* k, const float* v, float* o,
                                   float* lse, LoopOrder order, Tiles t) {
  const int d = s.head_dim;
  const float scale = float(s.softmax_scale());
  std::vector<float> scores(std::size_t(t.rows) * t.cols), m(s.seq_q), l(s.seq_q);

  for (int bh = 0; bh < s.batch * s.heads_q; ++bh) {
    const float* q_head = q + s.q_head_offset(bh);
    const float* k_head = k + s.kv_head_offset(bh);
    const float* v_head = v + s.kv_head_offset(bh);
    float* o_head = o + s.q_head_offset(bh);
    std::fill(o_head, o_head + int64_t(s.seq_q) * d, 0.0f);
    std::fill(m.begin(), m.end(), -INFINITY);
    std::fill(l.begin(), l.end(), 0.0f);

    // One (Q tile, K/V tile) pair: the kernels' tile_scores, tile_row_update, tile_output_update.
    auto visit = [&](int i0, int j0) {
      const int rows = std::min(t.rows, s.seq_q - i0);
      if (s.causal && j0 >= s.visible_keys(i0 + rows - 1)) return;  // tile fully masked
      for (int r = 0; r < rows; ++r) {
        const int i = i0 + r;
        float* row = scores.data() + std::size_t(r) * t.cols;
        const float tile_max = row_tile_scores(s, q_head, k_head, i, j0, t.cols, scale, row);
        flash1_row_step(row, t.cols, tile_max, m[i], l[i], o_head + int64_t(i) * d, v_head + int64_t(j0) * d,
                        std::min(t.cols, s.seq_kv - j0), d);
      }
    };

    //! [flash1_cpu_loop_orders]
    if (order == LoopOrder::KvOuter) {
      for (int j0 = 0; j0 < s.seq_kv; j0 += t.cols)
        for (int i0 = 0; i0 < s.seq_q; i0 += t.rows) visit(i0, j0);
    } else {
      for (int i0 = 0; i0 < s.seq_q; i0 += t.rows)
        for (int j0 = 0; j0 < s.seq_kv; j0 += t.cols) visit(i0, j0);
    }
    //! [flash1_cpu_loop_orders]
    for (int i = 0; i < s.seq_q; ++i)
      lse[int64_t(bh) * s.seq_q + i] = m[i] == -INFINITY ? -INFINITY : m[i] + std::log(l[i]);
  }
}

}  // namespace fa::flash1
