// The online softmax's state update, on the fragments of a tensor-core tile: the one step that
// chapters 05, 06 and 08 all take once per K/V tile and per row (chapter 03 derives it).
//
// A row of S is spread over the 4 lanes of a quad; each thread holds kN of its scores and keeps
// the row's running state in log2 units:
//   m  the running max of scale_log2 * s over the keys seen so far (-inf before the first key),
//   l  this thread's part of the running sum of 2^(scale_log2 * s - m) (summed over the quad
//      once, at the end).
// One tile's step: m_new = max(m, scale_log2 * max of the tile's row); every score becomes
// p = 2^(scale_log2 * s - m_new); l = l * 2^(m - m_new) + sum p; O is multiplied by the same
// factor 2^(m - m_new). A row that has seen no key yet (m_new = -inf) subtracts 0 instead of
// m_new: its p are 2^-inf = 0 and its factor 2^(-inf - 0) = 0 (its O and l are still 0), never
// the NaN of -inf - (-inf).
#pragma once

#include <cuda_runtime.h>

#include "device_utils.cuh"

namespace fa {

/// 2^x by MUFU.EX2 with denormals flushed (kFast, see fast_exp2) or by exp2f.
template <bool kFast>
__device__ __forceinline__ float softmax_exp2(float x) {
  if constexpr (kFast) {
    return fast_exp2(x);
  } else {
    return exp2f(x);
  }
}

/// The running max's step for one row, given scale_log2 times the tile's row max. Updates m and
/// returns the factor for l and O; m_use is the value to subtract in the exponent (0 for a row
/// that has seen no key, so that its masked scores give 2^-inf = 0). The factor is 2^(m - m_use)
/// for every row, with no select on "has seen a key": the select lengthens the latency-bound
/// decode loop (chapter 08's performance notes).
template <bool kFastExp = true>
__device__ __forceinline__ float online_max_update(float& m, float tile_max_scaled, float& m_use) {
  //! [online_max_update]
  const float m_new = fmaxf(m, tile_max_scaled);
  m_use = m_new == -INFINITY ? 0.0f : m_new;
  const float rescale = softmax_exp2<kFastExp>(m - m_use);
  m = m_new;
  return rescale;
  //! [online_max_update]
}

/// One row's whole step: the tile's row max over the quad, the state update, the scores x(0) ..
/// x(kN - 1) (raw; this thread's share of the row) replaced by P, and l updated. Returns the
/// factor this row of O must be multiplied by. `x(i)` returns a reference into the fragment.
template <int kN, bool kFastExp = true, class Scores>
__device__ __forceinline__ float online_softmax_row(Scores&& x, float& m, float& l, float scale_log2) {
  static_assert(kN % 2 == 0, "a thread holds its scores of a row in pairs");
  float tile_max = fmaxf(x(0), x(1));
#pragma unroll
  for (int i = 2; i < kN; i += 2) tile_max = fmaxf(tile_max, fmaxf(x(i), x(i + 1)));
  tile_max = quad_max(tile_max);
  float m_use;
  const float rescale = online_max_update<kFastExp>(m, tile_max * scale_log2, m_use);
  float row_sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    x(i) = softmax_exp2<kFastExp>(fmaf(x(i), scale_log2, -m_use));
    row_sum += x(i);
  }
  l = l * rescale + row_sum;
  return rescale;
}

}  // namespace fa
