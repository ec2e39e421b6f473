// Chapter 06, variant 8: FlashAttention-4's two softmax ideas, applied on Hopper to variant 4's
// online softmax (online_softmax in flash3_tile.cuh), for a thread's two rows of one K/V tile.
//
//  * A lazy max. A row keeps its running max m while the tile's largest scaled score exceeds it
//    by at most kLazyLog2 (log2 units): its P then reach up to 2^kLazyLog2, its factor is 1 and O
//    is left alone (rescale_output skips a warp whose 16 rows all have factor 1). Past that, the
//    max moves as in online_softmax. O / l and LSE = m + log2 l come out the same for any m the
//    row settles on: the stale max cancels, so only rounding can differ.
//  * The exponentials split between two pipes. Of every 8 of a row's scores a thread holds,
//    kFmaOfEight go to exp2_fma (a cubic on the FMA pipe, exp2_fma.cuh) and the rest to MUFU.EX2,
//    which gives 16 results a clock per SM: a head_dim-64 tile's exponentials need about as many
//    of those clocks as its products need of the tensor cores'. Variant 8 sets it to 0: on the
//    H200 every share ran slower (the softmax's warps wait on the latency of each result, seldom
//    on MUFU).
#pragma once

#include "device_utils.cuh"
#include "exp2_fma.cuh"
#include "online_softmax.cuh"

namespace fa::flash3 {

/// How far a row's max may grow before it is moved: 2^8 = 256, the largest P then allowed (bf16
/// and the fp32 sums hold it with room to spare).
constexpr float kLazyLog2 = 8.0f;

//! [lazy_softmax]
/// online_softmax's step with the lazy max and the split exponentials. s[4c + 2h + e] is row h's
/// score; the scores become P and rescale[h] the factor for row h of O (1 while the max stays).
template <int kFmaOfEight, int kHalfN>
__device__ inline void lazy_online_softmax(float (&s)[kHalfN], float (&m)[2], float (&l)[2], float (&rescale)[2],
                                           float scale_log2) {
  static_assert(kFmaOfEight >= 0 && kFmaOfEight <= 8, "a share of each 8 scores");
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float tile_max = -INFINITY;
#pragma unroll
    for (int i = 0; i < kHalfN / 2; ++i) tile_max = fmaxf(tile_max, s[4 * (i / 2) + 2 * h + i % 2]);
    const float grown = quad_max(tile_max) * scale_log2;
    // -inf + kLazyLog2 is -inf: a row's first visible scores always set its max.
    const float m_new = grown > m[h] + kLazyLog2 ? grown : m[h];
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;
    rescale[h] = m_new == m[h] ? 1.0f : fast_exp2(m[h] - m_use);
    m[h] = m_new;
    // exp2_fma gives about 2^-125 for a masked score, not 0: nothing next to a weight of 1, but a
    // row that has seen no key must keep P = 0 (its O and l stay 0). A multiply, not a select,
    // which the compiler would turn into a branch around the polynomial.
    const float keep = m_new == -INFINITY ? 0.0f : 1.0f;
    float row_sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kHalfN / 2; ++i) {
      float& x = s[4 * (i / 2) + 2 * h + i % 2];
      const float e = fmaf(x, scale_log2, -m_use);
      x = i % 8 < kFmaOfEight ? exp2_fma(e) * keep : fast_exp2(e);
      row_sum += x;
    }
    l[h] = l[h] * rescale[h] + row_sum;
  }
}
//! [lazy_softmax]

}  // namespace fa::flash3
