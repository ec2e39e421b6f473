// Chapter 07: the tensor-core backward's K/V-side kernel, shared by variant 2 (`mma`, which also
// accumulates dQ here with fp32 atomics) and variant 3 (`deterministic`, which leaves dQ to a
// kernel of its own). See backward_mma.cu for the layout of the work. Both also run it on strided
// tensors (strides.h: flash-attn's layout) as a second instantiation, backward_mma_strided_kernel;
// the packed one keeps its compile-time row stride.
#pragma once

#include <cstdint>
#include <string>

#include "ampere.cuh"
#include "cuda_check.h"
#include "device_utils.cuh"
#include "log2_units.h"
#include "mask.h"
#include "problem.h"
#include "strides.h"

namespace fa::backward {

using ampere::cp_async_16;
using ampere::cp_async_4;
using ampere::cp_async_commit;
using ampere::cp_async_wait;
using ampere::ldmatrix_x4;
using ampere::ldmatrix_x4_trans;
using ampere::load_tile;
using ampere::Mma;

constexpr int kKeys = 64, kRows = 64, kWarps = 4, kThreads = 32 * kWarps;

/// What both tensor-core variants support: head_dim 64 or 128, an sm_80 GPU (mma.sync with
/// bf16), and a grid of batch * heads_kv K/V tiles (the K/V-side kernel); with a per-Q-tile dQ
/// kernel (variant 3) also batch * heads_q Q tiles.
inline std::string backward_mma_support(const AttentionShape& s, bool dq_kernel) {
  if (s.head_dim != 64 && s.head_dim != 128) return "head_dim must be 64 or 128, got " + std::to_string(s.head_dim);
  const GpuInfo& gpu = detect_gpu();
  if (gpu.available && gpu.sm_major < 8) return "needs an sm_80 or newer GPU (mma.sync with bf16)";
  if (int64_t(s.batch) * s.heads_kv > 65535) return "batch*heads_kv must be at most 65535";
  if (dq_kernel && int64_t(s.batch) * s.heads_q > 65535) return "batch*heads_q must be at most 65535";
  return "";
}

/// Launches `kernel` (kThreads a block) with `bytes` of dynamic shared memory on `stream`: the
/// packed and the strided instantiation of a kernel take different arguments, the same launch.
template <class Kernel, class... Args>
void launch_with_smem(Kernel kernel, dim3 grid, int bytes, cudaStream_t stream, Args... args) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  kernel<<<grid, kThreads, bytes, stream>>>(args...);
  CUDA_CHECK_LAUNCH();
}

/// Q/dO stages of backward_mma_kernel: two (the next item's tiles are copied while this one is
/// computed) when the smem allows 2 blocks per SM; with dQ's extra dS tile at head_dim 128 it
/// would not, and variant 2 keeps one stage.
template <bool kDq>
constexpr int kStages = kDq ? 1 : 2;

/// Rows [first, first + 64) of a [n_rows, kD] matrix whose rows are `ld` elements apart into
/// shared memory (row stride kLd) by cp.async; rows past the end become zeros. The caller commits
/// and waits.
template <class T, int kD, int kLd, class Ld = PackedStride<kD>>
__device__ inline void copy_rows_async(T* tile, const T* src, int first, int n_rows, Ld ld = {}) {
  constexpr int kChunks = kD / 8;  // 16 bytes each
  for (int e = threadIdx.x; e < kRows * kChunks; e += kThreads) {
    const int r = e / kChunks, c = e % kChunks;
    const bool valid = first + r < n_rows;
    cp_async_16(tile + r * kLd + c * 8, src + int64_t(valid ? first + r : 0) * ld + c * 8, valid);
  }
}

/// The paired product both backward kernels start a tile with: over kD, c1 = A1 B1^T and
/// c2 = A2 B2^T, 16 rows (this warp's, from row a_row of a1_s / a2_s) by 64 columns (the 64
/// rows of b1_s / b2_s), all [rows][kLd] tiles in shared memory. c[nb][e] is row
/// a_row + g + 8 (e / 2), column 8 nb + 2 t + (e & 1). A pair shares its fragment loads' loop.
//! [products_abt]
template <class T, int kD, int kLd>
__device__ inline void products_abt(float (&c1)[8][4], float (&c2)[8][4], const T* a1_s, const T* a2_s, int a_row,
                                    const T* b1_s, const T* b2_s, int lane) {
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks) {
    uint32_t a1[4], a2[4];
    ldmatrix_x4(a1, a1_s + (a_row + lane % 16) * kLd + ks * 16 + (lane / 16) * 8);
    ldmatrix_x4(a2, a2_s + (a_row + lane % 16) * kLd + ks * 16 + (lane / 16) * 8);
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t b1[4], b2[4];
      const int row = np * 16 + (lane / 16) * 8 + lane % 8, col = ks * 16 + (lane / 8 % 2) * 8;
      ldmatrix_x4(b1, b1_s + row * kLd + col);
      ldmatrix_x4(b2, b2_s + row * kLd + col);
      Mma<T>::run(c1[2 * np], a1, b1[0], b1[1]);
      Mma<T>::run(c1[2 * np + 1], a1, b1[2], b1[3]);
      Mma<T>::run(c2[2 * np], a2, b2[0], b2[1]);
      Mma<T>::run(c2[2 * np + 1], a2, b2[2], b2[3]);
    }
  }
}
//! [products_abt]

