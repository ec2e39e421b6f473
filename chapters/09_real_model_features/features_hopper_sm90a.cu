// Chapter 09, variant 2 -- `hopper`: chapter 06's ping-pong kernel (variant 4) taking what real
// models need, on Hopper. The producer warpgroup, the mbarrier ring, the wgmma steps and the
// ping-pong schedule are chapter 06's (flash3_tile.cuh); the features enter where they entered
// variant 1:
//   * packed batches: the block finds its sequence (sequence_rows) and its TMA copies start at
//     the sequence's first row of the head's plane; rows of the next sequence that a box reads
//     past the end are masked (keys) or not stored (queries);
//   * windows: the producer copies only the K/V tiles tile_keys() leaves, and the consumers count
//     their tiles from the first of them;
//   * softcap, ALiBi, the bias: in the consumers' softmax step, on the scores in registers,
//     before the mask.
// Like chapter 06's, it takes Q, K, V and O with any strides (flash-attn's [batch, seq, heads,
// head_dim], or [total, heads, head_dim] for a packed batch): the tensor maps and O's rows carry them.
// Run: build/bin/ch09_real_model_features --variant hopper --causal --window 1024,0
#include <cuda_bf16.h>

#include <cstdint>

#include "../06_flash_attention_v3/flash3_tile.cuh"
#include "ampere.cuh"
#include "bias_tiles.cuh"
#include "cuda_check.h"
#include "features.h"
#include "registry.h"
#include "static_switch.h"
#include "strides.h"
#include "tma.h"

namespace fa::features {
namespace {

using namespace fa::hopper;
using flash3::kBlockN;
using flash3::kBoxBytes;

constexpr int kConsumers = 2, kThreads = 128 * (1 + kConsumers), kBlockM = 64 * kConsumers, kStages = 2;
constexpr int kConsumerThreads = 128 * kConsumers;
template <int kD>
using Layout = flash3::Smem<kD, kBlockM, kStages, 1 + 4 * kStages>;
/// With a bias staged in shared memory: the two consumers' bias tiles after the barriers (on a
/// 1024-byte boundary, as TMA's 128-byte swizzle needs), then their full and empty barriers.
template <int kD>
constexpr int kBiasOffset = (Layout<kD>::kBars + 8 * (1 + 4 * kStages) + 1023) / 1024 * 1024;

/// softcap, ALiBi and the bias on this thread's scores of one K/V tile (chapter 06's fragment:
/// s[i] is row row0 + 8 ((i % 4) / 2), key j0 + 8 (i / 4) + 2t + (i & 1)). modified_score's rule
/// (features.h), arranged for the GPU: one loop per feature, each branch taken once per tile,
/// and ALiBi's distance as a per-row float minus a per-element constant (an int-to-float
/// conversion per score would load the same unit as the exponentials).
__device__ inline void modify_tile(float (&s)[kBlockN / 2], const AttentionShape& one, const ScoreChanges& c, int row0,
                                   int j0, int t) {
  //! [hopper_modify]
  if (c.cap > 0.0f) {
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) s[i] = c.cap * fast_tanh(s[i] * c.scale_per_cap);
  } else {
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) s[i] *= c.scale;
  }
  if (c.slope != 0.0f) {
    // |i + off - j| for row row0 + 8h and key j0 + 2t + (8 (i / 4) + (i & 1)).
    const float base[2] = {float(row0 + one.causal_offset() - j0 - 2 * t),
                           float(row0 + 8 + one.causal_offset() - j0 - 2 * t)};
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i)
      s[i] = fmaf(-c.slope, fabsf(base[(i % 4) / 2] - float(8 * (i / 4) + (i & 1))), s[i]);
  }
  if (c.bias) {
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) {
      const int row = row0 + 8 * ((i % 4) / 2), key = j0 + 8 * (i / 4) + 2 * t + (i & 1);
      if (row < one.seq_q && key < one.seq_kv) s[i] += c.bias[int64_t(row) * one.seq_kv + key];
    }
  }
  //! [hopper_modify]
}

