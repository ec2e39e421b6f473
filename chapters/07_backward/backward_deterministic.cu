// Chapter 07, variant 3 -- `deterministic`: variant 2 without atomics. The same K/V-side kernel
// computes dK and dV (each block owns its 64 keys, so those were never in question) but skips
// dQ; a second kernel computes dQ with the roles swapped, one block per 64-row Q tile looping
// over the K/V tiles in a fixed order, with dQ in registers:
//   S  (16 rows x 64 keys per warp) = Q_w K_j^T      A = Q rows, B = K rows  (ldmatrix)
//   dP (16 rows x 64 keys)          = dO_w V_j^T     A = dO rows, B = V rows
//   P = exp(S scale - LSE), dS = P (dP - D)
//   dQ_w += dS K_j                                   A = dS from registers, B = K by ldmatrix.trans
// S and dP are computed twice in all (once per kernel): 7 matrix products instead of 5, for
// gradients that are bitwise identical from run to run.
// Both kernels copy the next tile (Q and dO for the first, K and V for the second) with cp.async
// while the current one is computed, and they run on two streams, side by side. Strided tensors
// (strides.h: flash-attn's layout) run without a copy, through a second instantiation of each.
// Run: build/bin/ch07_backward --variant deterministic
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>

#include "backward_mma.cuh"
#include "cuda_check.h"
#include "delta.cuh"
#include "registry.h"
#include "static_switch.h"