/// acc (16 rows x kD) += A (a 16 x 16 fragment) times rows 16 kk .. 16 kk + 15 of b_s
/// ([rows][kLd] in shared memory, read transposed by ldmatrix.trans): one k-step of dQ += dS K.
template <class T, int kD, int kLd>
__device__ inline void accumulate_a_rows(float (&acc)[kD / 8][4], const uint32_t (&a)[4], const T* b_s, int kk,
                                         int lane) {
#pragma unroll
  for (int db = 0; db < kD / 8; db += 2) {
    uint32_t b[4];
    ldmatrix_x4_trans(b, b_s + (kk * 16 + (lane / 8 % 2) * 8 + lane % 8) * kLd + (db + lane / 16) * 8);
    Mma<T>::run(acc[db], a, b[0], b[1]);
    Mma<T>::run(acc[db + 1], a, b[2], b[3]);
  }
}

/// Shared memory of backward_mma_kernel: K, V, Q, dO tiles, the dS tile (only with dQ), LSE and D.
template <class T, int kD, bool kDq>
constexpr int backward_mma_smem_bytes() {
  return int((2 * kKeys + 2 * kStages<kDq> * kRows) * (kD + 8) * sizeof(T) +
             (kDq ? kRows * (kKeys + 8) * sizeof(T) : 0) + 2 * kStages<kDq> * kRows * sizeof(float));
}

