// Chapter 09 on the CPU: chapter 05's loop (Q tiles outer, K/V tiles inner, the output kept
// unnormalized) with the features, in the order the kernels apply them:
//   1. a packed batch is a list of sequences, each run as a batch of one (sequence_rows);
//   2. a window leaves each Q tile a run of K/V tiles; the others are never visited (tile_keys);
//   3. each scaled score goes through softcap, ALiBi and the bias (modified_score);
//   4. then the mask (causal and window), and chapter 05's step (flash2_row_step) on the row.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "../05_flash_attention_v2/algorithm.h"
#include "features.h"
#include "problem.h"

namespace fa::features {

constexpr int kTileRows = 64, kTileCols = 64;

inline void features_cpu(const AttentionShape& s, const AttentionFeatures& f, const AttentionExtras& extras,
                         const float* q, const float* k, const float* v, float* o, float* lse) {
  const int d = s.head_dim;
  const float scale = float(s.softmax_scale());
  std::vector<float> acc(std::size_t(kTileRows) * d), m(kTileRows), l(kTileRows), p(kTileCols);
  for (int b = 0; b < f.sequence_count(s); ++b) {
    for (int head = 0; head < s.heads_q; ++head) {
      const SequenceRows seq = sequence_rows(s, f, extras, b, head);
      const AttentionShape& one = seq.shape;
      const WindowMask mask = seq.mask();
      const float* q_rows = q + seq.q_row0 * d;
      const float* k_rows = k + seq.kv_row0 * d;
      const float* v_rows = v + seq.kv_row0 * d;
      const float* bias_rows = f.bias ? extras.bias + seq.bias0 : nullptr;
      const float slope = f.alibi ? extras.alibi_slope(s, b, head) : 0.0f;
      for (int i0 = 0; i0 < one.seq_q; i0 += kTileRows) {
        const int rows = std::min(kTileRows, one.seq_q - i0);
        std::fill(acc.begin(), acc.end(), 0.0f);
        std::fill(m.begin(), m.end(), -INFINITY);
        std::fill(l.begin(), l.end(), 0.0f);
        const KeySpan keys = tile_keys(mask, i0, i0 + rows - 1, kTileCols);
        for (int j0 = keys.begin; j0 < keys.end; j0 += kTileCols) {
          for (int r = 0; r < rows; ++r) {
            const int i = i0 + r;
            float tile_max = -INFINITY;
            for (int c = 0; c < kTileCols; ++c) {
              const int j = j0 + c;
              p[c] = -INFINITY;
              if (j >= one.seq_kv || !mask.visible(i, j)) continue;
              float x = 0.0f;
              for (int e = 0; e < d; ++e) x += q_rows[int64_t(i) * d + e] * k_rows[int64_t(j) * d + e];
              p[c] = modified_score(one, f, x * scale, slope, i, j, bias_rows);
              tile_max = std::max(tile_max, p[c]);
            }
            // Chapter 05's step from here on, through chapter 05's own function.
            flash2::flash2_row_step(p.data(), tile_max, m[r], l[r], acc.data() + std::size_t(r) * d,
                                    v_rows + int64_t(j0) * d, std::min(kTileCols, one.seq_kv - j0), d);
          }
        }
        for (int r = 0; r < rows; ++r) {
          const int64_t row = seq.q_row0 + i0 + r;
          for (int x = 0; x < d; ++x) o[row * d + x] = l[r] > 0 ? acc[std::size_t(r) * d + x] / l[r] : 0.0f;
          lse[row] = m[r] == -INFINITY ? -INFINITY : m[r] + std::log(l[r]);
        }
      }
    }
  }
}

}  // namespace fa::features
