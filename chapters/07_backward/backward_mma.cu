// Chapter 07, variant 2 -- `mma`: the backward on tensor cores (mma.sync m16n8k16, fp16/bf16 in,
// fp32 accumulate), K/V tile resident, dK and dV in registers.
//
// Block: 4 warps and one 64-key K/V tile; warp w owns keys 16w .. 16w + 15. Working with the
// *transposed* scores keeps every warp's dK/dV rows its own:
//   S^T  (16 keys x 64 rows) = K_w Q_i^T      A = K rows, B = Q rows    (ldmatrix)
//   dP^T (16 keys x 64 rows) = V_w dO_i^T     A = V rows, B = dO rows
//   P^T = exp(S^T scale - LSE), dS^T = P^T (dP^T - D)        (LSE and D per column = per row)
//   dV_w += P^T dO_i,  dK_w += dS^T Q_i         A = P^T, dS^T from registers (the C->A trick of
//                                              chapter 05), B = dO, Q by ldmatrix.trans
//   dQ_i += dS K_j: dS goes through shared memory (transposed back), each warp then computes 16
//   rows of dS K_j on the tensor cores and adds them to an fp32 dQ with atomics; a last small
//   kernel rounds dQ to the output type.
// Run: build/bin/ch07_backward --variant mma
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>

#include "../05_flash_attention_v2/mma_sync.cuh"
#include "cuda_check.h"
#include "delta.cuh"
#include "registry.h"

