// The register-tile attention kernel: chapter 04's variant 3, and with 16-bit inputs and chapter
// 05's row update (deferred normalization, its own policy type) chapter 05's variant 1. One block per 64-row Q tile walks the K/V tiles; each of
// the 256 threads owns a 4 x 4 patch of S and ceil(d / 64) 4 x 4 patches of O (O in registers for
// the whole loop); Q and K are stored transposed ([dim][row], stride 65) so both products read
// them without bank conflicts.
// Run: build/bin/ch04_flash_attention_v1 --variant registers
//      build/bin/ch05_flash_attention_v2 --variant deferred
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "block_limits.h"
#include "cuda_check.h"
#include "not_implemented.h"
#include "registry.h"
#include "row_update.cuh"

namespace fa::flash1 {

constexpr int kTile = 64, kLd = kTile + 1, kPatch = 4, kRegThreads = 256;

inline std::size_t register_shared_floats(int d) {
  return std::size_t(2 * d * kLd + kTile * d + kTile * kLd + 4 * kTile);
}

/// The row update, as a policy type: after each K/V tile, the thread that owns a row calls
///   RowFactors update(float* p, int stride, int keys, float tile_max, float& m, float& l)
/// on the row's scores (p[c * stride] for c < keys, -inf where masked; tile_max their max), which
/// it replaces by what multiplies V_j, and on the row's running (m, l); the kernel then sets
/// O <- alpha O + beta P V_j. kNormalized says whether O is kept divided by l throughout, or
/// divided once at the end; require() is what the launcher checks before a launch. This chapter's
/// policy is FlashAttention-1's; chapter 05 brings its own (deferred normalization).
struct PerStepRows {
  static constexpr bool kNormalized = true;
  static void require() { require_row_update(); }
  /// P~ against the tile's own max, and flash1_row_update's factors: O kept normalized.
  __device__ static RowFactors update(float* p, int stride, int keys, float tile_max, float& m, float& l) {
    float tile_sum = 0.0f;
    for (int c = 0; c < keys; ++c) {
      const float e = tile_max == -INFINITY ? 0.0f : expf(p[c * stride] - tile_max);
      p[c * stride] = e;
      tile_sum += e;
    }
    return flash1_row_update(m, l, tile_max, tile_sum, [](float x) { return expf(x); });
  }
};

/// T: the element type of Q, K, V and O (math and shared memory are fp32).
/// kChunks = ceil(head_dim / 64): the output patch of a thread is kChunks x 4 x 4 registers.
/// RowUpdate: the row update's policy (PerStepRows here).
template <class T, int kChunks, class RowUpdate>
__global__ void __launch_bounds__(kRegThreads)
    register_tiles_kernel(AttentionShape shape, const T* q, const T* k, const T* v, T* o, float* lse) {
  extern __shared__ float shared[];
  const int d = shape.head_dim, n_q = shape.seq_q, n_k = shape.seq_kv;
  float* q_t = shared;           // [d][65]: q_t[x * 65 + r] = Q[i0 + r][x]
  float* k_t = q_t + d * kLd;    // [d][65]: k_t[x * 65 + c] = K[j0 + c][x]
  float* v_s = k_t + d * kLd;    // [64][d]
  float* p_t = v_s + kTile * d;  // [64][65]: p_t[c * 65 + r] = S, then P~, of (row r, key c)
  float* m = p_t + kTile * kLd;
  float* l = m + kTile;
  float* alpha = l + kTile;
  float* beta = alpha + kTile;

  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int i0 = blockIdx.x * kTile, bh = blockIdx.y, rows = min(kTile, n_q - i0);
  const T* q_head = q + shape.q_head_offset(bh);
  const T* k_head = k + shape.kv_head_offset(bh);
  const T* v_head = v + shape.kv_head_offset(bh);
  const float scale = float(shape.softmax_scale());

  // Consecutive threads read consecutive floats of a row (coalesced); the transposed store
  // lands in distinct banks thanks to the 65-float row stride.
  for (int e = threadIdx.x; e < kTile * d; e += blockDim.x) {
    const int r = e / d, x = e % d;
    q_t[x * kLd + r] = i0 + r < n_q ? float(q_head[int64_t(i0 + r) * d + x]) : 0.0f;
  }
  for (int r = threadIdx.x; r < kTile; r += blockDim.x) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
  }
  float out[kChunks][kPatch][kPatch] = {};

