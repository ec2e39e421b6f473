// Chapter 04: FlashAttention-1's update of one query row for one K/V tile -- the step all four
// kernels share (kv_outer and q_outer in flash_attention_v1.cu, registers in register_tiles.cuh,
// tuned in flash_attention_v1_tuned.cu). Each kernel computes the tile's max m~ and the sum l~
// of P~ = exp(S - m~) its own way; the row's new state and the two factors that bring its output
// up to date are the same equations in all of them.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "not_implemented.h"

namespace fa::flash1 {

/// O_i <- alpha O_i + beta P~ V_j.
struct RowFactors {
  float alpha = 0.0f, beta = 0.0f;
};

/// A kernel cannot throw, so each launcher calls this first: in a student copy it says "not
/// implemented" until flash1_row_update below is written.
inline void require_row_update() {
  // BEGIN SOLUTION ch04_row_update: write flash1_row_update just below, then delete this line
  // END SOLUTION
}

//! [flash1_row_update]
/// The row's state (m, l) and this tile's m~ (tile_max) and l~ (tile_sum) in; the new state and
/// the factors out:
///   m_new = max(m, m~),  l_new = l e^(m - m_new) + e^(m~ - m_new) l~,
///   alpha = l e^(m - m_new) / l_new,  beta = e^(m~ - m_new) / l_new.
/// While the row has seen no visible key (m_new = -inf) its state stays (-inf, 0) and both factors
/// are 0: O stays 0. `exp` is e^x, or 2^x in a kernel that keeps its scores in log2 units.
template <class Exp>
__device__ inline RowFactors flash1_row_update(float& m, float& l, float tile_max, float tile_sum, Exp exp) {
  RowFactors f;
  // BEGIN SOLUTION ch04_row_update (device): m_new = max(m, tile_max); if it is finite: kept = l exp(m - m_new), fresh = exp(tile_max - m_new), l_new = kept + fresh tile_sum, alpha = kept / l_new, beta = fresh / l_new, then m = m_new and l = l_new (else the state stays and both factors stay 0)
  const float m_new = fmaxf(m, tile_max);
  if (m_new == -INFINITY) return f;                                 // nothing visible yet
  const float kept = l * exp(m - m_new);                            // 0 while m = -inf (l = 0)
  const float fresh = exp(tile_max - m_new);                        // 0 when this tile is fully masked
  const float l_new = kept + fresh * tile_sum, inv = 1.0f / l_new;  // l_new >= 1: the largest score counts e^0
  f.alpha = kept * inv;
  f.beta = fresh * inv;
  m = m_new;
  l = l_new;
  // END SOLUTION
  return f;
}
//! [flash1_row_update]

}  // namespace fa::flash1