namespace fa::backward {
namespace {

using flash2::ldmatrix_x4;
using flash2::ldmatrix_x4_trans;
using flash2::Mma;

constexpr int kKeys = 64, kRows = 64, kWarps = 4, kThreads = 32 * kWarps;

template <class T>
__global__ void round_dq_kernel(const float* dq32, T* dq, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dq[i] = T(dq32[i]);
}

template <class T, int kD>
__global__ void __launch_bounds__(kThreads) backward_mma_kernel(AttentionShape s, const T* q, const T* k, const T* v,
                                                                const T* d_o, const float* lse, const float* delta,
                                                                float* dq32, T* dk, T* dv) {
  constexpr int kLd = kD + 8, kLdS = kKeys + 8;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  T* k_s = reinterpret_cast<T*>(shared_bytes);
  T* v_s = k_s + kKeys * kLd;
  T* q_s = v_s + kKeys * kLd;
  T* do_s = q_s + kRows * kLd;
  T* ds_s = do_s + kRows * kLd;                               // [64 rows][kLdS]: dS, transposed back
  float* lse_s = reinterpret_cast<float*>(ds_s + kRows * kLdS);  // log2 units
  float* delta_s = lse_s + kRows;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int j0 = blockIdx.x * kKeys, kv_plane = blockIdx.y;
  const int batch = kv_plane / s.heads_kv, kvh = kv_plane % s.heads_kv, group = s.group_size();
  const float scale = float(s.softmax_scale()), scale_log2 = scale * 1.4426950408889634f;
  const T* k_head = k + int64_t(kv_plane) * s.seq_kv * kD;
  const T* v_head = v + int64_t(kv_plane) * s.seq_kv * kD;
  flash2::load_tile<T, kD, kD + 8, 64>(k_s, k_head, j0, s.seq_kv);
  flash2::load_tile<T, kD, kD + 8, 64>(v_s, v_head, j0, s.seq_kv);

  float dk_acc[kD / 8][4] = {}, dv_acc[kD / 8][4] = {};  // this warp's 16 keys x kD
  const int key_a = j0 + 16 * warp + g;                  // this thread's keys: key_a, key_a + 8
  const int first_row = s.causal ? max(0, j0 - s.causal_offset()) : 0;

  for (int hq = kvh * group; hq < (kvh + 1) * group; ++hq) {
    const int bh = batch * s.heads_q + hq;
    const T* q_head = q + int64_t(bh) * s.seq_q * kD;
    const T* do_head = d_o + int64_t(bh) * s.seq_q * kD;
    for (int i0 = first_row / kRows * kRows; i0 < s.seq_q; i0 += kRows) {
      __syncthreads();  // the previous tile's Q, dO and dS are no longer read
      flash2::load_tile<T, kD, kD + 8, 64>(q_s, q_head, i0, s.seq_q);
      flash2::load_tile<T, kD, kD + 8, 64>(do_s, do_head, i0, s.seq_q);
      for (int r = threadIdx.x; r < kRows; r += kThreads) {
        const bool in = i0 + r < s.seq_q;
        lse_s[r] = in ? lse[int64_t(bh) * s.seq_q + i0 + r] * 1.4426950408889634f : INFINITY;  // exp2(x - inf) = 0
        delta_s[r] = in ? delta[int64_t(bh) * s.seq_q + i0 + r] : 0.0f;
      }
      __syncthreads();

      //! [backward_mma_scores]
      // S^T and dP^T for the warp's 16 keys x 64 rows: A = K (or V) rows of the warp, B = Q (or dO) rows.
      float st[kRows / 8][4] = {}, dpt[kRows / 8][4] = {};
#pragma unroll
      for (int ks = 0; ks < kD / 16; ++ks) {
        uint32_t a_k[4], a_v[4];
        ldmatrix_x4(a_k, k_s + (16 * warp + lane % 16) * kLd + ks * 16 + (lane / 16) * 8);
        ldmatrix_x4(a_v, v_s + (16 * warp + lane % 16) * kLd + ks * 16 + (lane / 16) * 8);
#pragma unroll
        for (int np = 0; np < kRows / 16; ++np) {
          uint32_t b_q[4], b_do[4];
          const int row = np * 16 + (lane / 16) * 8 + lane % 8, col = ks * 16 + (lane / 8 % 2) * 8;
          ldmatrix_x4(b_q, q_s + row * kLd + col);
          ldmatrix_x4(b_do, do_s + row * kLd + col);
          Mma<T>::run(st[2 * np], a_k, b_q[0], b_q[1]);
          Mma<T>::run(st[2 * np + 1], a_k, b_q[2], b_q[3]);
          Mma<T>::run(dpt[2 * np], a_v, b_do[0], b_do[1]);
          Mma<T>::run(dpt[2 * np + 1], a_v, b_do[2], b_do[3]);
        }
      }
      // P^T (recomputed) and dS^T; element e of block nb is key key_a + 8 (e / 2), row 8 nb + 2t + (e & 1).
#pragma unroll
      for (int nb = 0; nb < kRows / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = key_a + 8 * (e / 2), r = 8 * nb + 2 * t + (e & 1);
          const bool live = key < s.seq_kv && s.visible(i0 + r, key);
          const float p = live ? exp2f(st[nb][e] * scale_log2 - lse_s[r]) : 0.0f;
          st[nb][e] = p;
          dpt[nb][e] = p * (dpt[nb][e] - delta_s[r]);  // now dS^T
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
        const uint32_t a_ds[4] = {Mma<T>::pack(dpt[2 * kk][0], dpt[2 * kk][1]), Mma<T>::pack(dpt[2 * kk][2], dpt[2 * kk][3]),
                                  Mma<T>::pack(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]),
                                  Mma<T>::pack(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3])};
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
#pragma unroll
        for (int db = 0; db < kD / 8; db += 2) {
          uint32_t b_k[4];
          ldmatrix_x4_trans(b_k, k_s + (kk * 16 + (lane / 8 % 2) * 8 + lane % 8) * kLd + (db + lane / 16) * 8);
          Mma<T>::run(dq_acc[db], a_ds, b_k[0], b_k[1]);
          Mma<T>::run(dq_acc[db + 1], a_ds, b_k[2], b_k[3]);
        }
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
    }
  }