  const int key_end = shape.causal ? shape.visible_keys(i0 + rows - 1) : n_k;
  for (int j0 = 0; j0 < key_end; j0 += kTile) {
    __syncthreads();
    for (int e = threadIdx.x; e < kTile * d; e += blockDim.x) {
      const int c = e / d, x = e % d;
      const bool in = j0 + c < n_k;
      k_t[x * kLd + c] = in ? float(k_head[int64_t(j0 + c) * d + x]) : 0.0f;
      v_s[c * d + x] = in ? float(v_head[int64_t(j0 + c) * d + x]) : 0.0f;
    }
    __syncthreads();

    //! [flash1_register_scores]
    // S patch: rows ty + 16a, keys tx + 16b. Per x: 4 + 4 shared loads feed 16 multiply-adds.
    float s[kPatch][kPatch] = {};
    for (int x = 0; x < d; ++x) {
      float qa[kPatch], kb[kPatch];
#pragma unroll
      for (int t = 0; t < kPatch; ++t) {
        qa[t] = q_t[x * kLd + ty + 16 * t];
        kb[t] = k_t[x * kLd + tx + 16 * t];
      }
#pragma unroll
      for (int a = 0; a < kPatch; ++a)
#pragma unroll
        for (int b = 0; b < kPatch; ++b) s[a][b] += qa[a] * kb[b];
    }
    //! [flash1_register_scores]
#pragma unroll
    for (int a = 0; a < kPatch; ++a) {
#pragma unroll
      for (int b = 0; b < kPatch; ++b) {
        const int r = ty + 16 * a, c = tx + 16 * b, i = i0 + r, j = j0 + c;
        p_t[c * kLd + r] = (i < n_q && j < n_k && shape.visible(i, j)) ? s[a][b] * scale : -INFINITY;
      }
    }
    __syncthreads();

    // One thread per row, on column r of p_t: the policy's update.
    if (threadIdx.x < kTile) {
      const int r = threadIdx.x;
      float tile_max = -INFINITY;
      for (int c = 0; c < kTile; ++c) tile_max = fmaxf(tile_max, p_t[c * kLd + r]);
      const RowFactors f = RowUpdate::update(p_t + r, kLd, kTile, tile_max, m[r], l[r]);
      alpha[r] = f.alpha;
      beta[r] = f.beta;
    }
    __syncthreads();

    //! [flash1_register_output]
    // O patch = alpha * O + beta * P~ V_j, for each 64-column chunk of the head dimension.
#pragma unroll
    for (int ch = 0; ch < kChunks; ++ch) {
      float pv[kPatch][kPatch] = {};
      for (int c = 0; c < kTile; ++c) {
        float pa[kPatch], vb[kPatch];
#pragma unroll
        for (int t = 0; t < kPatch; ++t) {
          const int col = ch * kTile + tx + 16 * t;
          pa[t] = p_t[c * kLd + ty + 16 * t];
          vb[t] = col < d ? v_s[c * d + col] : 0.0f;
        }
#pragma unroll
        for (int a = 0; a < kPatch; ++a)
#pragma unroll
          for (int b = 0; b < kPatch; ++b) pv[a][b] += pa[a] * vb[b];
      }
#pragma unroll
      for (int a = 0; a < kPatch; ++a) {
        const int r = ty + 16 * a;
#pragma unroll
        for (int b = 0; b < kPatch; ++b) out[ch][a][b] = alpha[r] * out[ch][a][b] + beta[r] * pv[a][b];
      }
    }
    //! [flash1_register_output]
  }

  __syncthreads();
  T* o_head = o + shape.q_head_offset(bh);
#pragma unroll
  for (int ch = 0; ch < kChunks; ++ch) {
#pragma unroll
    for (int a = 0; a < kPatch; ++a) {
      const int r = ty + 16 * a;
      // Not normalized along the way: the one division by l, at the end (a row that saw no key has
      // l = 0 and O = 0).
      const float inv_l = RowUpdate::kNormalized ? 1.0f : (l[r] > 0.0f ? 1.0f / l[r] : 0.0f);
#pragma unroll
      for (int b = 0; b < kPatch; ++b) {
        const int col = ch * kTile + tx + 16 * b;
        if (r < rows && col < d) o_head[int64_t(i0 + r) * d + col] = T(out[ch][a][b] * inv_l);
      }
    }
  }
  if (threadIdx.x < rows) {
    const int r = threadIdx.x;
    lse[int64_t(bh) * n_q + i0 + r] = m[r] == -INFINITY ? -INFINITY : m[r] + logf(l[r]);
  }
}

template <class T, int kChunks, class RowUpdate>
void launch_register_tiles_chunks(const ForwardParams& p) {
  const AttentionShape& s = p.shape;
  const std::size_t bytes = register_shared_floats(s.head_dim) * sizeof(float);
  auto kernel = register_tiles_kernel<T, kChunks, RowUpdate>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  dim3 grid(unsigned((s.seq_q + kTile - 1) / kTile), unsigned(s.batch * s.heads_q));
  kernel<<<grid, kRegThreads, bytes, p.stream>>>(s, static_cast<const T*>(p.q), static_cast<const T*>(p.k),
                                                 static_cast<const T*>(p.v), static_cast<T*>(p.o), p.lse);
  CUDA_CHECK_LAUNCH();
}

/// Launches the kernel instance for p.shape.head_dim (up to 256).
template <class T, class RowUpdate>
void launch_register_tiles(const ForwardParams& p) {
  RowUpdate::require();
  switch ((p.shape.head_dim + kTile - 1) / kTile) {
    case 1: return launch_register_tiles_chunks<T, 1, RowUpdate>(p);
    case 2: return launch_register_tiles_chunks<T, 2, RowUpdate>(p);
    case 3: return launch_register_tiles_chunks<T, 3, RowUpdate>(p);
    default: return launch_register_tiles_chunks<T, 4, RowUpdate>(p);
  }
}

inline std::string register_tiles_support(const AttentionShape& s) {
  if (s.head_dim > 4 * kTile) {
    return "head_dim must be at most " + std::to_string(4 * kTile) + " (the output patch lives in registers), got " +
           std::to_string(s.head_dim);
  }
  return block_limits(s, register_shared_floats(s.head_dim) * sizeof(float), true);
}

}  // namespace fa::flash1
