// Chapter 09, backward -- `ampere`: chapter 07's tensor-core backward (variant 2, backward_mma.cuh)
// with the features, for any GPU from sm_80 on. The layout of the work is chapter 07's: a block
// holds one 64-key K/V tile, its 4 warps 16 keys each, and loops over the query heads that read
// it and their 64-row Q tiles, with dK and dV in registers and dQ added with fp32 atomics. What
// changes:
//   * packed batches: block (key tile, b * heads_kv + h) works on sequence b, as a batch of one;
//   * windows: the loop visits only the Q tiles whose rows see a key of the tile (rows_for_keys);
//   * the recomputed scores get the forward's changes (softcap, ALiBi, the bias) before the
//     mask, and dS is multiplied by the softcap's derivative 1 - tanh^2; ALiBi and the bias add
//     constants, whose derivative is 1.
// It takes Q, K, V, O, dO and the gradients with any strides (flash-attn's [batch, seq, heads,
// head_dim], a packed batch's [total, heads, head_dim] rows) through a second instantiation, as
// chapter 07's kernels do (strides.h); the packed one keeps its compile-time row stride.
// Run: build/bin/fa_gpu_tests --gtest_filter='*ch09_ampere_backward*' (the chapter program times the forward)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>

#include "../07_backward/backward_mma.cuh"
#include "../07_backward/delta.cuh"
#include "cuda_check.h"
#include "features.h"
#include "registry.h"
#include "static_switch.h"
#include "strides.h"

