// Chapter 09, variant 1 -- `ampere`: chapter 05's tuned kernel (tuned_tile.cuh) taking what
// real models need, for any GPU from sm_80 on. Each feature is a few lines between chapter
// 05's steps (features.h holds the rules, shared with algorithm.h):
//   * packed variable-length batches: block (tile, b * heads + h) works on sequence b, found
//     through cu_seqlens, as a batch of one; tiles past a short sequence's end return at once;
//   * sliding windows: the K/V loop runs over the tiles tile_keys() leaves, so a window of w
//     keys costs O(w) per Q tile, not O(seq_kv); tiles the window crosses are masked. The mask
//     is a template policy: WindowMask with a window, else CausalMask (mask.h, chapters 01-08's), so
//     a problem without a window pays no window arithmetic;
//   * softcap, ALiBi, the bias: after S = Q K^T, each score is scaled and changed in registers
//     (modified_score), and the softmax takes the scale as 1 (it is already in);
//   * the tiling, the copies, the softmax, P V and the output store are chapter 05's, unchanged.
// Run: build/bin/ch09_real_model_features --variant ampere --causal --window 256,0 --softcap 50
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "../05_flash_attention_v2/mma_variants.h"
#include "../05_flash_attention_v2/tuned_tile.cuh"
#include "algorithm.h"
#include "ampere.cuh"
#include "cuda_check.h"
#include "features.h"
#include "log2_units.h"
#include "registry.h"
#include "static_switch.h"

namespace fa::features {
namespace {

using namespace fa::ampere;
using flash2::kBlockRows;
using flash2::kTunedThreads;
using flash2::kWarpRows;

/// softcap, ALiBi and the bias on the warp's 32 x kKeys scores: s holds raw Q K^T and leaves
/// scaled and changed. s[mt][nb][e] is row warp_row0 + 16 mt + 8 (e / 2) + g, key j0 + 8 nb + 2t +
/// (e & 1). modified_score's rule (features.h), arranged for the GPU: one loop per feature, each
/// branch taken once per tile, and ALiBi's distance as a per-row float minus a per-element
/// constant (an int-to-float conversion per score would load the unit the exponentials use).
template <int kKeys>
__device__ inline void modify_scores(float (&s)[2][kKeys / 8][4], const AttentionShape& one, const ScoreChanges& c,
                                     int warp_row0, int j0, int g, int t) {
  //! [modify_scores]
  if (c.cap > 0.0f) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nb = 0; nb < kKeys / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nb][e] = c.cap * fast_tanh(s[mt][nb][e] * c.scale_per_cap);
  } else {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nb = 0; nb < kKeys / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nb][e] *= c.scale;
  }
  if (c.slope != 0.0f) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float base = float(warp_row0 + 16 * mt + 8 * h + g + one.causal_offset() - j0 - 2 * t);
#pragma unroll
        for (int nb = 0; nb < kKeys / 8; ++nb)
#pragma unroll
          for (int odd = 0; odd < 2; ++odd)
            s[mt][nb][2 * h + odd] = fmaf(-c.slope, fabsf(base - float(8 * nb + odd)), s[mt][nb][2 * h + odd]);
      }
  }
  if (c.bias) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nb = 0; nb < kKeys / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = warp_row0 + 16 * mt + 8 * (e / 2) + g, key = j0 + nb * 8 + 2 * t + (e & 1);
          if (row < one.seq_q && key < one.seq_kv) s[mt][nb][e] += c.bias[int64_t(row) * one.seq_kv + key];
        }
  }
  //! [modify_scores]
}