/// The kernel's body; with kStrided, the tensors' rows are where `st` says (else packed, and `st`
/// is not read; LSE, D and dq32 are always packed).
template <class T, int kD, bool kDq, bool kStrided>
__device__ __forceinline__ void backward_mma_body(AttentionShape s, const T* q, const T* k, const T* v, const T* d_o,
                                                  const float* lse, const float* delta, float* dq32, T* dk, T* dv,
                                                  const BackwardStrides& st) {
  constexpr int kLd = kD + 8, kLdS = kKeys + 8;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  T* k_s = reinterpret_cast<T*>(shared_bytes);
  T* v_s = k_s + kKeys * kLd;
  T* q_buf = v_s + kKeys * kLd;                    // kStages x [64 rows][kLd]
  T* do_buf = q_buf + kStages<kDq> * kRows * kLd;  // kStages x [64 rows][kLd]
  T* ds_s = do_buf + kStages<kDq> * kRows * kLd;   // [64 rows][kLdS]: dS, transposed back (with dQ only)
  float* lse_buf = reinterpret_cast<float*>(ds_s + (kDq ? kRows * kLdS : 0));  // kStages x 64, natural log
  float* delta_buf = lse_buf + kStages<kDq> * kRows;                           // kStages x 64

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int j0 = blockIdx.x * kKeys, kv_plane = blockIdx.y;
  const int batch = kv_plane / s.heads_kv, kvh = kv_plane % s.heads_kv, group = s.group_size();
  const float scale = float(s.softmax_scale()), scale_log2 = scale * kLog2e;
  const T* k_head = k + int64_t(kv_plane) * s.seq_kv * kD;
  const T* v_head = v + int64_t(kv_plane) * s.seq_kv * kD;
  if constexpr (kStrided) {  // row 0 of each head where the strides say, and the rows' strides below
    k_head = k + st.k.at(kv_plane, s.heads_kv, 0);
    v_head = v + st.v.at(kv_plane, s.heads_kv, 0);
  }
  load_tile<T, kD, kD + 8, 64>(k_s, k_head, j0, s.seq_kv, row_stride<kStrided, kD>(st.k));
  load_tile<T, kD, kD + 8, 64>(v_s, v_head, j0, s.seq_kv, row_stride<kStrided, kD>(st.v));

  float dk_acc[kD / 8][4] = {}, dv_acc[kD / 8][4] = {};                     // this warp's 16 keys x kD
  const int key_a = j0 + 16 * warp + g;                                     // this thread's keys: key_a, key_a + 8
  const KeyRun runs[2] = {shape_rows(s, key_a), shape_rows(s, key_a + 8)};  // the rows that see each
  const int first_tile = (s.causal ? max(0, j0 - s.causal_offset()) : 0) / kRows;
  const int row_tiles = (s.seq_q + kRows - 1) / kRows - first_tile;
  // Work item it = (query head kvh * group + it / row_tiles, Q tile first_tile + it % row_tiles).
  const int n_items = group * max(row_tiles, 0);
  auto item_bh = [&](int it) { return batch * s.heads_q + kvh * group + it / row_tiles; };
  auto item_i0 = [&](int it) { return (first_tile + it % row_tiles) * kRows; };
  //! [backward_prefetch]
  // Q, dO, LSE and D of item `it` into stage `stage` with cp.async (rows past the end are zeros).
  auto prefetch = [&](int it, int stage) {
    const int bh = item_bh(it), i0 = item_i0(it);
    const T* q_head = q + int64_t(bh) * s.seq_q * kD;
    const T* do_head = d_o + int64_t(bh) * s.seq_q * kD;
    if constexpr (kStrided) q_head = q + st.q.at(bh, s.heads_q, 0), do_head = d_o + st.d_o.at(bh, s.heads_q, 0);
    copy_rows_async<T, kD, kLd>(q_buf + stage * kRows * kLd, q_head, i0, s.seq_q, row_stride<kStrided, kD>(st.q));
    copy_rows_async<T, kD, kLd>(do_buf + stage * kRows * kLd, do_head, i0, s.seq_q, row_stride<kStrided, kD>(st.d_o));
    for (int r = threadIdx.x; r < 2 * kRows; r += kThreads) {
      const int row = i0 + r % kRows;
      const float* src = (r < kRows ? lse : delta) + int64_t(bh) * s.seq_q + min(row, s.seq_q - 1);
      cp_async_4((r < kRows ? lse_buf : delta_buf) + stage * kRows + r % kRows, src, row < s.seq_q);
    }
    cp_async_commit();
  };
  if (kStages<kDq> == 2 && n_items > 0) prefetch(0, 0);
  //! [backward_prefetch]

  for (int it = 0; it < n_items; ++it) {
    const int bh = item_bh(it), i0 = item_i0(it), stage = kStages<kDq> == 2 ? it % 2 : 0;
    __syncthreads();  // the previous item's tiles (and dS) are no longer read
    if (kStages<kDq> == 1) {
      prefetch(it, 0);
      cp_async_wait<0>();
    } else if (it + 1 < n_items) {
      prefetch(it + 1, 1 - stage);  // lands while this item is computed
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* q_s = q_buf + stage * kRows * kLd;
    const T* do_s = do_buf + stage * kRows * kLd;
    const float* lse_s = lse_buf + stage * kRows;
    const float* delta_s = delta_buf + stage * kRows;
    {
      //! [backward_mma_scores]
      // S^T and dP^T for the warp's 16 keys x 64 rows: A = K (or V) rows of the warp, B = Q (or dO) rows.
      float st[kRows / 8][4] = {}, dpt[kRows / 8][4] = {};
      products_abt<T, kD, kLd>(st, dpt, k_s, v_s, 16 * warp, q_s, do_s, lane);
      // P^T (recomputed) and dS^T; element e of block nb is key key_a + 8 (e / 2), row 8 nb + 2t + (e & 1).
#pragma unroll
      for (int nb = 0; nb < kRows / 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          st[nb][e] = fast_exp2(fmaf(st[nb][e], scale_log2, -lse_s[8 * nb + 2 * t + (e & 1)] * kLog2e));
      }
      // 0 outside each key's run of rows, where the warp's last key is past what the tile's
      // first row sees (or past the end of K).
      if (j0 + 16 * warp + 16 > s.visible_keys(i0)) mask_fragment(st, runs, i0 + 2 * t, 0.0f);
#pragma unroll
      for (int nb = 0; nb < kRows / 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) dpt[nb][e] = st[nb][e] * (dpt[nb][e] - delta_s[8 * nb + 2 * t + (e & 1)]);
      }
      //! [backward_mma_scores]

      //! [backward_mma_dkdv]
      // dV_w += P^T dO and dK_w += dS^T Q: A from registers (16 rows of the reduction per step),
      // B = dO or Q rows through ldmatrix.trans.
#pragma unroll
      for (int kk = 0; kk < kRows / 16; ++kk) {
        const uint32_t a_p[4] = {Mma<T>::pack(st[2 * kk][0], st[2 * kk][1]), Mma<T>::pack(st[2 * kk][2], st[2 * kk][3]),
                                 Mma<T>::pack(st[2 * kk + 1][0], st[2 * kk + 1][1]),
                                 Mma<T>::pack(st[2 * kk + 1][2], st[2 * kk + 1][3])};
        const uint32_t a_ds[4] = {
            Mma<T>::pack(dpt[2 * kk][0], dpt[2 * kk][1]), Mma<T>::pack(dpt[2 * kk][2], dpt[2 * kk][3]),
            Mma<T>::pack(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]), Mma<T>::pack(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3])};
#pragma unroll
        for (int db = 0; db < kD / 8; db += 2) {
          const int row = kk * 16 + (lane / 8 % 2) * 8 + lane % 8, col = (db + lane / 16) * 8;
          uint32_t b_do[4], b_q[4];
          ldmatrix_x4_trans(b_do, do_s + row * kLd + col);
          ldmatrix_x4_trans(b_q, q_s + row * kLd + col);
          Mma<T>::run(dv_acc[db], a_p, b_do[0], b_do[1]);
          Mma<T>::run(dv_acc[db + 1], a_p, b_do[2], b_do[3]);
          Mma<T>::run(dk_acc[db], a_ds, b_q[0], b_q[1]);
          Mma<T>::run(dk_acc[db + 1], a_ds, b_q[2], b_q[3]);
        }
      }
      //! [backward_mma_dkdv]

      //! [backward_mma_dq_atomics]
      if constexpr (kDq) {
        // dS back to [row][key] in shared memory, for dQ.
#pragma unroll
        for (int nb = 0; nb < kRows / 8; ++nb)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            ds_s[(8 * nb + 2 * t + (e & 1)) * kLdS + 16 * warp + g + 8 * (e / 2)] = T(dpt[nb][e]);
        __syncthreads();

        // dQ rows 16w .. 16w + 15 of this tile = dS K_j (64 keys), then fp32 atomics.
        float dq_acc[kD / 8][4] = {};
#pragma unroll
        for (int kk = 0; kk < kKeys / 16; ++kk) {
          uint32_t a_ds[4];
          ldmatrix_x4(a_ds, ds_s + (16 * warp + lane % 16) * kLdS + kk * 16 + (lane / 16) * 8);
          accumulate_a_rows<T, kD, kLd>(dq_acc, a_ds, k_s, kk, lane);
        }
        float* dq_head = dq32 + int64_t(bh) * s.seq_q * kD;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = i0 + 16 * warp + g + 8 * h;
          if (row >= s.seq_q) continue;
#pragma unroll
          for (int db = 0; db < kD / 8; ++db) {
            atomicAdd(&dq_head[int64_t(row) * kD + 8 * db + 2 * t], dq_acc[db][2 * h] * scale);
            atomicAdd(&dq_head[int64_t(row) * kD + 8 * db + 2 * t + 1], dq_acc[db][2 * h + 1] * scale);
          }
        }
      }  // kDq
      //! [backward_mma_dq_atomics]
    }
  }

  // dK = dS^T Q * scale and dV, this warp's 16 keys, rounded once.
  T* dk_head = dk + int64_t(kv_plane) * s.seq_kv * kD;
  T* dv_head = dv + int64_t(kv_plane) * s.seq_kv * kD;
  if constexpr (kStrided)
    dk_head = dk + st.dk.at(kv_plane, s.heads_kv, 0), dv_head = dv + st.dv.at(kv_plane, s.heads_kv, 0);
  const auto dk_ld = row_stride<kStrided, kD>(st.dk), dv_ld = row_stride<kStrided, kD>(st.dv);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int key = key_a + 8 * h;
    if (key >= s.seq_kv) continue;