namespace fa::features {
namespace {

using backward::kKeys;
using backward::kRows;
using backward::kThreads;

template <class T, int kD>
constexpr int kSmemBytes = backward::backward_mma_smem_bytes<T, kD, true>();

/// One K/V tile of one sequence's K/V head. With kStrided, the tensors' rows are where `st` says
/// (else packed, and `st` is not read; LSE, D and dq32 are always packed).
template <class T, int kD, bool kStrided>
__global__ void __launch_bounds__(kThreads)
    features_backward_kernel(AttentionShape shape, AttentionFeatures features, AttentionExtras extras, const T* q,
                             const T* k, const T* v, const T* d_o, const float* lse, const float* delta, float* dq32,
                             T* dk, T* dv, BackwardStrides st) {
  constexpr int kLd = kD + 8, kLdS = kKeys + 8;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  T* k_s = reinterpret_cast<T*>(shared_bytes);
  T* v_s = k_s + kKeys * kLd;
  T* q_s = v_s + kKeys * kLd;    // [64 rows][kLd]
  T* do_s = q_s + kRows * kLd;   // [64 rows][kLd]
  T* ds_s = do_s + kRows * kLd;  // [64 rows][kLdS]: dS, transposed back for dQ
  float* lse_s = reinterpret_cast<float*>(ds_s + kRows * kLdS);
  float* delta_s = lse_s + kRows;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int b = int(blockIdx.y) / shape.heads_kv, kvh = int(blockIdx.y) % shape.heads_kv, group = shape.group_size();
  //! [backward_sequence]
  // The sequence, as seen by the first query head of this K/V head (they share K/V rows).
  const SequenceRows kv_seq = sequence_rows(shape, features, extras, b, kvh * group);
  const AttentionShape& one = kv_seq.shape;
  const WindowMask mask = kv_seq.mask();
  const int j0 = blockIdx.x * kKeys;
  if (j0 >= one.seq_kv) return;  // the grid covers the longest sequence
  const KeySpan rows = rows_for_keys(mask, j0, min(j0 + kKeys, one.seq_kv));
  //! [backward_sequence]
  const T* k_rows = k + kv_seq.kv_row0 * kD;
  const T* v_rows = v + kv_seq.kv_row0 * kD;
  if constexpr (kStrided) {  // the sequence's first row of its plane (a packed batch's planes: [total] rows)
    k_rows = k + st.k.at(kv_seq.kv_plane, shape.heads_kv, kv_seq.kv_start);
    v_rows = v + st.v.at(kv_seq.kv_plane, shape.heads_kv, kv_seq.kv_start);
  }
  ampere::load_tile<T, kD, kD + 8, 64>(k_s, k_rows, j0, one.seq_kv, row_stride<kStrided, kD>(st.k));
  ampere::load_tile<T, kD, kD + 8, 64>(v_s, v_rows, j0, one.seq_kv, row_stride<kStrided, kD>(st.v));

  float dk_acc[kD / 8][4] = {}, dv_acc[kD / 8][4] = {};
  const int key_a = j0 + 16 * warp + g;  // this thread's keys: key_a, key_a + 8
  const int first_tile = rows.begin / kRows;
  const int row_tiles = rows.end > rows.begin ? (rows.end - 1) / kRows + 1 - first_tile : 0;
  const int n_items = group * row_tiles;

  for (int it = 0; it < n_items; ++it) {
    const int head = kvh * group + it / row_tiles, i0 = (first_tile + it % row_tiles) * kRows;
    const SequenceRows seq = sequence_rows(shape, features, extras, b, head);
    const ScoreChanges c = score_changes(shape, seq, extras);
    __syncthreads();  // the previous item's tiles and dS are no longer read
    const T* q_rows = q + seq.q_row0 * kD;
    const T* do_rows = d_o + seq.q_row0 * kD;
    if constexpr (kStrided) {
      q_rows = q + st.q.at(seq.q_plane, shape.heads_q, seq.q_start);
      do_rows = d_o + st.d_o.at(seq.q_plane, shape.heads_q, seq.q_start);
    }
    backward::copy_rows_async<T, kD, kLd>(q_s, q_rows, i0, one.seq_q, row_stride<kStrided, kD>(st.q));
    backward::copy_rows_async<T, kD, kLd>(do_s, do_rows, i0, one.seq_q, row_stride<kStrided, kD>(st.d_o));
    for (int r = threadIdx.x; r < 2 * kRows; r += kThreads) {
      const int row = i0 + r % kRows;
      const float* src = (r < kRows ? lse : delta) + seq.q_row0 + min(row, one.seq_q - 1);
      ampere::cp_async_4((r < kRows ? lse_s : delta_s) + r % kRows, src, row < one.seq_q);
    }
    ampere::cp_async_commit();
    ampere::cp_async_wait<0>();
    __syncthreads();

    float st[kRows / 8][4] = {}, dpt[kRows / 8][4] = {};
    backward::products_abt<T, kD, kLd>(st, dpt, k_s, v_s, 16 * warp, q_s, do_s, lane);
    //! [backward_scores]
    // Element e of block nb is key key_a + 8 (e / 2), row i0 + 8 nb + 2t + (e & 1).
#pragma unroll
    for (int nb = 0; nb < kRows / 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key_a + 8 * (e / 2), r = 8 * nb + 2 * t + (e & 1), row = i0 + r;
        const bool live = row < one.seq_q && key < one.seq_kv && mask.visible(row, key);
        float x = st[nb][e] * c.scale, slope_of_cap = 1.0f;
        if (c.cap > 0.0f) {
          const float th = fast_tanh(x / c.cap);
          x = c.cap * th;
          slope_of_cap = 1.0f - th * th;  // d(cap tanh(x / cap)) / dx
        }
        if (c.slope != 0.0f) x -= c.slope * fabsf(float(row + one.causal_offset() - key));
        if (c.bias && live) x += c.bias[int64_t(row) * one.seq_kv + key];
        const float p = live ? __expf(x - lse_s[r]) : 0.0f;
        st[nb][e] = p;
        dpt[nb][e] = p * (dpt[nb][e] - delta_s[r]) * slope_of_cap;  // dS^T: dL/dx for the scaled score x
      }
    }
    //! [backward_scores]

    // dV += P^T dO and dK += dS^T Q, as in chapter 07.
#pragma unroll
    for (int kk = 0; kk < kRows / 16; ++kk) {
      using M = ampere::Mma<T>;
      const uint32_t a_p[4] = {M::pack(st[2 * kk][0], st[2 * kk][1]), M::pack(st[2 * kk][2], st[2 * kk][3]),
                               M::pack(st[2 * kk + 1][0], st[2 * kk + 1][1]),
                               M::pack(st[2 * kk + 1][2], st[2 * kk + 1][3])};
      const uint32_t a_ds[4] = {M::pack(dpt[2 * kk][0], dpt[2 * kk][1]), M::pack(dpt[2 * kk][2], dpt[2 * kk][3]),
                                M::pack(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]),
                                M::pack(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3])};
#pragma unroll
      for (int db = 0; db < kD / 8; db += 2) {
        const int row = kk * 16 + (lane / 8 % 2) * 8 + lane % 8, col = (db + lane / 16) * 8;
        uint32_t b_do[4], b_q[4];
        ampere::ldmatrix_x4_trans(b_do, do_s + row * kLd + col);
        ampere::ldmatrix_x4_trans(b_q, q_s + row * kLd + col);
        M::run(dv_acc[db], a_p, b_do[0], b_do[1]);
        M::run(dv_acc[db + 1], a_p, b_do[2], b_do[3]);
        M::run(dk_acc[db], a_ds, b_q[0], b_q[1]);
        M::run(dk_acc[db + 1], a_ds, b_q[2], b_q[3]);
      }
    }

