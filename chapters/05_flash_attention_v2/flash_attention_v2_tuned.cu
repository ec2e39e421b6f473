// Chapter 05, variant 5 -- `tuned`: variant 4's kernel reshaped until the tensor cores, not the
// shared-memory port, set the pace.
//
// What changes against variant 4 (each reason is in the chapter README):
//   * 32 Q rows per warp (two m16 tiles), 128 per block of 4 warps: every K or V fragment read
//     from shared memory now feeds two mma instead of one, halving shared-memory reads per flop.
//     At head_dim 256 the O accumulators of two m-tiles would fill every register: there a warp
//     keeps one m-tile (64 rows per block). Head dims 64, 96, 128 and 256.
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
// The per-tile steps are in tuned_tile.cuh (chapter 06's variant 1 and chapter 09 reuse them).
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

/// Keys per K/V tile. The S accumulators (kMt x kKeys / 8 x 4 floats per thread) and the O
/// accumulators (kMt x kD / 8 x 4) share the 255 registers a thread can have:
///   d =  64: 2 m-tiles, 128 keys: 128 + 64 = 192     d = 128: 2 m-tiles, 64 keys: 64 + 128 = 192
///   d =  96: 2 m-tiles,  64 keys:  64 + 96 = 160     d = 256: 1 m-tile,  64 keys: 32 + 128 = 160
template <int kD>
constexpr int kTunedKeys = kD == 64 ? 128 : 64;

/// kKeys: keys per K/V tile (kTunedKeys<kD>); kMt: m16 tiles of Q rows per warp (kTunedMTiles<kD>).
template <class T, int kD, int kKeys, int kMt>
__global__ void __launch_bounds__(kTunedThreads, 2)
    flash2_tuned_kernel(AttentionShape shape, const T* q, const T* k, const T* v, T* o, float* lse) {
  constexpr int kLd = kD + 8, kKeyBlocks = kKeys / 8;
  constexpr int kWarpRows = 16 * kMt, kBlockRows = kWarpRows * kTunedWarps;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  T* q_s = reinterpret_cast<T*>(shared_bytes);  // [kBlockRows][kLd]; O is staged here at the end
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

  // Thread (g, t) of warp w holds rows w*kWarpRows + mt*16 + h*8 + g for mt < kMt, h < 2: index 2*mt + h.
  float out[kMt][kD / 8][4] = {};
  float m[2 * kMt], l[2 * kMt] = {};  // m in log2 units, scale folded in
#pragma unroll
  for (int r = 0; r < 2 * kMt; ++r) m[r] = -INFINITY;

  //! [tuned_loop]
  for (int j0 = 0; j0 < key_end; j0 += kKeys) {
    cp_async_wait<0>();
    __syncthreads();  // K_j (and Q) have landed, and every warp is done reading V_{j-1}
    copy_rows_async<T, kD, kKeys>(v_s, v_head, j0, n_k);
    cp_async_commit();

    float s[kMt][kKeyBlocks][4] = {};
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
  tuned_store_output<T, kD>(out, m, l, q_s, o + shape.q_head_offset(bh), lse + int64_t(bh) * n_q, i0, n_q, warp, lane);
}

template <class T, int kD>
void launch_tuned_dim(const ForwardParams& p) {
  require_tuned_pv();
  constexpr int kKeys = kTunedKeys<kD>, kBlockRows = kTunedBlockRows<kD>;
  const AttentionShape& s = p.shape;
  const int bytes = int((kBlockRows + 2 * kKeys) * (kD + 8) * sizeof(T));
  auto kernel = flash2_tuned_kernel<T, kD, kKeys, kTunedMTiles<kD>>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  dim3 grid(unsigned((s.seq_q + kBlockRows - 1) / kBlockRows), unsigned(s.batch * s.heads_q));
  kernel<<<grid, kTunedThreads, bytes, p.stream>>>(s, static_cast<const T*>(p.q), static_cast<const T*>(p.k),
                                                   static_cast<const T*>(p.v), static_cast<T*>(p.o), p.lse);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void launch_tuned(const ForwardParams& p) {
  with_head_dim<64, 96, 128, 256>(p.shape.head_dim, [&](auto d) { launch_tuned_dim<T, d.value>(p); });
}

ForwardKernel tuned_kernel(const char* name, DType dtype, void (*launch)(const ForwardParams&)) {
  const char* summary =
      "variant 4 with 32 rows per warp (128 per block), Q via ldmatrix, split K/V waits, scale in the exponent";
  ForwardKernel k{name, 5, 5, "tuned", dtype, summary, launch};
  k.supports = [](const AttentionShape& s) { return mma_support(s, {64, 96, 128, 256}); };
  return k;
}

}  // namespace

FA_REGISTER_FORWARD_KERNEL(tuned_kernel("ch05_tuned_fp16", DType::F16, launch_tuned<__half>));
FA_REGISTER_FORWARD_KERNEL(tuned_kernel("ch05_tuned_bf16", DType::BF16, launch_tuned<__nv_bfloat16>));

}  // namespace fa::flash2
