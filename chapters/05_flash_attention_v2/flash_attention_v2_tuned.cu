// Chapter 05, variant 5 -- `tuned`: variant 4's kernel reshaped until the tensor cores, not the
// shared-memory port, set the pace.
//
// What changes against variant 4 (each reason is in the chapter README):
//   * 32 Q rows per warp (two m16 tiles), 128 per block of 4 warps: every K or V fragment read
//     from shared memory now feeds two mma instead of one, halving shared-memory reads per flop.
//   * Q fragments come from shared memory with ldmatrix at each k-step (at d = 128 there is no
//     room left in the registers for them; the S and O accumulators take 192 of them).
//   * K and V wait separately: V_j's copy runs behind S = Q K_j^T, K_{j+1}'s behind P V_j, with
//     one shared-memory buffer each. Two blocks share an SM, so one block's barriers are the
//     other block's issue slots.
//   * The scale is folded into the exponent: p = exp2(s * scale * log2 e - m), one FFMA and one
//     MUFU.EX2 per score.
//   * Blocks start with the last Q tile: under a causal mask it has the most K/V tiles, so the
//     longest blocks start first and the short ones fill the tail.
//   * O is staged through shared memory (the block's own Q rows) and written with 16-byte stores.
// The per-tile steps are in tuned_tile.cuh (chapter 06's variant 1 reuses them).
// Run: build/bin/ch05_flash_attention_v2 --variant tuned
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "algorithm.h"
#include "ampere.cuh"
#include "cuda_check.h"
#include "log2_units.h"
#include "mma_variants.h"
#include "not_implemented.h"
#include "registry.h"
#include "static_switch.h"
#include "tuned_tile.cuh"

namespace fa::flash2 {
namespace {

using namespace fa::ampere;

constexpr int kTunedWarps = 4, kTunedThreads = 32 * kTunedWarps;
constexpr int kWarpRows = 32, kBlockRows = kWarpRows * kTunedWarps;  // two m16 tiles per warp

/// Rows [first, first + kRows) of a [n_rows, kD] 16-bit matrix into shared memory (row stride
/// kD + 8) with cp.async, 16 bytes per copy; rows past the end are filled with zeros by plain
/// stores. Each thread keeps one column chunk and steps down the rows, so all its addresses are
/// one base plus constants (a per-row clamp would cost a 64-bit register per copy, kept live
/// across the K/V loop).
template <class T, int kD, int kRows>
__device__ void copy_rows_async(T* tile, const T* src, int first, int n_rows) {
  //! [tuned_copy_rows]
  constexpr int kChunks = kD / 8, kLd = kD + 8, kRowStep = kTunedThreads / kChunks;
  static_assert(kTunedThreads % kChunks == 0 && kRows % kRowStep == 0, "every thread copies the same chunks");
  const int r0 = int(threadIdx.x) / kChunks, c = int(threadIdx.x) % kChunks;
  const T* from = src + (int64_t(first) + r0) * kD + c * 8;
  T* to = tile + r0 * kLd + c * 8;
#pragma unroll
  for (int i = 0; i < kRows / kRowStep; ++i) {
    if (first + r0 + i * kRowStep < n_rows) {
      cp_async_16(to + i * kRowStep * kLd, from + i * kRowStep * kD, true);
    } else {
      *reinterpret_cast<uint4*>(to + i * kRowStep * kLd) = make_uint4(0, 0, 0, 0);
    }
  }
  //! [tuned_copy_rows]
}

/// Keys per K/V tile. The S accumulators (2 x kKeys / 8 x 4 floats per thread) and the O
/// accumulators (2 x kD / 8 x 4) share the 255 registers a thread can have: either choice
/// below gives them 192 together.
template <int kD>
constexpr int kTunedKeys = kD == 64 ? 128 : 64;

/// kKeys: keys per K/V tile (kTunedKeys<kD>).
template <class T, int kD, int kKeys>
__global__ void __launch_bounds__(kTunedThreads, 2)
    flash2_tuned_kernel(AttentionShape shape, const T* q, const T* k, const T* v, T* o, float* lse) {
  constexpr int kLd = kD + 8, kKeyBlocks = kKeys / 8;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  T* q_s = reinterpret_cast<T*>(shared_bytes);  // [128][kLd]; O is staged here at the end
  T* k_s = q_s + kBlockRows * kLd;              // [kKeys][kLd]
  T* v_s = k_s + kKeys * kLd;                   // [kKeys][kLd]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int n_q = shape.seq_q, n_k = shape.seq_kv, bh = blockIdx.y;
  const int i0 = (gridDim.x - 1 - blockIdx.x) * kBlockRows;  // last Q tile first
  const T* q_head = q + shape.q_head_offset(bh);
  const T* k_head = k + shape.kv_head_offset(bh);
  const T* v_head = v + shape.kv_head_offset(bh);
  const int last_row = min(i0 + kBlockRows, n_q) - 1;
  const int key_end = shape.causal ? shape.visible_keys(last_row) : n_k;
  const float scale_log2 = float(shape.softmax_scale()) * kLog2e;

  copy_rows_async<T, kD, kBlockRows>(q_s, q_head, i0, n_q);
  if (key_end > 0) copy_rows_async<T, kD, kKeys>(k_s, k_head, 0, n_k);
  cp_async_commit();

  // Thread (g, t) of warp w holds rows w*32 + mt*16 + h*8 + g for mt, h in {0, 1}: index 2*mt + h.
  float out[2][kD / 8][4] = {};
  float m[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, l[4] = {};  // m in log2 units, scale folded in

  //! [tuned_loop]
  for (int j0 = 0; j0 < key_end; j0 += kKeys) {
    cp_async_wait<0>();
    __syncthreads();  // K_j (and Q) have landed, and every warp is done reading V_{j-1}
    copy_rows_async<T, kD, kKeys>(v_s, v_head, j0, n_k);
    cp_async_commit();

    float s[2][kKeyBlocks][4] = {};
    tuned_scores<T, kD, kKeys, PaddedRows<kD>, PaddedRows<kD>>(s, q_s, k_s, warp, lane);
    // Only tiles that cross the causal diagonal for some row of the block, or the ends, are masked.
    const bool needs_mask =
        (shape.causal && j0 + kKeys > shape.visible_keys(i0)) || j0 + kKeys > n_k || i0 + kBlockRows > n_q;
    if (needs_mask) tuned_mask<kKeys>(s, shape, i0 + kWarpRows * warp, j0, g, t);

    cp_async_wait<0>();
    __syncthreads();  // V_j has landed, and every warp is done reading K_j
    if (j0 + kKeys < key_end) copy_rows_async<T, kD, kKeys>(k_s, k_head, j0 + kKeys, n_k);
    cp_async_commit();

    tuned_softmax<kD, kKeys>(s, out, m, l, scale_log2);
    tuned_pv<T, kD, kKeys, PaddedRows<kD>>(out, s, v_s, lane);
  }
  //! [tuned_loop]

  // Epilogue. The Q copy may still be in flight if the loop never ran (a causal block that sees
  // no key), and other threads' copies land in this warp's rows: wait for all of them.
  cp_async_wait<0>();
  __syncthreads();
  float inv_l[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    l[r] = quad_sum(l[r]);
    inv_l[r] = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
  }
  // O / l rounded to T into the warp's own 32 rows of q_s, then 16-byte stores to device memory.
  T* o_warp = q_s + kWarpRows * warp * kLd;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int db = 0; db < kD / 8; ++db)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float inv = inv_l[2 * mt + h];
        *reinterpret_cast<uint32_t*>(o_warp + (16 * mt + 8 * h + g) * kLd + db * 8 + 2 * t) =
            Mma<T>::pack(out[mt][db][2 * h] * inv, out[mt][db][2 * h + 1] * inv);
      }
  __syncwarp();
  T* o_head = o + shape.q_head_offset(bh);
  constexpr int kChunks = kD / 8;
#pragma unroll
  for (int i = 0; i < kWarpRows * kChunks / 32; ++i) {
    const int e = i * 32 + lane, r = e / kChunks, c = e % kChunks, row = i0 + kWarpRows * warp + r;
    if (row < n_q)
      *reinterpret_cast<uint4*>(o_head + int64_t(row) * kD + c * 8) =
          *reinterpret_cast<const uint4*>(o_warp + r * kLd + c * 8);
  }
  if (t == 0) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int row = i0 + kWarpRows * warp + 16 * (r / 2) + 8 * (r % 2) + g;
      // LSE = ln(sum e^(s * scale)) = (m + log2 l) * ln 2, with m and l in log2 units.
      if (row < n_q) lse[int64_t(bh) * n_q + row] = m[r] == -INFINITY ? -INFINITY : (m[r] + log2f(l[r])) * kLn2;
    }
  }
}

