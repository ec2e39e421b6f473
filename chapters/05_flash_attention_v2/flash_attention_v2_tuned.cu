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
//     exp2f (MUFU.EX2 inside a range check) per score.
//   * Blocks start with the last Q tile: under a causal mask it has the most K/V tiles, so the
//     longest blocks start first and the short ones fill the tail.
//   * O is staged through shared memory (the block's own Q rows) and written with 16-byte stores.
// `tuned` also reads and writes strided tensors (strides.h: flash-attn's [batch, seq, heads,
// head_dim], views of a QKV projection) without a copy: a second instantiation takes the rows'
// strides from p.strides; the packed one keeps its compile-time row stride kD.
// The per-tile steps are in tuned_tile.cuh (chapter 06's variant 1 and chapter 09 reuse them).
// Each change but "Q from shared memory" (32 rows per warp cannot fit without it) can be undone
// alone: the kernels ch05_tuned_undo_<change>_bf16 are `tuned` with that one change undone, so
// make bench times what each is worth.
// Run: build/bin/ch05_flash_attention_v2 --variant tuned      (and tuned_undo_rows, ..., tuned_undo_stores)
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
#include "strides.h"
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

/// The changes against variant 4 that a step kernel undoes, one bit each (0: `tuned` itself).
namespace undo {
constexpr unsigned kRows = 1;     // one m16 tile per warp: 16 rows, 64 per block
constexpr unsigned kKeys = 2;     // 64-key tiles at d = 64 as well
constexpr unsigned kWaits = 4;    // K_{j+1} and V_{j+1} copied together after P V_j, one wait
constexpr unsigned kCopies = 8;   // copy addresses computed per row (variant 4's load_tile_async)
constexpr unsigned kScale = 16;   // the scale multiplied in before the max: an FMUL, then exp2(s - m)
constexpr unsigned kOrder = 32;   // Q tiles in launch order, the first first
constexpr unsigned kStores = 64;  // O stored from the registers, 4 bytes per store
}  // namespace undo

/// Rows [first, first + kRows) into shared memory, with one address computation per row and
/// chunk (variant 4's way): the undo::kCopies step kernel.
template <class T, int kD, int kRows, class Ld>
__device__ void copy_rows_each(T* tile, const T* src, int first, int n_rows, Ld ld) {
  constexpr int kChunks = kD / 8, kLd = kD + 8;
  for (int e = threadIdx.x; e < kRows * kChunks; e += kTunedThreads) {
    const int r = e / kChunks, c = e % kChunks;
    const bool valid = first + r < n_rows;
    cp_async_16(tile + r * kLd + c * 8, src + int64_t(valid ? first + r : 0) * ld + c * 8, valid);
  }
}

template <unsigned kUndo, class T, int kD, int kRows, class Ld>
__device__ __forceinline__ void copy_tile(T* tile, const T* src, int first, int n_rows, Ld ld) {
  if constexpr ((kUndo & undo::kCopies) != 0) {
    copy_rows_each<T, kD, kRows>(tile, src, first, n_rows, ld);
  } else {
    copy_rows_async<T, kD, kRows>(tile, src, first, n_rows, ld);
  }
}

/// S *= scale: the undo::kScale step kernel's extra multiply per score, before the max.
template <int kMt, int kKeyBlocks>
__device__ __forceinline__ void scale_scores(float (&s)[kMt][kKeyBlocks][4], float scale) {
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
    for (int nb = 0; nb < kKeyBlocks; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mt][nb][e] *= scale;
}

/// O / l rounded to T and LSE, stored from the registers (4 bytes per store): the undo::kStores
/// step kernel's epilogue.
template <class T, int kD, int kMt>
__device__ void store_output_direct(const float (&out)[kMt][kD / 8][4], const float (&m)[2 * kMt], float (&l)[2 * kMt],
                                    T* o_rows, float* lse_rows, int warp_row0, int n_q, int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int r = 0; r < 2 * kMt; ++r) {
    l[r] = quad_sum(l[r]);
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    const int mt = r / 2, h = r % 2, row = warp_row0 + 16 * mt + 8 * h + g;
    if (row >= n_q) continue;
#pragma unroll
    for (int db = 0; db < kD / 8; ++db)
      *reinterpret_cast<uint32_t*>(o_rows + int64_t(row) * kD + db * 8 + 2 * t) =
          Mma<T>::pack(out[mt][db][2 * h] * inv, out[mt][db][2 * h + 1] * inv);
    if (t == 0) lse_rows[row] = m[r] == -INFINITY ? -INFINITY : (m[r] + log2f(l[r])) * kLn2;
  }
}