  // dK = dS^T Q * scale and dV, this warp's 16 keys, rounded once.
  T* dk_head = dk + int64_t(kv_plane) * s.seq_kv * kD;
  T* dv_head = dv + int64_t(kv_plane) * s.seq_kv * kD;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int key = key_a + 8 * h;
    if (key >= s.seq_kv) continue;
#pragma unroll
    for (int db = 0; db < kD / 8; ++db) {
      const int64_t at = int64_t(key) * kD + 8 * db + 2 * t;
      dk_head[at] = T(dk_acc[db][2 * h] * scale);
      dk_head[at + 1] = T(dk_acc[db][2 * h + 1] * scale);
      dv_head[at] = T(dv_acc[db][2 * h]);
      dv_head[at + 1] = T(dv_acc[db][2 * h + 1]);
    }
  }
}

template <class T, int kD>
void launch_dim(const BackwardParams& p) {
  const AttentionShape& s = p.shape;
  float* delta = static_cast<float*>(p.workspace);
  float* dq32 = delta + s.lse_elems();
  CUDA_CHECK(cudaMemsetAsync(dq32, 0, std::size_t(s.q_elems()) * sizeof(float), p.stream));
  launch_delta<T>(p.o, p.d_o, delta, s.lse_elems(), kD, p.stream);
  const int bytes = int((2 * kKeys + 2 * kRows) * (kD + 8) * sizeof(T) + kRows * (kKeys + 8) * sizeof(T) + 2 * kRows * sizeof(float));
  auto kernel = backward_mma_kernel<T, kD>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  dim3 grid(unsigned((s.seq_kv + kKeys - 1) / kKeys), unsigned(s.batch * s.heads_kv));
  kernel<<<grid, kThreads, bytes, p.stream>>>(s, static_cast<const T*>(p.q), static_cast<const T*>(p.k),
                                              static_cast<const T*>(p.v), static_cast<const T*>(p.d_o), p.lse, delta, dq32,
                                              static_cast<T*>(p.dk), static_cast<T*>(p.dv));
  CUDA_CHECK_LAUNCH();
  const int64_t n = s.q_elems();
  round_dq_kernel<T><<<unsigned((n + 255) / 256), 256, 0, p.stream>>>(dq32, static_cast<T*>(p.dq), n);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void launch_mma(const BackwardParams& p) {
  if (p.shape.head_dim == 64) {
    launch_dim<T, 64>(p);
  } else {
    launch_dim<T, 128>(p);
  }
}

std::string mma_backward_support(const AttentionShape& s) {
  if (s.head_dim != 64 && s.head_dim != 128) return "head_dim must be 64 or 128, got " + std::to_string(s.head_dim);
  const GpuInfo& gpu = detect_gpu();
  if (gpu.available && gpu.sm_major < 8) return "needs an sm_80 or newer GPU (mma.sync with bf16)";
  if (int64_t(s.batch) * s.heads_kv > 65535) return "batch*heads_kv must be at most 65535";
  return "";
}

BackwardKernel mma_kernel(const char* name, DType dtype, void (*launch)(const BackwardParams&)) {
  BackwardKernel k{name, 7, 2, "mma", dtype,
                   "tensor cores (mma.sync): S^T and dP^T per warp's 16 keys, dK/dV in registers, dQ via fp32 atomics",
                   launch};
  k.supports = mma_backward_support;
  k.workspace_bytes = [](const AttentionShape& s) {
    return std::size_t(s.lse_elems()) * sizeof(float) + std::size_t(s.q_elems()) * sizeof(float);
  };
  return k;
}

}  // namespace

FA_REGISTER_BACKWARD_KERNEL(mma_kernel("ch07_mma_fp16", DType::F16, launch_mma<__half>));
FA_REGISTER_BACKWARD_KERNEL(mma_kernel("ch07_mma_bf16", DType::BF16, launch_mma<__nv_bfloat16>));

}  // namespace fa::backward