template <class T, int kD>
void launch_tuned_dim(const ForwardParams& p) {
  // BEGIN SOLUTION ch05_pv: write the P V step (tuned_pv in tuned_tile.cuh, the mma_pv block of flash_attention_v2_mma.cu, the warp's P V in flash_attention_v2_kv_split.cu), then delete this line
  // END SOLUTION
  constexpr int kKeys = kTunedKeys<kD>;
  const AttentionShape& s = p.shape;
  const int bytes = int((kBlockRows + 2 * kKeys) * (kD + 8) * sizeof(T));
  auto kernel = flash2_tuned_kernel<T, kD, kKeys>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  dim3 grid(unsigned((s.seq_q + kBlockRows - 1) / kBlockRows), unsigned(s.batch * s.heads_q));
  kernel<<<grid, kTunedThreads, bytes, p.stream>>>(s, static_cast<const T*>(p.q), static_cast<const T*>(p.k),
                                                   static_cast<const T*>(p.v), static_cast<T*>(p.o), p.lse);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void launch_tuned(const ForwardParams& p) {
  with_head_dim<64, 128>(p.shape.head_dim, [&](auto d) { launch_tuned_dim<T, d.value>(p); });
}

ForwardKernel tuned_kernel(const char* name, DType dtype, void (*launch)(const ForwardParams&)) {
  const char* summary =
      "variant 4 with 32 rows per warp (128 per block), Q via ldmatrix, split K/V waits, scale in the exponent";
  ForwardKernel k{name, 5, 5, "tuned", dtype, summary, launch};
  k.supports = mma_support;
  return k;
}

}  // namespace

FA_REGISTER_FORWARD_KERNEL(tuned_kernel("ch05_tuned_fp16", DType::F16, launch_tuned<__half>));
FA_REGISTER_FORWARD_KERNEL(tuned_kernel("ch05_tuned_bf16", DType::BF16, launch_tuned<__nv_bfloat16>));

}  // namespace fa::flash2