/// The kernel's body. kKeys: keys per K/V tile (kTunedKeys<kD>); kMt: m16 tiles of Q rows per
/// warp (kTunedMTiles<kD>); kUndo: the undo:: bits of a step kernel (0 for `tuned`); kStrided:
/// the tensors' rows are where `st` says (else packed, and `st` is not read).
template <class T, int kD, int kKeys, int kMt, unsigned kUndo, bool kStrided = false>
__device__ __forceinline__ void flash2_tuned_body(const AttentionShape& shape, const T* q, const T* k, const T* v, T* o,
                                                  float* lse, const ForwardStrides& st = {}) {
  // The step kernels' undone changes (all false for `tuned`).
  constexpr bool kJointWait = (kUndo & undo::kWaits) != 0, kScaleFirst = (kUndo & undo::kScale) != 0;
  constexpr int kLd = kD + 8, kKeyBlocks = kKeys / 8;
  constexpr int kWarpRows = 16 * kMt, kBlockRows = kWarpRows * kTunedWarps;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  T* q_s = reinterpret_cast<T*>(shared_bytes);  // [kBlockRows][kLd]; O is staged here at the end
  T* k_s = q_s + kBlockRows * kLd;              // [kKeys][kLd]
  T* v_s = k_s + kKeys * kLd;                   // [kKeys][kLd]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int n_q = shape.seq_q, n_k = shape.seq_kv, bh = blockIdx.y;
  const int tile = (kUndo & undo::kOrder) != 0 ? blockIdx.x : gridDim.x - 1 - blockIdx.x;
  const int i0 = tile * kBlockRows;  // `tuned`: the last Q tile first
  // Row 0 of this head in each tensor, and how far apart its rows are (PackedStride: kD, known
  // at compile time).
  const T* q_head = q + shape.q_head_offset(bh);
  const T* k_head = k + shape.kv_head_offset(bh);
  const T* v_head = v + shape.kv_head_offset(bh);
  if constexpr (kStrided) {
    const int kv_plane = bh / shape.heads_q * shape.heads_kv + shape.kv_head(bh % shape.heads_q);
    q_head = q + st.q.at(bh, shape.heads_q, 0);
    k_head = k + st.k.at(kv_plane, shape.heads_kv, 0);
    v_head = v + st.v.at(kv_plane, shape.heads_kv, 0);
  }
  const auto q_ld = row_stride<kStrided, kD>(st.q), k_ld = row_stride<kStrided, kD>(st.k),
             v_ld = row_stride<kStrided, kD>(st.v);
  const int last_row = min(i0 + kBlockRows, n_q) - 1;
  const int key_end = shape.causal ? shape.visible_keys(last_row) : n_k;
  const float scale_log2 = float(shape.softmax_scale()) * kLog2e;

  copy_tile<kUndo, T, kD, kBlockRows>(q_s, q_head, i0, n_q, q_ld);
  if (key_end > 0) copy_tile<kUndo, T, kD, kKeys>(k_s, k_head, 0, n_k, k_ld);
  if (kJointWait && key_end > 0) copy_tile<kUndo, T, kD, kKeys>(v_s, v_head, 0, n_k, v_ld);
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
    if constexpr (!kJointWait) {
      copy_tile<kUndo, T, kD, kKeys>(v_s, v_head, j0, n_k, v_ld);  // V_j lands while S = Q K_j^T is computed
      cp_async_commit();
    }

    float s[kMt][kKeyBlocks][4] = {};
    tuned_scores<T, kD, kKeys, PaddedRows<kD>, PaddedRows<kD>>(s, q_s, k_s, warp, lane);
    // Only tiles that cross the causal diagonal for some row of the block, or the ends, are masked.
    const bool needs_mask =
        (shape.causal && j0 + kKeys > shape.visible_keys(i0)) || j0 + kKeys > n_k || i0 + kBlockRows > n_q;
    if (needs_mask) tuned_mask<kKeys>(s, shape, i0 + kWarpRows * warp, j0, g, t);

    if constexpr (!kJointWait) {
      cp_async_wait<0>();
      __syncthreads();  // V_j has landed, and every warp is done reading K_j
      if (j0 + kKeys < key_end)
        copy_tile<kUndo, T, kD, kKeys>(k_s, k_head, j0 + kKeys, n_k, k_ld);  // lands during P V_j
      cp_async_commit();
    }

    if constexpr (kScaleFirst) scale_scores(s, scale_log2);
    tuned_softmax<kD, kKeys>(s, out, m, l, kScaleFirst ? 1.0f : scale_log2);
    tuned_pv<T, kD, kKeys, PaddedRows<kD>>(out, s, v_s, lane);

    if constexpr (kJointWait) {
      __syncthreads();  // every warp is done reading K_j and V_j: copy both next tiles, behind nothing
      if (j0 + kKeys < key_end) {
        copy_tile<kUndo, T, kD, kKeys>(k_s, k_head, j0 + kKeys, n_k, k_ld);
        copy_tile<kUndo, T, kD, kKeys>(v_s, v_head, j0 + kKeys, n_k, v_ld);
      }
      cp_async_commit();
    }
  }
  //! [tuned_loop]

  // Epilogue. The Q copy may still be in flight if the loop never ran (a causal block that sees
  // no key), and other threads' copies land in this warp's rows: wait for all of them.
  cp_async_wait<0>();
  __syncthreads();
  if constexpr ((kUndo & undo::kStores) != 0) {
    store_output_direct<T, kD>(out, m, l, o + shape.q_head_offset(bh), lse + int64_t(bh) * n_q, i0 + kWarpRows * warp,
                               n_q, lane);
  } else {
    const int64_t o_head = kStrided ? st.o.at(bh, shape.heads_q, 0) : shape.q_head_offset(bh);
    tuned_store_output<T, kD>(out, m, l, q_s, o + o_head, lse + int64_t(bh) * n_q, i0, n_q, warp, lane,
                              row_stride<kStrided, kD>(st.o));
  }
}