#pragma unroll
    for (int db = 0; db < kD / 8; ++db) {
      const int64_t at_k = int64_t(key) * dk_ld + 8 * db + 2 * t, at_v = int64_t(key) * dv_ld + 8 * db + 2 * t;
      dk_head[at_k] = T(dk_acc[db][2 * h] * scale);
      dk_head[at_k + 1] = T(dk_acc[db][2 * h + 1] * scale);
      dv_head[at_v] = T(dv_acc[db][2 * h]);
      dv_head[at_v + 1] = T(dv_acc[db][2 * h + 1]);
    }
  }
}

template <class T, int kD, bool kDq>
__global__ void __launch_bounds__(kThreads)
    backward_mma_kernel(AttentionShape s, const T* q, const T* k, const T* v, const T* d_o, const float* lse,
                        const float* delta, float* dq32, T* dk, T* dv) {
  backward_mma_body<T, kD, kDq, false>(s, q, k, v, d_o, lse, delta, dq32, dk, dv, {});
}

/// backward_mma_kernel on strided tensors (dq32 stays packed: it is the variant's workspace).
template <class T, int kD, bool kDq>
__global__ void __launch_bounds__(kThreads)
    backward_mma_strided_kernel(AttentionShape s, const T* q, const T* k, const T* v, const T* d_o, const float* lse,
                                const float* delta, float* dq32, T* dk, T* dv, BackwardStrides st) {
  backward_mma_body<T, kD, kDq, true>(s, q, k, v, d_o, lse, delta, dq32, dk, dv, st);
}

}  // namespace fa::backward
