// Chapter 02 on the CPU: chapter 01's three steps with the safe softmax in the middle.
// The kernels' variants 1 and 2 compute exactly this; they differ only in which thread does
// which part of the row (variant 1 runs safe_softmax_row itself, one thread per row).
#pragma once

#include <cmath>
#include <vector>

#include "../01_naive_attention/algorithm.h"
#include "not_implemented.h"

namespace fa::safe {

/// One row of scores -> probabilities in place, in three passes; returns the row's LSE. The same
/// function runs on the GPU: variant 1's kernel gives each thread one row and calls it.
//! [safe_softmax_row_cpu]
FA_HD inline float safe_softmax_row(float* row, int n) {
  // BEGIN SOLUTION ch02_safe_row_cpu: three passes over row[0 .. n): the max, the sum of exp(s - max), then row[j] = exp(s - max) / sum; return max + log(sum); a row whose max is -inf (no visible key) becomes all 0 and returns -inf
  float row_max = -INFINITY;
  for (int j = 0; j < n; ++j) row_max = fmaxf(row_max, row[j]);  // pass 1: the max
  if (row_max == -INFINITY) {                                    // the row sees no key
    for (int j = 0; j < n; ++j) row[j] = 0.0f;
    return -INFINITY;
  }
  float sum = 0.0f;
  for (int j = 0; j < n; ++j) sum += expf(row[j] - row_max);              // pass 2: the sum
  const float inv_sum = 1.0f / sum;                                       // sum >= 1: the max contributes e^0
  for (int j = 0; j < n; ++j) row[j] = expf(row[j] - row_max) * inv_sum;  // pass 3: normalize
  return row_max + logf(sum);
  // END SOLUTION
}
//! [safe_softmax_row_cpu]

inline void safe_softmax_attention_cpu(const AttentionShape& s, const float* q, const float* k, const float* v,
                                       float* o, float* lse) {
  naive::materialized_attention_cpu(
      s, q, k, v, o, lse, naive::Products::Tiled, [&](std::vector<float>& scores, float* lse_head) {
        for (int i = 0; i < s.seq_q; ++i)
          lse_head[i] = safe_softmax_row(scores.data() + std::size_t(i) * s.seq_kv, s.seq_kv);
      });
}

}  // namespace fa::safe