template <class T, int kD, int kKeys, int kMt>
__global__ void __launch_bounds__(kTunedThreads, 2)
    flash2_tuned_kernel(AttentionShape shape, const T* q, const T* k, const T* v, T* o, float* lse) {
  flash2_tuned_body<T, kD, kKeys, kMt, 0>(shape, q, k, v, o, lse);
}

/// `tuned` on strided tensors.
template <class T, int kD, int kKeys, int kMt>
__global__ void __launch_bounds__(kTunedThreads, 2)
    flash2_tuned_strided_kernel(AttentionShape shape, const T* q, const T* k, const T* v, T* o, float* lse,
                                ForwardStrides st) {
  flash2_tuned_body<T, kD, kKeys, kMt, 0, true>(shape, q, k, v, o, lse, st);
}

/// A step kernel: `tuned` with the changes of kUndo undone.
template <class T, int kD, int kKeys, int kMt, unsigned kUndo>
__global__ void __launch_bounds__(kTunedThreads, 2)
    flash2_tuned_undo_kernel(AttentionShape shape, const T* q, const T* k, const T* v, T* o, float* lse) {
  flash2_tuned_body<T, kD, kKeys, kMt, kUndo>(shape, q, k, v, o, lse);
}

template <class T, int kD, unsigned kUndo = 0>
void launch_tuned_dim(const ForwardParams& p) {
  require_tuned_pv();
  constexpr int kKeys = (kUndo & undo::kKeys) != 0 ? 64 : kTunedKeys<kD>;
  constexpr int kMt = (kUndo & undo::kRows) != 0 ? 1 : kTunedMTiles<kD>, kBlockRows = 16 * kMt * kTunedWarps;
  const AttentionShape& s = p.shape;
  const int bytes = int((kBlockRows + 2 * kKeys) * (kD + 8) * sizeof(T));
  dim3 grid(unsigned((s.seq_q + kBlockRows - 1) / kBlockRows), unsigned(s.batch * s.heads_q));
  const auto q = static_cast<const T*>(p.q), k = static_cast<const T*>(p.k), v = static_cast<const T*>(p.v);
  if constexpr (kUndo == 0) {
    if (p.strides) {
      auto kernel = flash2_tuned_strided_kernel<T, kD, kKeys, kMt>;
      CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
      kernel<<<grid, kTunedThreads, bytes, p.stream>>>(s, q, k, v, static_cast<T*>(p.o), p.lse, *p.strides);
      CUDA_CHECK_LAUNCH();
      return;
    }
  }
  auto kernel = [] {
    if constexpr (kUndo == 0) return flash2_tuned_kernel<T, kD, kKeys, kMt>;
    else return flash2_tuned_undo_kernel<T, kD, kKeys, kMt, kUndo>;
  }();
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  kernel<<<grid, kTunedThreads, bytes, p.stream>>>(s, q, k, v, static_cast<T*>(p.o), p.lse);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void launch_tuned(const ForwardParams& p) {
  with_head_dim<64, 96, 128, 256>(p.shape.head_dim, [&](auto d) { launch_tuned_dim<T, d.value>(p); });
}

/// A step kernel: head_dim 64 and 128 only (the chapter doc's table).
template <unsigned kUndo>
void launch_tuned_undo(const ForwardParams& p) {
  with_head_dim<64, 128>(p.shape.head_dim, [&](auto d) { launch_tuned_dim<__nv_bfloat16, d.value, kUndo>(p); });
}

ForwardKernel tuned_kernel(const char* name, DType dtype, void (*launch)(const ForwardParams&)) {
  const char* summary =
      "variant 4 with 32 rows per warp (128 per block), Q via ldmatrix, split K/V waits, scale in the exponent";
  ForwardKernel k{name, 5, 5, "tuned", dtype, summary, launch};
  k.supports = [](const AttentionShape& s) { return mma_support(s, {64, 96, 128, 256}); };
  k.strided = true;  // flash2_tuned_strided_kernel: the rows' strides in the copies and O's stores
  return k;
}

template <unsigned kUndo>
ForwardKernel tuned_undo_kernel(const char* name, const char* variant, const char* summary) {
  ForwardKernel k{name, 5, 5, variant, DType::BF16, summary, launch_tuned_undo<kUndo>};
  k.supports = [](const AttentionShape& s) { return mma_support(s, {64, 128}); };
  return k;
}

}  // namespace