    // dS back to [row][key] in shared memory; dQ rows 16w .. 16w + 15 += dS K_j with atomics.
#pragma unroll
    for (int nb = 0; nb < kRows / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) ds_s[(8 * nb + 2 * t + (e & 1)) * kLdS + 16 * warp + g + 8 * (e / 2)] = T(dpt[nb][e]);
    __syncthreads();
    float dq_acc[kD / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      uint32_t a_ds[4];
      ampere::ldmatrix_x4(a_ds, ds_s + (16 * warp + lane % 16) * kLdS + kk * 16 + (lane / 16) * 8);
      backward::accumulate_a_rows<T, kD, kLd>(dq_acc, a_ds, k_s, kk, lane);
    }
    float* dq_rows = dq32 + seq.q_row0 * kD;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = i0 + 16 * warp + g + 8 * h;
      if (row >= one.seq_q) continue;
#pragma unroll
      for (int db = 0; db < kD / 8; ++db) {
        atomicAdd(&dq_rows[int64_t(row) * kD + 8 * db + 2 * t], dq_acc[db][2 * h] * c.scale);
        atomicAdd(&dq_rows[int64_t(row) * kD + 8 * db + 2 * t + 1], dq_acc[db][2 * h + 1] * c.scale);
      }
    }
  }

  // dK (times the scale) and dV of this warp's 16 keys, rounded once; keys no row sees get 0.
  const float scale = float(one.softmax_scale());
  T* dk_rows = dk + kv_seq.kv_row0 * kD;
  T* dv_rows = dv + kv_seq.kv_row0 * kD;
  if constexpr (kStrided) {
    dk_rows = dk + st.dk.at(kv_seq.kv_plane, shape.heads_kv, kv_seq.kv_start);
    dv_rows = dv + st.dv.at(kv_seq.kv_plane, shape.heads_kv, kv_seq.kv_start);
  }
  const auto dk_ld = row_stride<kStrided, kD>(st.dk), dv_ld = row_stride<kStrided, kD>(st.dv);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int key = key_a + 8 * h;
    if (key >= one.seq_kv) continue;
#pragma unroll
    for (int db = 0; db < kD / 8; ++db) {
      const int64_t at_k = int64_t(key) * dk_ld + 8 * db + 2 * t, at_v = int64_t(key) * dv_ld + 8 * db + 2 * t;
      dk_rows[at_k] = T(dk_acc[db][2 * h] * scale);
      dk_rows[at_k + 1] = T(dk_acc[db][2 * h + 1] * scale);
      dv_rows[at_v] = T(dv_acc[db][2 * h]);
      dv_rows[at_v + 1] = T(dv_acc[db][2 * h + 1]);
    }
  }
}

template <class T, int kD>
void launch_dim(const BackwardParams& p) {
  const AttentionShape& s = p.shape;
  float* delta = static_cast<float*>(p.workspace);
  float* dq32 = delta + s.lse_elems();
  CUDA_CHECK(cudaMemsetAsync(dq32, 0, std::size_t(s.q_elems()) * sizeof(float), p.stream));
  backward::launch_delta<T>(p, delta);
  const AttentionFeatures& f = p.features;
  const int keys = f.varlen() ? p.extras.max_seqlen_k : s.seq_kv;
  if (keys > 0) {
    const dim3 grid(unsigned((keys + kKeys - 1) / kKeys), unsigned(f.sequence_count(s) * s.heads_kv));
    const auto q = static_cast<const T*>(p.q), k = static_cast<const T*>(p.k), v = static_cast<const T*>(p.v),
               d_o = static_cast<const T*>(p.d_o);
    const auto dk = static_cast<T*>(p.dk), dv = static_cast<T*>(p.dv);
    auto kernel = p.strides ? features_backward_kernel<T, kD, true> : features_backward_kernel<T, kD, false>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes<T, kD>));
    kernel<<<grid, kThreads, kSmemBytes<T, kD>, p.stream>>>(s, f, p.extras, q, k, v, d_o, p.lse, delta, dq32, dk, dv,
                                                            p.strides ? *p.strides : BackwardStrides{});
    CUDA_CHECK_LAUNCH();
  }
  backward::launch_round_dq<T>(dq32, p);
}

template <class T>
void launch_backward(const BackwardParams& p) {
  require_window_tiles();  // the tile ranges are this chapter's exercise
  with_head_dim<64, 128>(p.shape.head_dim, [&](auto d) { launch_dim<T, d.value>(p); });
}

BackwardKernel backward_kernel(const char* name, DType dtype, void (*launch)(const BackwardParams&)) {
  BackwardKernel k{name,  9,
                   1,     "ampere",
                   dtype, "chapter 07's tensor-core backward with packed batches, windows, softcap, ALiBi and a bias",
                   launch};
  k.supports = [](const AttentionShape& s) { return backward::backward_mma_support(s, false); };
  k.workspace_bytes = [](const AttentionShape& s) {
    return std::size_t(s.lse_elems()) * sizeof(float) + std::size_t(s.q_elems()) * sizeof(float);
  };
  k.features = kAllFeatures;
  k.strided = true;  // features_backward_kernel<.., true>, D's rows and dQ's rounding take any strides
  return k;
}

}  // namespace

FA_REGISTER_BACKWARD_KERNEL(backward_kernel("ch09_ampere_backward_fp16", DType::F16, launch_backward<__half>));
FA_REGISTER_BACKWARD_KERNEL(backward_kernel("ch09_ampere_backward_bf16", DType::BF16, launch_backward<__nv_bfloat16>));

}  // namespace fa::features