/// The mask (causal, window, the sequence's ends) on this thread's scores of one K/V tile: the
/// window policy (WindowMask, features.h) through mask.h's run form. The keys a row sees are one
/// run, so each of the thread's two rows gets its run once, shifted to the thread's first key;
/// each score is then two compares against a constant offset.
__device__ inline void mask_tile(float (&s)[kBlockN / 2], const WindowMask& mask, int row0, int j0, int t) {
  mask_rows(s, mask, row0, j0 + 2 * t);
}

/// The bias through shared memory, by TMA (bias_tiles.cuh): a warp of the producer warpgroup (the
/// bias warp) copies each consumer's 64 rows x 128 keys of the next tile's bias while the
/// consumers work on this one, one tile a consumer (two do not fit next to the K/V stages), handed
/// over by its own full and empty barriers. Used when the bias and each of its rows start on a
/// 16-byte boundary (TMA's rule); otherwise each score's bias is read from global.
static_assert(kBiasTileKeys == kBlockN && kBiasBoxRows == 64, "a consumer's bias tile is its 64 rows of a K/V tile");

//! [hopper_bias_warp]
/// The bias warp's loop (one thread): tile j of each consumer into its buffer once the consumer
/// has released tile j - 1, and tile j + 2 into L2 meanwhile, so that the copy of j + 1 reads L2.
/// Keys from first_key, rows i0 + 64 c of query plane `plane` (the bias is [planes][seq_q][seq_kv];
/// boxes past seq_q or seq_kv read zeros).
__device__ inline void produce_bias(unsigned char* tiles, const CUtensorMap* tm_bias, uint64_t* bias_full,
                                    uint64_t* bias_empty, int n_tiles, int first_key, int i0, int plane) {
  const uint64_t policy = ampere::l2_evict_first_policy();
  if (n_tiles > 1)  // tile 1 into L2 before the loop, which asks for j + 2 from tile 0 on
    for (int c = 0; c < kConsumers; ++c) prefetch_bias_boxes(tm_bias, first_key + kBlockN, i0 + 64 * c, plane);
  for (int j = 0; j < n_tiles; ++j) {
    const int key0 = first_key + j * kBlockN;
    for (int c = 0; c < kConsumers; ++c) {
      if (j > 0) mbarrier_wait(&bias_empty[c], (j - 1) & 1);
      mbarrier_arrive_expect_tx(&bias_full[c], kBiasTileBytes);
      load_bias_tile(tiles + c * kBiasTileBytes, tm_bias, key0, i0 + 64 * c, plane, &bias_full[c], policy);
    }
    if (j + 2 < n_tiles)
      for (int c = 0; c < kConsumers; ++c) prefetch_bias_boxes(tm_bias, key0 + 2 * kBlockN, i0 + 64 * c, plane);
  }
}
//! [hopper_bias_warp]

/// Adds the staged bias tile (rows of this consumer from row 0 of the tile) to s.
__device__ inline void add_staged_bias(float (&s)[kBlockN / 2], float* tile, int local_row0, int t) {
#pragma unroll
  for (int i = 0; i < kBlockN / 2; i += 2) {
    const int row = local_row0 + 8 * ((i % 4) / 2), key = 8 * (i / 4) + 2 * t;
    const float2 b = *reinterpret_cast<const float2*>(bias_at(tile, row, key));
    s[i] += b.x;
    s[i + 1] += b.y;
  }
}

/// The operations chapter 06's pingpong_schedule runs, for tiles counted from the window's first.
template <int kD, bool kModify, bool kStageBias>
struct FeatureOps {
  using S = Layout<kD>;
  using R = Ring<kStages>;
  static constexpr int kKeys = kBlockN;
  unsigned char* smem;
  const unsigned char* q_rows;
  uint64_t *k_full, *v_full, *k_empty, *v_empty;
  AttentionShape one;  // the sequence as a batch of one
  WindowMask mask;     // its causal rule and window
  int i0, row0, t, first_key;
  float scale_log2;
  ScoreChanges changes;
  float* bias_tile;                  // this consumer's staged bias tile, or null (bias read from global)
  uint64_t *bias_full, *bias_empty;  // this consumer's hand-over of its tile with the bias warp
  int consumer, n_tiles;
  float out[kD / 2];
  float m[2], l[2];
  uint32_t p[kBlockN / 16][4];