FA_REGISTER_FORWARD_KERNEL(tuned_kernel("ch05_tuned_fp16", DType::F16, launch_tuned<__half>));
FA_REGISTER_FORWARD_KERNEL(tuned_kernel("ch05_tuned_bf16", DType::BF16, launch_tuned<__nv_bfloat16>));
// `tuned` with one change undone each (make bench times them like any kernel).
FA_REGISTER_FORWARD_KERNEL(tuned_undo_kernel<undo::kRows>("ch05_tuned_undo_rows_bf16", "tuned_undo_rows",
                                                          "tuned with 16 rows per warp (64 per block)"));
FA_REGISTER_FORWARD_KERNEL(tuned_undo_kernel<undo::kKeys>("ch05_tuned_undo_keys_bf16", "tuned_undo_keys",
                                                          "tuned with 64-key tiles at d = 64"));
FA_REGISTER_FORWARD_KERNEL(tuned_undo_kernel<undo::kWaits>("ch05_tuned_undo_waits_bf16", "tuned_undo_waits",
                                                           "tuned with K and V copied together after P V, one wait"));
FA_REGISTER_FORWARD_KERNEL(tuned_undo_kernel<undo::kCopies>("ch05_tuned_undo_copies_bf16", "tuned_undo_copies",
                                                            "tuned with copy addresses computed per row"));
FA_REGISTER_FORWARD_KERNEL(tuned_undo_kernel<undo::kScale>("ch05_tuned_undo_scale_bf16", "tuned_undo_scale",
                                                           "tuned with the scale multiplied in before the max"));
FA_REGISTER_FORWARD_KERNEL(tuned_undo_kernel<undo::kOrder>("ch05_tuned_undo_order_bf16", "tuned_undo_order",
                                                           "tuned with the Q tiles in launch order"));
FA_REGISTER_FORWARD_KERNEL(tuned_undo_kernel<undo::kStores>("ch05_tuned_undo_stores_bf16", "tuned_undo_stores",
                                                            "tuned with O stored from the registers"));

}  // namespace fa::flash2
