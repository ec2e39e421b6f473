// Chapter 05 variant 5's work on one K/V tile, as device functions: the row copies, scores,
// mask, online softmax, P V, and the output store. The shared-memory layout is a template
// parameter, so chapter 06's variant 1 runs the same code on the 128-byte-swizzled tiles TMA
// writes; chapter 09 adds its masks and score changes between these steps.
//
// A block has 4 warps; each warp owns kMt m16 tiles of Q rows: two (32 rows, 128 per block) at
// head_dim up to 128, one (16 rows, 64 per block) at 256, where two tiles' O accumulators alone
// would take all 255 registers. Thread (g, t) of warp w holds rows 16 kMt w + 16mt + 8h + g for
// mt < kMt, h in {0, 1} (index r = 2mt + h).
#pragma once

#include <cstdint>

#include "ampere.cuh"
#include "log2_units.h"
#include "not_implemented.h"
#include "online_softmax.cuh"
#include "problem.h"
#include "strides.h"

namespace fa::flash2 {

constexpr int kTunedWarps = 4, kTunedThreads = 32 * kTunedWarps;
constexpr int kWarpRows = 32, kBlockRows = kWarpRows * kTunedWarps;  // two m16 tiles per warp

/// m16 tiles of Q rows per warp at head_dim kD, and the rows per warp and per block that follow.
template <int kD>
constexpr int kTunedMTiles = kD == 256 ? 1 : 2;
template <int kD>
constexpr int kTunedWarpRows = 16 * kTunedMTiles<kD>;
template <int kD>
constexpr int kTunedBlockRows = kTunedWarpRows<kD>* kTunedWarps;

/// Rows [first, first + kRows) of a [n_rows, kD] 16-bit matrix whose rows are `ld` elements
/// apart (strides.h's PackedStride for packed tensors) into shared memory (row stride kD + 8) with cp.async, 16 bytes per
/// copy; rows past the end are filled with zeros by plain stores. Each thread keeps one column chunk and steps down the rows, so all its addresses are
/// one base plus constants (a per-row clamp would cost a 64-bit register per copy, kept live
/// across the K/V loop). When the chunks per row do not divide the block (kD = 96: 12 chunks),
/// the last threads sit out: 120 of 128 copy, 10 rows per step.
template <class T, int kD, int kRows, class Ld = PackedStride<kD>>
__device__ void copy_rows_async(T* tile, const T* src, int first, int n_rows, Ld ld = {}) {
  //! [tuned_copy_rows]
  constexpr int kChunks = kD / 8, kLd = kD + 8, kRowStep = kTunedThreads / kChunks;
  constexpr int kSteps = (kRows + kRowStep - 1) / kRowStep;
  const int r0 = int(threadIdx.x) / kChunks, c = int(threadIdx.x) % kChunks;
  if constexpr (kTunedThreads % kChunks != 0) {
    if (r0 >= kRowStep) return;
  }
  const T* from = src + (int64_t(first) + r0) * ld + c * 8;
  T* to = tile + r0 * kLd + c * 8;
#pragma unroll
  for (int i = 0; i < kSteps; ++i) {
    if (kRows % kRowStep != 0 && r0 + i * kRowStep >= kRows) break;
    if (first + r0 + i * kRowStep < n_rows) {
      ampere::cp_async_16(to + i * kRowStep * kLd, from + i * kRowStep * ld, true);
    } else {
      *reinterpret_cast<uint4*>(to + i * kRowStep * kLd) = make_uint4(0, 0, 0, 0);
    }
  }
  //! [tuned_copy_rows]
}

using ampere::ldmatrix_x4;
using ampere::ldmatrix_x4_trans;
using ampere::Mma;

/// Chapter 05's layout: rows of kD elements padded by 8 (16 bytes), so the 8 row addresses of
/// an ldmatrix land in 8 different 16-byte bank groups.
template <int kD>
struct PaddedRows {
  template <class T>
  __device__ static const T* at(const T* tile, int row, int col) {
    return tile + row * (kD + 8) + col;
  }
};

/// S (16 kMt x kKeys per warp) += Q K_j^T (pass S zeroed).
template <class T, int kD, int kKeys, class QLayout, class KLayout, int kMt>
__device__ inline void tuned_scores(float (&s)[kMt][kKeys / 8][4], const T* q_s, const T* k_s, int warp, int lane) {
  //! [tuned_scores]
  // Per 16-wide k-step: an ldmatrix for the A fragments of each of the warp's m-tiles, then each
  // ldmatrix of K (two n-blocks) feeds 2 kMt mma.
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks) {
    uint32_t a[kMt][4];
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt)
      ldmatrix_x4(a[mt], QLayout::at(q_s, 16 * kMt * warp + 16 * mt + lane % 16, ks * 16 + (lane / 16) * 8));
#pragma unroll
    for (int np = 0; np < kKeys / 16; ++np) {
      uint32_t b[4];  // matrices (keys +0, dims +0), (keys +0, dims +8), (keys +8, dims +0), (keys +8, dims +8)
      ldmatrix_x4(b, KLayout::at(k_s, np * 16 + (lane / 16) * 8 + lane % 8, ks * 16 + (lane / 8 % 2) * 8));
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
        Mma<T>::run(s[mt][2 * np], a[mt], b[0], b[1]);
        Mma<T>::run(s[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
  //! [tuned_scores]
}

/// -inf where (row, key) is masked or past the end. warp_row0: the warp's first row. `mask` is the
/// rule: the shape itself (its causal mask) here, a policy of its own in chapter 09 (anything with
/// seq_q, seq_kv and visible(row, key)).
template <int kKeys, int kMt, class Mask>
__device__ inline void tuned_mask(float (&s)[kMt][kKeys / 8][4], const Mask& shape, int warp_row0, int j0, int g,
                                  int t) {
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
    for (int nb = 0; nb < kKeys / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = warp_row0 + 16 * mt + 8 * (e / 2) + g, key = j0 + nb * 8 + 2 * t + (e & 1);
        if (!(row < shape.seq_q && key < shape.seq_kv && shape.visible(row, key))) s[mt][nb][e] = -INFINITY;
      }
}

/// Online softmax on raw scores, S replaced by P, O rescaled. The max commutes with the
/// (positive) scale, so the scale goes into the exponent, p = exp2(s * scale_log2 - m): one FFMA
/// and one exp2f (MUFU.EX2 inside a range check) per score.
template <int kD, int kKeys, int kMt>
__device__ inline void tuned_softmax(float (&s)[kMt][kKeys / 8][4], float (&out)[kMt][kD / 8][4], float (&m)[2 * kMt],
                                     float (&l)[2 * kMt], float scale_log2) {
#pragma unroll
  for (int r = 0; r < 2 * kMt; ++r) {
    const int mt = r / 2, h = r % 2;
    // Row r's kKeys / 4 scores in this thread: s[mt][nb][2h] and s[mt][nb][2h + 1] for each nb.
    auto row = [&](int j) -> float& { return s[mt][j / 2][2 * h + j % 2]; };
    const float rescale = online_softmax_row<kKeys / 4, false>(row, m[r], l[r], scale_log2);
#pragma unroll
    for (int db = 0; db < kD / 8; ++db) {
      out[mt][db][2 * h] *= rescale;
      out[mt][db][2 * h + 1] *= rescale;
    }
  }
}

/// A kernel cannot throw, so every launcher of a kernel that runs tuned_pv (this chapter's tuned
/// kernel, chapter 06's TMA variant, chapter 09's Ampere kernel) calls this first: in a student
/// copy it says "not implemented" until tuned_pv below is written.
inline void require_tuned_pv() {
  // BEGIN SOLUTION ch05_pv: write tuned_pv just below, then delete this line
  // END SOLUTION
}

/// O += P V_j: P from registers (as in variant 3), each ldmatrix.trans of V feeds 2 kMt mma.
template <class T, int kD, int kKeys, class VLayout, int kMt>
__device__ inline void tuned_pv(float (&out)[kMt][kD / 8][4], const float (&s)[kMt][kKeys / 8][4], const T* v_s,
                                int lane) {
  // BEGIN SOLUTION ch05_pv (device): O += P V_j for each of the warp's kMt m-tiles (two, one at head_dim 256): P's fragments packed to T straight from the S accumulators (two neighbouring n-blocks of S are one 16-key A fragment), V's B fragments by ldmatrix_x4_trans through VLayout::at, one Mma<T>::run per 8 output columns
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    uint32_t p_frag[kMt][4];
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) {
      p_frag[mt][0] = Mma<T>::pack(s[mt][2 * kk][0], s[mt][2 * kk][1]);
      p_frag[mt][1] = Mma<T>::pack(s[mt][2 * kk][2], s[mt][2 * kk][3]);
      p_frag[mt][2] = Mma<T>::pack(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
      p_frag[mt][3] = Mma<T>::pack(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
    }
#pragma unroll
    for (int db = 0; db < kD / 8; db += 2) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, VLayout::at(v_s, kk * 16 + (lane / 8 % 2) * 8 + lane % 8, (db + lane / 16) * 8));
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
        Mma<T>::run(out[mt][db], p_frag[mt], b[0], b[1]);
        Mma<T>::run(out[mt][db + 1], p_frag[mt], b[2], b[3]);
      }
    }
  }
  // END SOLUTION
}

