// Chapter 05 on the CPU: FlashAttention-2's loop (Dao, 2023, Algorithm 1) in plain C++.
// Q tiles outer, K/V tiles inner, and the output kept *unnormalized*: each tile rescales the
// running O and l by e^(m_old - m_new) and adds P V_j with P = e^(S - m_new); O is divided by l
// once, at the end. The kernels' loop structure, on chapter 04's 64 x 64 tiles, in base e (the
// kernels work in base 2 with log2(e) folded into the scale).
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "../04_flash_attention_v1/algorithm.h"
#include "not_implemented.h"
#include "problem.h"

namespace fa::flash2 {

constexpr int kTileRows = 64, kTileCols = 64;

/// FlashAttention-2's softmax for one query row and one K/V tile, the output kept unnormalized.
/// p[c * stride] for c < keys: the row's scaled, masked scores against the tile (-inf where
/// hidden), tile_max their max; replaced by P = e^(s - m_new), or 0 while the row has seen no
/// visible key. m, l: the row's running max and sum. Returns the rescale e^(m_old - m_new) of the
/// row's running output (1 while nothing is visible). The CPU step below calls it, and so does
/// this chapter's deferred kernel (flash_attention_v2.cu), one thread per row.
//! [flash2_row_softmax]
FA_HD inline float flash2_row_softmax(float* p, int stride, int keys, float tile_max, float& m, float& l) {
  float rescale = 1.0f;
  // BEGIN SOLUTION ch05_tile_cpu: the row's softmax for this K/V tile, output kept unnormalized: m_new = max(m, tile_max); while it is -inf, p[c * stride] = 0 and the state stays (rescale 1); else rescale = e^(m - m_new), p[c * stride] = e^(p[c * stride] - m_new) for the tile's `keys` keys and their sum; l = l * rescale + sum; m = m_new
  const float m_new = fmaxf(m, tile_max);
  const bool seen = !(m_new == -INFINITY);  // some key of the row is visible so far
  float tile_sum = 0.0f;
  for (int c = 0; c < keys; ++c) {
    p[c * stride] = seen ? expf(p[c * stride] - m_new) : 0.0f;
    tile_sum += p[c * stride];
  }
  if (seen) rescale = expf(m - m_new);  // 0 on the first visible tile (m = -inf)
  l = l * rescale + tile_sum;
  m = m_new;
  // END SOLUTION
  return rescale;
}
//! [flash2_row_softmax]

/// FlashAttention-2's step for one query row and one K/V tile, the output kept unnormalized.
/// p: the row's scaled, masked scores against the tile (-inf where hidden), tile_max their max;
/// m, l: the row's running max and sum; acc: its d unnormalized outputs; v_tile: the tile's first
/// V row; keys: how many of the tile's keys exist. Chapter 09's CPU loop calls it too.
//! [flash2_row_step]
inline void flash2_row_step(float* p, float tile_max, float& m, float& l, float* acc, const float* v_tile, int keys,
                            int d) {
  // BEGIN SOLUTION ch05_tile_cpu: the softmax (flash2_row_softmax above, on p with stride 1), then the row's accumulator: acc[x] = acc[x] * rescale + (P V_j)[x] over the tile's `keys` keys. O is divided by l once, after the loop
  const float rescale = flash2_row_softmax(p, 1, keys, tile_max, m, l);
  for (int x = 0; x < d; ++x) {
    float pv = 0.0f;
    for (int c = 0; c < keys; ++c) pv += p[c] * v_tile[int64_t(c) * d + x];
    acc[x] = acc[x] * rescale + pv;
  }
  // END SOLUTION
}
//! [flash2_row_step]

inline void flash_attention_v2_cpu(const AttentionShape& s, const float* q, const float* k, const float* v, float* o,
                                   float* lse) {
  const int d = s.head_dim;
  const float scale = float(s.softmax_scale());
  std::vector<float> acc(std::size_t(kTileRows) * d), m(kTileRows), l(kTileRows), p(kTileCols);
  for (int bh = 0; bh < s.batch * s.heads_q; ++bh) {
    const float* q_head = q + s.q_head_offset(bh);
    const float* k_head = k + s.kv_head_offset(bh);
    const float* v_head = v + s.kv_head_offset(bh);
    for (int i0 = 0; i0 < s.seq_q; i0 += kTileRows) {
      const int rows = std::min(kTileRows, s.seq_q - i0);
      std::fill(acc.begin(), acc.end(), 0.0f);
      std::fill(m.begin(), m.end(), -INFINITY);
      std::fill(l.begin(), l.end(), 0.0f);
      const int key_end = s.causal ? s.visible_keys(i0 + rows - 1) : s.seq_kv;  // later tiles are fully masked
      //! [flash2_cpu_tile]
      for (int j0 = 0; j0 < key_end; j0 += kTileCols) {
        for (int r = 0; r < rows; ++r) {
          const int i = i0 + r;
          const float tile_max = flash1::row_tile_scores(s, q_head, k_head, i, j0, kTileCols, scale, p.data());
          flash2_row_step(p.data(), tile_max, m[r], l[r], acc.data() + std::size_t(r) * d, v_head + int64_t(j0) * d,
                          std::min(kTileCols, s.seq_kv - j0), d);
        }
      }
      //! [flash2_cpu_tile]
      for (int r = 0; r < rows; ++r) {
        const int i = i0 + r;
        for (int x = 0; x < d; ++x)
          o[s.q_head_offset(bh) + int64_t(i) * d + x] = l[r] > 0 ? acc[std::size_t(r) * d + x] / l[r] : 0.0f;
        lse[int64_t(bh) * s.seq_q + i] = m[r] == -INFINITY ? -INFINITY : m[r] + std::log(l[r]);
      }
    }
  }
}

}  // namespace fa::flash2