  __device__ void wait_k(int j) { mbarrier_wait(&k_full[R::stage(j)], R::full_parity(j)); }
  __device__ void wait_v(int j) { mbarrier_wait(&v_full[R::stage(j)], R::full_parity(j)); }
  __device__ void release_k(int j) { mbarrier_arrive(&k_empty[R::stage(j)]); }
  __device__ void release_v(int j) { mbarrier_arrive(&v_empty[R::stage(j)]); }
  __device__ void scores(int j, float (&s)[kBlockN / 2]) {
    flash3::issue_scores<kD, kBlockM * 128>(s, q_rows, smem + S::kK + R::stage(j) * S::kTileBytes);
  }
  __device__ void pv(int j) { flash3::issue_pv<kD>(out, p, smem + S::kV + R::stage(j) * S::kTileBytes); }
  //! [hopper_softmax]
  __device__ void softmax(int j, float (&s)[kBlockN / 2], float (&rescale)[2]) {
    const int j0 = first_key + j * kBlockN;
    if constexpr (kStageBias) {
      stage_bias(j, s);
    } else if constexpr (kModify) {
      if (changes.bias) prefetch_bias(j0 + kBlockN);
      modify_tile(s, one, changes, row0, j0, t);
    }
    if (!mask.tile_visible(i0 + 64 * consumer, 64, j0, kBlockN)) mask_tile(s, mask, row0, j0, t);
    flash3::online_softmax(s, m, l, rescale, scale_log2);
  }
  //! [hopper_softmax]
  /// Tile j's staged bias added once its copy has landed, then the buffer handed back to the bias
  /// warp for tile j + 1.
  __device__ void stage_bias(int j, float (&s)[kBlockN / 2]) {
    ScoreChanges without_bias = changes;
    without_bias.bias = nullptr;
    modify_tile(s, one, without_bias, row0, first_key + j * kBlockN, t);
    mbarrier_wait(bias_full, j & 1);
    add_staged_bias(s, bias_tile, row0 - i0 - 64 * consumer, t);
    mbarrier_arrive(bias_empty);
  }
  /// The bias of the next tile into L2 while this one is worked on: each of the quad's threads
  /// asks for one 128-byte line of each of its two rows (a tile row is 128 floats, 4 lines).
  __device__ void prefetch_bias(int j0) {
    if (j0 >= one.seq_kv) return;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + 8 * h, key = min(j0 + 32 * t, one.seq_kv - 1);
      if (row < one.seq_q)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(changes.bias + int64_t(row) * one.seq_kv + key));
    }
  }
  __device__ void rescale_out(const float (&rescale)[2]) { flash3::rescale_output<kD>(out, rescale); }
  __device__ void pack(const float (&s)[kBlockN / 2]) { flash3::pack_p(s, p); }
  __device__ void fence_out() { fence_operands(out); }
};