/// The epilogue: O / l rounded to T into the warp's own 16 kMt rows of o_stage (the block's Q
/// tile, free once the loop is done), then 16-byte stores of rows i0 + 16 kMt warp .. to o_rows
/// (row 0 of this head, rows o_ld elements apart), and LSE to lse_rows. Rows at or past n_q are not written. Call it after every
/// thread's last read of o_stage (a __syncthreads()).
template <class T, int kD, int kMt, class Ld = PackedStride<kD>>
__device__ inline void tuned_store_output(const float (&out)[kMt][kD / 8][4], const float (&m)[2 * kMt],
                                          float (&l)[2 * kMt], T* o_stage, T* o_rows, float* lse_rows, int i0, int n_q,
                                          int warp, int lane, Ld o_ld = {}) {
  constexpr int kLd = kD + 8, kRows = 16 * kMt;
  const int g = lane / 4, t = lane % 4;
  float inv_l[2 * kMt];
#pragma unroll
  for (int r = 0; r < 2 * kMt; ++r) {
    l[r] = quad_sum(l[r]);
    inv_l[r] = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
  }
  T* o_warp = o_stage + kRows * warp * kLd;
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
    for (int db = 0; db < kD / 8; ++db)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float inv = inv_l[2 * mt + h];
        *reinterpret_cast<uint32_t*>(o_warp + (16 * mt + 8 * h + g) * kLd + db * 8 + 2 * t) =
            Mma<T>::pack(out[mt][db][2 * h] * inv, out[mt][db][2 * h + 1] * inv);
      }
  __syncwarp();
  constexpr int kChunks = kD / 8;
#pragma unroll
  for (int i = 0; i < kRows * kChunks / 32; ++i) {
    const int e = i * 32 + lane, r = e / kChunks, c = e % kChunks, row = i0 + kRows * warp + r;
    if (row < n_q)
      *reinterpret_cast<uint4*>(o_rows + int64_t(row) * o_ld + c * 8) =
          *reinterpret_cast<const uint4*>(o_warp + r * kLd + c * 8);
  }
  if (t == 0) {
#pragma unroll
    for (int r = 0; r < 2 * kMt; ++r) {
      const int row = i0 + kRows * warp + 16 * (r / 2) + 8 * (r % 2) + g;
      // LSE = ln(sum e^(s * scale)) = (m + log2 l) * ln 2, with m and l in log2 units.
      if (row < n_q) lse_rows[row] = m[r] == -INFINITY ? -INFINITY : (m[r] + log2f(l[r])) * kLn2;
    }
  }
}

}  // namespace fa::flash2
