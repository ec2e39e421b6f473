// Chapter 07, variant 1 -- `fp32`: the backward by recomputation, as algorithm.h computes it, in
// fp32 on CUDA cores. The teaching version: every step is a plain loop over shared memory.
//
//   1. A preprocessing kernel: D_i = dO_i . O_i, one warp per query row.
//   2. One block per (64-key K/V tile, K/V head): K_j and V_j stay in shared memory, dK_j and
//      dV_j in registers. The block walks every query head that reads this K/V head (GQA) and
//      every Q tile that can see the keys (causal tiles above the diagonal are skipped):
//        P = exp(S - LSE) recomputed, dS = P * (dO V^T - D),
//        dV_j += P^T dO_i,  dK_j += dS^T Q_i * scale   (this block's own rows: no conflicts)
//        dQ_i += dS K_j * scale                        (every K/V block adds to dQ_i: atomics)
//   3. dQ is zeroed before the launch, since it is only ever added to.
// Run: build/bin/ch07_backward --variant fp32
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda_check.h"
#include "delta.cuh"
#include "not_implemented.h"
#include "registry.h"

namespace fa::backward {
namespace {

constexpr int kTile = 64, kThreads = 256, kLdP = kTile + 1;

template <int kD>
__global__ void __launch_bounds__(kThreads)
    backward_fp32_kernel(AttentionShape s, const float* q, const float* k, const float* v, const float* d_o,
                         const float* lse, const float* delta, float* dq, float* dk, float* dv) {
  constexpr int kPer = kTile * kD / kThreads;  // dK / dV elements per thread
  extern __shared__ float smem[];
  float* k_s = smem;                 // [64][kD]
  float* v_s = k_s + kTile * kD;     // [64][kD]
  float* q_s = v_s + kTile * kD;     // [64][kD]
  float* do_s = q_s + kTile * kD;    // [64][kD]
  float* p_s = do_s + kTile * kD;    // [64 rows][65]: P
  float* ds_s = p_s + kTile * kLdP;  // [64 rows][65]: dS
  float* row_lse = ds_s + kTile * kLdP;
  float* row_delta = row_lse + kTile;

  const int j0 = blockIdx.x * kTile, kv_plane = blockIdx.y;
  const int batch = kv_plane / s.heads_kv, kvh = kv_plane % s.heads_kv, group = s.group_size();
  const int keys = min(kTile, s.seq_kv - j0);
  const float scale = float(s.softmax_scale());
  const int64_t kv_base = int64_t(kv_plane) * s.seq_kv * kD;

  for (int e = threadIdx.x; e < kTile * kD; e += kThreads) {
    const int c = e / kD;
    k_s[e] = c < keys ? k[kv_base + int64_t(j0) * kD + e] : 0.0f;
    v_s[e] = c < keys ? v[kv_base + int64_t(j0) * kD + e] : 0.0f;
  }
  float acc_k[kPer] = {}, acc_v[kPer] = {};

  // Causal: rows before the first one that sees key j0 see none of this tile.
  const int first_row = s.causal ? max(0, j0 - s.causal_offset()) : 0;
  for (int hq = kvh * group; hq < (kvh + 1) * group; ++hq) {
    const int bh = batch * s.heads_q + hq;
    const int64_t q_base = int64_t(bh) * s.seq_q * kD;
    for (int i0 = first_row / kTile * kTile; i0 < s.seq_q; i0 += kTile) {
      const int rows = min(kTile, s.seq_q - i0);
      __syncthreads();  // the previous tile's P, dS, Q and dO are no longer read
      for (int e = threadIdx.x; e < kTile * kD; e += kThreads) {
        const int r = e / kD;
        q_s[e] = r < rows ? q[q_base + int64_t(i0) * kD + e] : 0.0f;
        do_s[e] = r < rows ? d_o[q_base + int64_t(i0) * kD + e] : 0.0f;
      }
      for (int r = threadIdx.x; r < kTile; r += kThreads) {
        row_lse[r] = r < rows ? lse[int64_t(bh) * s.seq_q + i0 + r] : -INFINITY;
        row_delta[r] = r < rows ? delta[int64_t(bh) * s.seq_q + i0 + r] : 0.0f;
      }
      __syncthreads();

      //! [backward_fp32_tile]
      // P (recomputed) and dS for the 64 x 64 tile.
      // BEGIN SOLUTION ch07_ds (device): the block's threads stride the kTile x kTile elements (r, c) of the tile: P = exp(scale q_i . k_j - LSE_i) from q_s, k_s and row_lse (0 where r >= rows, c >= keys, (i, j) masked or LSE_i = -inf), dP = dO_i . v_j from do_s and v_s; p_s[r * kLdP + c] = P and ds_s[r * kLdP + c] = P (dP - row_delta[r])
      for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
        const int r = e / kTile, c = e % kTile, i = i0 + r, j = j0 + c;
        float p = 0.0f, dp = 0.0f;
        if (r < rows && c < keys && s.visible(i, j) && row_lse[r] != -INFINITY) {
          float dot = 0.0f;
          for (int x = 0; x < kD; ++x) dot += q_s[r * kD + x] * k_s[c * kD + x];
          p = expf(dot * scale - row_lse[r]);
          for (int x = 0; x < kD; ++x) dp += do_s[r * kD + x] * v_s[c * kD + x];
        }
        p_s[r * kLdP + c] = p;
        ds_s[r * kLdP + c] = p * (dp - row_delta[r]);
      }
      // END SOLUTION
      __syncthreads();
      // dV_j += P^T dO_i and dK_j += dS^T Q_i: thread-owned elements of this block's tile.
#pragma unroll
      for (int t = 0; t < kPer; ++t) {
        const int e = threadIdx.x + t * kThreads, c = e / kD, x = e % kD;
        float sv = 0.0f, sk = 0.0f;
        for (int r = 0; r < kTile; ++r) {
          sv += p_s[r * kLdP + c] * do_s[r * kD + x];
          sk += ds_s[r * kLdP + c] * q_s[r * kD + x];
        }
        acc_v[t] += sv;
        acc_k[t] += sk;
      }
      // dQ_i += dS K_j * scale: other K/V blocks add to the same rows, hence atomics.
      for (int e = threadIdx.x; e < rows * kD; e += kThreads) {
        const int r = e / kD, x = e % kD;
        float sum = 0.0f;
        for (int c = 0; c < keys; ++c) sum += ds_s[r * kLdP + c] * k_s[c * kD + x];
        atomicAdd(&dq[q_base + int64_t(i0 + r) * kD + x], sum * scale);
      }
      //! [backward_fp32_tile]
    }
  }
#pragma unroll
  for (int t = 0; t < kPer; ++t) {
    const int e = threadIdx.x + t * kThreads, c = e / kD;
    if (c < keys) {
      dk[kv_base + int64_t(j0) * kD + e] = acc_k[t] * scale;
      dv[kv_base + int64_t(j0) * kD + e] = acc_v[t];
    }
  }
}

template <int kD>
void launch_dim(const BackwardParams& p) {
  const AttentionShape& s = p.shape;
  float* delta = static_cast<float*>(p.workspace);
  CUDA_CHECK(cudaMemsetAsync(p.dq, 0, std::size_t(s.q_elems()) * sizeof(float), p.stream));
  launch_delta<float>(p, delta);
  const int bytes = int((4 * kTile * kD + 2 * kTile * kLdP + 2 * kTile) * sizeof(float));
  auto kernel = backward_fp32_kernel<kD>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  dim3 grid(unsigned((s.seq_kv + kTile - 1) / kTile), unsigned(s.batch * s.heads_kv));
  kernel<<<grid, kThreads, bytes, p.stream>>>(s, static_cast<const float*>(p.q), static_cast<const float*>(p.k),
                                              static_cast<const float*>(p.v), static_cast<const float*>(p.d_o), p.lse,
                                              delta, static_cast<float*>(p.dq), static_cast<float*>(p.dk),
                                              static_cast<float*>(p.dv));
  CUDA_CHECK_LAUNCH();
}

void launch_fp32(const BackwardParams& p) {
  // BEGIN SOLUTION ch07_ds: write the P and dS step of backward_fp32_kernel, then delete this line
  // END SOLUTION
  switch (p.shape.head_dim) {
    case 32: launch_dim<32>(p); break;
    case 64: launch_dim<64>(p); break;
    default: launch_dim<128>(p); break;
  }
}

std::string fp32_support(const AttentionShape& s) {
  if (s.head_dim != 32 && s.head_dim != 64 && s.head_dim != 128)
    return "head_dim must be 32, 64 or 128, got " + std::to_string(s.head_dim);
  if (int64_t(s.batch) * s.heads_kv > 65535) return "batch*heads_kv must be at most 65535";
  return "";
}

BackwardKernel fp32_kernel() {
  const char* summary = "D preprocessing; one block per K/V tile looping over Q tiles; P recomputed; dQ with atomics";
  BackwardKernel k{"ch07_fp32", 7, 1, "fp32", DType::F32, summary, launch_fp32};
  k.supports = fp32_support;
  k.workspace_bytes = [](const AttentionShape& s) { return std::size_t(s.lse_elems()) * sizeof(float); };
  return k;
}

}  // namespace

FA_REGISTER_BACKWARD_KERNEL(fp32_kernel());

}  // namespace fa::backward