namespace fa::backward {
namespace {

/// The dQ kernel's body; with kStrided, the tensors' rows are where `st` says (else packed, and
/// `st` is not read; LSE and D are always packed).
template <class T, int kD, bool kStrided>
__device__ __forceinline__ void backward_dq_body(AttentionShape s, const T* q, const T* k, const T* v, const T* d_o,
                                                 const float* lse, const float* delta, T* dq,
                                                 const BackwardStrides& st) {
  constexpr int kLd = kD + 8;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  T* q_s = reinterpret_cast<T*>(shared_bytes);
  T* do_s = q_s + kRows * kLd;
  T* k_buf = do_s + kRows * kLd;       // 2 stages x [64 keys][kLd]
  T* v_buf = k_buf + 2 * kKeys * kLd;  // 2 stages x [64 keys][kLd]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int i0 = blockIdx.x * kRows, bh = blockIdx.y, batch = bh / s.heads_q;
  const int kv_plane = batch * s.heads_kv + s.kv_head(bh % s.heads_q);
  const float scale = float(s.softmax_scale()), scale_log2 = scale * kLog2e;
  const T* q_head = q + int64_t(bh) * s.seq_q * kD;
  const T* do_head = d_o + int64_t(bh) * s.seq_q * kD;
  if constexpr (kStrided) q_head = q + st.q.at(bh, s.heads_q, 0), do_head = d_o + st.d_o.at(bh, s.heads_q, 0);
  load_tile<T, kD, kLd, kRows>(q_s, q_head, i0, s.seq_q, row_stride<kStrided, kD>(st.q));
  load_tile<T, kD, kLd, kRows>(do_s, do_head, i0, s.seq_q, row_stride<kStrided, kD>(st.d_o));
  // This thread's two rows: 16 w + g and 16 w + g + 8 of the tile.
  float row_lse[2], row_delta[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = i0 + 16 * warp + g + 8 * h;
    row_lse[h] = row < s.seq_q ? lse[int64_t(bh) * s.seq_q + row] * kLog2e : 0.0f;  // log2 units
    row_delta[h] = row < s.seq_q ? delta[int64_t(bh) * s.seq_q + row] : 0.0f;
  }
  const int row_a = i0 + 16 * warp + g;
  const KeyRun runs[2] = {shape_keys(s, row_a), shape_keys(s, row_a + 8)};
  const int last_row = min(i0 + kRows, s.seq_q) - 1;
  const int key_end = s.causal ? s.visible_keys(last_row) : s.seq_kv;
  const T* k_head = k + int64_t(kv_plane) * s.seq_kv * kD;
  const T* v_head = v + int64_t(kv_plane) * s.seq_kv * kD;
  if constexpr (kStrided) k_head = k + st.k.at(kv_plane, s.heads_kv, 0), v_head = v + st.v.at(kv_plane, s.heads_kv, 0);
  const auto k_ld = row_stride<kStrided, kD>(st.k), v_ld = row_stride<kStrided, kD>(st.v);

  float dq_acc[kD / 8][4] = {};
  // K/V tile jt + 1 is copied (cp.async) into the other stage while tile jt is computed.
  const int n_tiles = key_end > 0 ? (key_end + kKeys - 1) / kKeys : 0;
  auto prefetch = [&](int jt) {
    copy_rows_async<T, kD, kLd>(k_buf + (jt % 2) * kKeys * kLd, k_head, jt * kKeys, s.seq_kv, k_ld);
    copy_rows_async<T, kD, kLd>(v_buf + (jt % 2) * kKeys * kLd, v_head, jt * kKeys, s.seq_kv, v_ld);
    cp_async_commit();
  };
  if (n_tiles > 0) prefetch(0);
  for (int jt = 0; jt < n_tiles; ++jt) {
    const int j0 = jt * kKeys;
    __syncthreads();  // tile jt - 1 (the stage about to be refilled) is no longer read
    if (jt + 1 < n_tiles) {
      prefetch(jt + 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* k_s = k_buf + (jt % 2) * kKeys * kLd;
    const T* v_s = v_buf + (jt % 2) * kKeys * kLd;
    //! [backward_dq_tile]
    // S and dP for the warp's 16 rows x 64 keys; s[nb][e]: row 16 w + g + 8 (e / 2), key j0 + 8 nb + 2 t + (e & 1).
    float sc[kKeys / 8][4] = {}, dp[kKeys / 8][4] = {};
    products_abt<T, kD, kLd>(sc, dp, q_s, do_s, 16 * warp, k_s, v_s, lane);
    // dS = P (dP - D), P recomputed from the LSE; 0 outside each row's run of keys, where the
    // tile's last key is past what the warp's first row sees (or past the end of K).
#pragma unroll
    for (int nb = 0; nb < kKeys / 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[nb][e] = fast_exp2(sc[nb][e] * scale_log2 - row_lse[e / 2]);
    }
    const int warp_row = i0 + 16 * warp;
    if (j0 + kKeys > (warp_row < s.seq_q ? s.visible_keys(warp_row) : 0)) mask_fragment(sc, runs, j0 + 2 * t, 0.0f);
#pragma unroll
    for (int nb = 0; nb < kKeys / 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dp[nb][e] = sc[nb][e] * (dp[nb][e] - row_delta[e / 2]);
    }
    // dQ_w += dS K_j: the dS accumulators are already A fragments (16 keys per k-step).
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      const uint32_t a_ds[4] = {Mma<T>::pack(dp[2 * kk][0], dp[2 * kk][1]), Mma<T>::pack(dp[2 * kk][2], dp[2 * kk][3]),
                                Mma<T>::pack(dp[2 * kk + 1][0], dp[2 * kk + 1][1]),
                                Mma<T>::pack(dp[2 * kk + 1][2], dp[2 * kk + 1][3])};
      accumulate_a_rows<T, kD, kLd>(dq_acc, a_ds, k_s, kk, lane);
    }
    //! [backward_dq_tile]
  }
  T* dq_head = dq + int64_t(bh) * s.seq_q * kD;
  if constexpr (kStrided) dq_head = dq + st.dq.at(bh, s.heads_q, 0);
  const auto dq_ld = row_stride<kStrided, kD>(st.dq);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = i0 + 16 * warp + g + 8 * h;
    if (row >= s.seq_q) continue;
#pragma unroll
    for (int db = 0; db < kD / 8; ++db) {
      dq_head[int64_t(row) * dq_ld + 8 * db + 2 * t] = T(dq_acc[db][2 * h] * scale);
      dq_head[int64_t(row) * dq_ld + 8 * db + 2 * t + 1] = T(dq_acc[db][2 * h + 1] * scale);
    }
  }
}

template <class T, int kD>
__global__ void __launch_bounds__(kThreads)
    backward_dq_kernel(AttentionShape s, const T* q, const T* k, const T* v, const T* d_o, const float* lse,
                       const float* delta, T* dq) {
  backward_dq_body<T, kD, false>(s, q, k, v, d_o, lse, delta, dq, {});
}

template <class T, int kD>
__global__ void __launch_bounds__(kThreads)
    backward_dq_strided_kernel(AttentionShape s, const T* q, const T* k, const T* v, const T* d_o, const float* lse,
                               const float* delta, T* dq, BackwardStrides st) {
  backward_dq_body<T, kD, true>(s, q, k, v, d_o, lse, delta, dq, st);
}

template <class T, int kD>
void launch_dim(const BackwardParams& p) {
  const AttentionShape& s = p.shape;
  float* delta = static_cast<float*>(p.workspace);
  launch_delta<T>(p, delta);
  const cudaStream_t side = fork_side_stream(p.stream);
  const auto q = static_cast<const T*>(p.q), k = static_cast<const T*>(p.k), v = static_cast<const T*>(p.v),
             d_o = static_cast<const T*>(p.d_o);
  // dK and dV: chapter 07's K/V-side kernel without its dQ part.
  const int kv_bytes = backward_mma_smem_bytes<T, kD, false>();
  const dim3 kv_grid(unsigned((s.seq_kv + kKeys - 1) / kKeys), unsigned(s.batch * s.heads_kv));
  const auto dk = static_cast<T*>(p.dk), dv = static_cast<T*>(p.dv), dq = static_cast<T*>(p.dq);
  float* const no_dq32 = nullptr;  // this K/V-side kernel leaves dQ to the dQ kernel
  if (p.strides)
    launch_with_smem(backward_mma_strided_kernel<T, kD, false>, kv_grid, kv_bytes, p.stream, s, q, k, v, d_o, p.lse,
                     delta, no_dq32, dk, dv, *p.strides);
  else
    launch_with_smem(backward_mma_kernel<T, kD, false>, kv_grid, kv_bytes, p.stream, s, q, k, v, d_o, p.lse, delta,
                     no_dq32, dk, dv);
  // dQ: one block per Q tile, on the side stream.
  const int q_bytes = int((2 * kRows + 4 * kKeys) * (kD + 8) * sizeof(T));
  const dim3 q_grid(unsigned((s.seq_q + kRows - 1) / kRows), unsigned(s.batch * s.heads_q));
  if (p.strides)
    launch_with_smem(backward_dq_strided_kernel<T, kD>, q_grid, q_bytes, side, s, q, k, v, d_o, p.lse, delta, dq,
                     *p.strides);
  else launch_with_smem(backward_dq_kernel<T, kD>, q_grid, q_bytes, side, s, q, k, v, d_o, p.lse, delta, dq);
  join_side_stream(p.stream);
}

template <class T>
void launch_deterministic(const BackwardParams& p) {
  with_head_dim<64, 128>(p.shape.head_dim, [&](auto d) { launch_dim<T, d.value>(p); });
}

BackwardKernel deterministic_kernel(const char* name, DType dtype, void (*launch)(const BackwardParams&)) {
  const char* summary =
      "variant 2 without atomics: dK/dV as before, dQ by a second kernel per Q tile (S and dP computed twice)";
  BackwardKernel k{name, 7, 3, "deterministic", dtype, summary, launch};
  k.supports = [](const AttentionShape& s) { return backward_mma_support(s, true); };
  k.workspace_bytes = [](const AttentionShape& s) { return std::size_t(s.lse_elems()) * sizeof(float); };
  k.deterministic = true;
  k.strided = true;  // backward_mma_strided_kernel and backward_dq_strided_kernel, D's rows (launch_delta)
  return k;
}

}  // namespace

FA_REGISTER_BACKWARD_KERNEL(deterministic_kernel("ch07_deterministic_fp16", DType::F16, launch_deterministic<__half>));
FA_REGISTER_BACKWARD_KERNEL(deterministic_kernel("ch07_deterministic_bf16", DType::BF16,
                                                 launch_deterministic<__nv_bfloat16>));

}  // namespace fa::backward