/// kModify: softcap, ALiBi or a bias is on; kStageBias: the bias goes through shared memory.
template <int kD, bool kModify, bool kStageBias>
__global__ void __launch_bounds__(kThreads, 1)
    features_hopper_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                           const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_bias,
                           AttentionShape shape, AttentionFeatures features, AttentionExtras extras,
                           StridedRows<__nv_bfloat16> o, float* lse) {
  using S = Layout<kD>;
  //! [hopper_sequence]
  const SequenceRows seq =
      sequence_rows(shape, features, extras, int(blockIdx.y) / shape.heads_q, int(blockIdx.y) % shape.heads_q);
  const AttentionShape& one = seq.shape;
  const int i0 = (gridDim.x - 1 - blockIdx.x) * kBlockM;
  if (i0 >= one.seq_q) return;  // the whole block leaves before any barrier exists
  const KeySpan keys = tile_keys(seq.mask(), i0, min(i0 + kBlockM, one.seq_q) - 1, kBlockN);
  const int n_tiles = keys.end > keys.begin ? (keys.end - keys.begin + kBlockN - 1) / kBlockN : 0;
  //! [hopper_sequence]

  extern __shared__ unsigned char shared_raw[];
  unsigned char* smem = aligned_smem(shared_raw);
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + S::kBars);
  uint64_t* k_full = q_full + 1;
  uint64_t* v_full = k_full + kStages;
  uint64_t* k_empty = v_full + kStages;
  uint64_t* v_empty = k_empty + kStages;
  const int tid = threadIdx.x, wg = tid / 128;
  uint64_t* bias_full = reinterpret_cast<uint64_t*>(smem + kBiasOffset<kD> + kConsumers * kBiasTileBytes);
  uint64_t* bias_empty = bias_full + kConsumers;
  if (kStageBias && tid == 0)
    for (int c = 0; c < kConsumers; ++c) {
      mbarrier_init(&bias_full[c], 1);
      mbarrier_init(&bias_empty[c], 128);
    }
  flash3::init_ring(q_full, k_full, v_full, kStages, k_empty, v_empty, kConsumerThreads);  // fences and syncs them

  if (wg == 0) {
    setmaxnreg_dec<24>();
    if (tid == 0) {
      //! [hopper_producer]
      // Chapter 06's producer; the boxes start at the sequence's first row of its plane, and
      // K/V tile j is the window's j-th.
      mbarrier_arrive_expect_tx(q_full, S::kQBytes);
      for (int b = 0; b < S::kBoxes; ++b)
        tma_load_head(smem + S::kQ + b * kBlockM * 128, &tm_q, 64 * b, seq.q_start + i0, seq.q_plane, shape.heads_q,
                      q_full);
      const int first_row = seq.kv_start + keys.begin;
      flash3::produce_kv<kStages>(
          n_tiles, k_empty, v_empty,
          [&](int j, int stage) {
            mbarrier_arrive_expect_tx(&k_full[stage], S::kTileBytes);
            for (int b = 0; b < S::kBoxes; ++b)
              tma_load_head(smem + S::kK + stage * S::kTileBytes + b * kBoxBytes, &tm_k, 64 * b,
                            first_row + j * kBlockN, seq.kv_plane, shape.heads_kv, &k_full[stage]);
          },
          [&](int j, int stage) {
            mbarrier_arrive_expect_tx(&v_full[stage], S::kTileBytes);
            for (int b = 0; b < S::kBoxes; ++b)
              tma_load_head(smem + S::kV + stage * S::kTileBytes + b * kBoxBytes, &tm_v, 64 * b,
                            first_row + j * kBlockN, seq.kv_plane, shape.heads_kv, &v_full[stage]);
          });
      //! [hopper_producer]
    }
    if (kStageBias && tid == 32)
      produce_bias(smem + kBiasOffset<kD>, &tm_bias, bias_full, bias_empty, n_tiles, keys.begin, seq.q_start + i0,
                   seq.q_plane);
    return;
  }

  setmaxnreg_inc<240>();
  const int consumer = wg - 1, warp = (tid % 128) / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int row0 = i0 + 64 * consumer + 16 * warp + g;
  const ScoreChanges changes = score_changes(shape, seq, extras);
  float* bias_tile =
      kStageBias ? reinterpret_cast<float*>(smem + kBiasOffset<kD> + consumer * kBiasTileBytes) : nullptr;
  FeatureOps<kD, kModify, kStageBias> ops{
      smem,
      smem + S::kQ + consumer * 64 * 128,
      k_full,
      v_full,
      k_empty,
      v_empty,
      one,
      seq.mask(),
      i0,
      row0,
      t,
      keys.begin,
      kModify ? kLog2e : changes.scale * kLog2e,  // scores arrive scaled when changed
      changes,
      bias_tile,
      bias_full + consumer,
      bias_empty + consumer,
      consumer,
      n_tiles,
      {},
      {-INFINITY, -INFINITY},
      {0.0f, 0.0f},
      {}};
  mbarrier_wait(q_full, 0);
  flash3::pingpong_schedule(ops, n_tiles, consumer);

  float inv[2], lse_log2[2];
  flash3::sum_over_quad(ops.l);
  flash3::row_totals(ops.m, ops.l, inv, lse_log2);
  store_rows_bf16(ops.out, o.head_start(seq.q_plane) + int64_t(seq.q_start) * o.strides.row, row0, one.seq_q, t, inv,
                  o.strides.row);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + 8 * h;
    if (t == 0 && row < one.seq_q) lse[seq.q_row0 + row] = lse_log2[h] * kLn2;
  }
}