/// kKeys keys per K/V tile (chapter 05's choice); kModify: softcap, ALiBi or a bias is on; Mask:
/// WindowMask when a window is on, else CausalMask<causal>.
template <class T, int kD, int kKeys, bool kModify, class Mask>
__global__ void __launch_bounds__(kTunedThreads, 2)
    features_ampere_kernel(AttentionShape shape, AttentionFeatures features, AttentionExtras extras, const T* q,
                           const T* k, const T* v, T* o, float* lse) {
  constexpr int kLd = kD + 8, kKeyBlocks = kKeys / 8;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  T* q_s = reinterpret_cast<T*>(shared_bytes);  // [128][kLd]; O is staged here at the end
  T* k_s = q_s + kBlockRows * kLd;              // [kKeys][kLd]
  T* v_s = k_s + kKeys * kLd;                   // [kKeys][kLd]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;

  //! [ampere_sequence]
  const SequenceRows seq =
      sequence_rows(shape, features, extras, int(blockIdx.y) / shape.heads_q, int(blockIdx.y) % shape.heads_q);
  const AttentionShape& one = seq.shape;       // this sequence as a batch of one
  const Mask mask = sequence_mask<Mask>(seq);  // its causal rule, and its window if any
  const int i0 = (gridDim.x - 1 - blockIdx.x) * kBlockRows;
  if (i0 >= one.seq_q) return;  // the grid covers the longest sequence; this one is shorter
  const T* q_head = q + seq.q_row0 * kD;
  const T* k_head = k + seq.kv_row0 * kD;
  const T* v_head = v + seq.kv_row0 * kD;
  //! [ampere_sequence]
  const int n_q = one.seq_q, n_k = one.seq_kv;
  const int last_row = min(i0 + kBlockRows, n_q) - 1;
  //! [ampere_window]
  const KeySpan keys = tile_keys(mask, i0, last_row, kKeys);
  //! [ampere_window]
  const ScoreChanges changes = score_changes(shape, seq, extras);
  // With a score change the scores arrive scaled, so the softmax's scale is 1 (log2 e in log2 units).
  const float scale_log2 = kModify ? kLog2e : changes.scale * kLog2e;

  flash2::copy_rows_async<T, kD, kBlockRows>(q_s, q_head, i0, n_q);
  if (keys.begin < keys.end) flash2::copy_rows_async<T, kD, kKeys>(k_s, k_head, keys.begin, n_k);
  cp_async_commit();

  float out[2][kD / 8][4] = {};
  float m[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, l[4] = {};

  //! [ampere_loop]
  for (int j0 = keys.begin; j0 < keys.end; j0 += kKeys) {
    cp_async_wait<0>();
    __syncthreads();
    flash2::copy_rows_async<T, kD, kKeys>(v_s, v_head, j0, n_k);
    cp_async_commit();

    float s[2][kKeyBlocks][4] = {};
    flash2::tuned_scores<T, kD, kKeys, flash2::PaddedRows<kD>, flash2::PaddedRows<kD>>(s, q_s, k_s, warp, lane);
    if constexpr (kModify) modify_scores<kKeys>(s, one, changes, i0 + kWarpRows * warp, j0, g, t);
    if (!mask.tile_visible(i0, kBlockRows, j0, kKeys))
      flash2::tuned_mask<kKeys>(s, mask, i0 + kWarpRows * warp, j0, g, t);

    cp_async_wait<0>();
    __syncthreads();
    if (j0 + kKeys < keys.end) flash2::copy_rows_async<T, kD, kKeys>(k_s, k_head, j0 + kKeys, n_k);
    cp_async_commit();

    flash2::tuned_softmax<kD, kKeys>(s, out, m, l, scale_log2);
    flash2::tuned_pv<T, kD, kKeys, flash2::PaddedRows<kD>>(out, s, v_s, lane);
  }
  //! [ampere_loop]

  cp_async_wait<0>();
  __syncthreads();
  flash2::tuned_store_output<T, kD>(out, m, l, q_s, o + seq.q_row0 * kD, lse + seq.q_row0, i0, n_q, warp, lane);
}

template <class T, int kD, bool kModify, class Mask>
void launch_dim(const ForwardParams& p) {
  flash2::require_tuned_pv();                 // the P V step is chapter 05's
  constexpr int kKeys = kD == 64 ? 128 : 64;  // chapter 05's kTunedKeys
  const AttentionShape& s = p.shape;
  const int bytes = int((kBlockRows + 2 * kKeys) * (kD + 8) * sizeof(T));
  auto kernel = features_ampere_kernel<T, kD, kKeys, kModify, Mask>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  const AttentionFeatures& f = p.features;
  const int rows = f.varlen() ? p.extras.max_seqlen_q : s.seq_q;
  if (rows == 0) return;  // a packed batch of empty sequences: no output row exists
  dim3 grid(unsigned((rows + kBlockRows - 1) / kBlockRows), unsigned(f.sequence_count(s) * s.heads_q));
  kernel<<<grid, kTunedThreads, bytes, p.stream>>>(s, f, p.extras, static_cast<const T*>(p.q),
                                                   static_cast<const T*>(p.k), static_cast<const T*>(p.v),
                                                   static_cast<T*>(p.o), p.lse);
  CUDA_CHECK_LAUNCH();
}

/// The mask policy: the window's when there is one; without it chapter 05's causal rule, which
/// leaves the loop no window arithmetic to carry.
template <class T, int kD, bool kModify>
void launch_mask(const ForwardParams& p) {
  if (p.features.windowed()) return launch_dim<T, kD, kModify, WindowMask>(p);
  with_bool(p.shape.causal, [&](auto c) { launch_dim<T, kD, kModify, CausalMask<c.value>>(p); });
}

template <class T>
void launch_ampere(const ForwardParams& p) {
  require_window_tiles();  // the tile ranges are this chapter's exercise
  const bool modify = p.features.softcap > 0.0 || p.features.alibi || p.features.bias;
  with_head_dim<64, 128>(p.shape.head_dim,
                         [&](auto d) { with_bool(modify, [&](auto m) { launch_mask<T, d.value, m.value>(p); }); });
}

ForwardKernel ampere_kernel(const char* name, DType dtype, void (*launch)(const ForwardParams&)) {
  ForwardKernel k{name,     9,     1,
                  "ampere", dtype, "chapter 05's tuned kernel with packed batches, windows, softcap, ALiBi and a bias",
                  launch};
  k.supports = [](const AttentionShape& s) { return flash2::mma_support(s); };
  k.features = kAllFeatures;
  return k;
}

}  // namespace

FA_REGISTER_FORWARD_KERNEL(ampere_kernel("ch09_ampere_fp16", DType::F16, launch_ampere<__half>));
FA_REGISTER_FORWARD_KERNEL(ampere_kernel("ch09_ampere_bf16", DType::BF16, launch_ampere<__nv_bfloat16>));
FA_REGISTER_CPU_ALGORITHM([] {
  CpuAlgorithm a;
  a.name = "ch09_features_cpu";
  a.chapter = 9;
  a.number = 1;
  a.variant = "features";
  a.summary = "chapter 05's loop with packed batches, windows, softcap, ALiBi and a bias";
  a.features = kAllFeatures;
  a.run_extras = features_cpu;
  return a;
}());

}  // namespace fa::features