template <int kD, bool kModify, bool kStageBias>
void launch_dim(const ForwardParams& p) {
  const AttentionShape& s = p.shape;
  // A packed batch is the dense layout with a batch of one: planes are heads, rows the totals.
  // The tensors may have any strides (p.strides): the tensor maps and O's rows carry them.
  const ForwardStrides st = p.strides ? *p.strides : ForwardStrides::packed(s);
  const CUtensorMap tm_q = make_tensor_map_heads(p.q, kD, s.seq_q, s.heads_q, s.batch, st.q, kBlockM);
  const CUtensorMap tm_k = make_tensor_map_heads(p.k, kD, s.seq_kv, s.heads_kv, s.batch, st.k, kBlockN);
  const CUtensorMap tm_v = make_tensor_map_heads(p.v, kD, s.seq_kv, s.heads_kv, s.batch, st.v, kBlockN);
  const StridedRows<__nv_bfloat16> o{static_cast<__nv_bfloat16*>(p.o), st.o, s.heads_q};
  // The bias as [planes][seq_q][seq_kv] floats, in boxes of 64 rows x 32 keys; unused without it.
  const CUtensorMap tm_bias =
      kStageBias ? make_tensor_map_swizzled(p.extras.bias, 4, s.seq_kv, s.seq_q, s.batch * s.heads_q, 64, 128)
                 : CUtensorMap{};
  auto kernel = features_hopper_kernel<kD, kModify, kStageBias>;
  constexpr int kStagedBytes = kBiasOffset<kD> + kConsumers * kBiasTileBytes + 2 * kConsumers * 8 + 1024;
  static_assert(!kStageBias || kStagedBytes <= 227 * 1024, "a block may have 227 KiB of shared memory");
  const int bytes = kStageBias ? kStagedBytes : Layout<kD>::kBytes;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  const AttentionFeatures& f = p.features;
  const int rows = f.varlen() ? p.extras.max_seqlen_q : s.seq_q;
  if (rows == 0) return;
  const dim3 grid(unsigned((rows + kBlockM - 1) / kBlockM), unsigned(f.sequence_count(s) * s.heads_q));
  kernel<<<grid, kThreads, bytes, p.stream>>>(tm_q, tm_k, tm_v, tm_bias, s, f, p.extras, o, p.lse);
  CUDA_CHECK_LAUNCH();
}

void launch_hopper(const ForwardParams& p) {
  require_window_tiles();        // the tile ranges are this chapter's exercise
  flash3::require_produce_kv();  // the producer's loop is chapter 06's
  const AttentionShape& s = p.shape;
  // The bias is staged in shared memory by TMA when it and each of its rows start on a 16-byte
  // boundary (the tensor map's rule); otherwise each score's bias is read from global.
  const AttentionFeatures& f = p.features;
  const bool stage = f.bias && s.seq_kv % 4 == 0 && reinterpret_cast<uintptr_t>(p.extras.bias) % 16 == 0;
  const bool modify = f.softcap > 0.0 || f.alibi || f.bias;
  with_head_dim<64, 128>(s.head_dim, [&](auto d) {
    if (stage) {
      launch_dim<d.value, true, true>(p);
    } else {
      with_bool(modify, [&](auto m) { launch_dim<d.value, m.value, false>(p); });
    }
  });
}

ForwardKernel hopper_kernel() {
  ForwardKernel k{"ch09_hopper_bf16",
                  9,
                  2,
                  "hopper",
                  DType::BF16,
                  "chapter 06's ping-pong kernel with packed batches, windows, softcap, ALiBi and a bias",
                  launch_hopper};
  k.supports = [](const AttentionShape& s) { return hopper_support(s, "chapter 09's hopper variant"); };
  k.features = kAllFeatures;
  k.strided = true;  // strides in the tensor maps and O's rows
  return k;
}

}  // namespace

FA_REGISTER_FORWARD_KERNEL(hopper_kernel());

}  // namespace fa::features
