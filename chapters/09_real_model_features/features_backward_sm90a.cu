// Chapter 09, backward -- `hopper`: chapter 07's fused Hopper backward (variants 5 and 6: one
// block per 128 keys, a producer warp and two consumer warpgroups, five wgmma products per Q tile,
// dS^T through shared memory for dQ; dQ by variant 6's bulk reductions, or by variant 5's fp32
// atomics: a packed batch, ALiBi or the bias at head_dim 64, a staged bias) with the features,
// bf16, sm_90a, head_dim 64 and 128. The schedule inside a tile is chapter 07's (fused_tile.cuh,
// wgmma_backward.cuh); the features enter where they entered the Ampere backward
// (features_backward.cu):
//   * packed batches: block (key tile, b * heads_kv + h) works on sequence b, as a batch of one;
//     its TMA copies start at the sequence's first row of the head's plane, and the rows and keys
//     of the next sequence that a box reads past the end are masked;
//   * windows: the loop visits only the Q tiles whose rows see a key of the block
//     (rows_for_keys), and a tile wholly inside every row's run skips the mask
//     (WindowMask::tile_visible; the mask itself is WindowMask::rows, the rows that see a key);
//   * softcap, ALiBi, the bias: the recomputed scores get the forward's changes before the mask,
//     and dS is multiplied by the softcap's derivative 1 - tanh^2; at head_dim 128, without the
//     softcap, the producer stages a bias TMA can read (bias_tiles.cuh); otherwise the consumers
//     read it from memory.
// It takes Q, K, V, dO and the gradients with any strides (the tensor maps, dK/dV's rows and the
// rounding of dQ carry them).
// Run: build/bin/fa_gpu_tests --gtest_filter='*ch09_hopper_backward*'
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "../07_backward/delta.cuh"
#include "../07_backward/fused_tile.cuh"
#include "../07_backward/wgmma_backward.cuh"
#include "bias_tiles.cuh"
#include "cuda_check.h"
#include "features.h"
#include "hopper.cuh"
#include "registry.h"
#include "static_switch.h"
#include "strides.h"
#include "tma.h"

namespace fa::features {
namespace {

using namespace fa::backward::sm90;

/// Named barriers (0 is __syncthreads'): 1, both consumers' halves of the Q tile's dS^T are
/// stored; 2 and 3, consumer 0's and 1's dQ part is in shared memory (the bulk way only).
constexpr int kDsStored = 1, kDqStored = 2;
/// The most query heads per K/V head: their ALiBi slopes sit in shared memory, worked out once
/// per block (in double precision, as the forward's, a subroutine call best kept out of the loop).
constexpr int kMaxGroup = 256;
/// Shared memory after K, V and the ring: chapter 07's two dS^T buffers (and with kBulk the
/// consumers' dQ parts), with a staged bias its tile, then the slopes, then the bias tile's full
/// and empty barriers.
template <int kD, DqPath kPath, bool kStageBias>
constexpr int kExtraBytes = kExtraOf<kD, kPath> + (kStageBias ? kBiasTileBytes + 16 : 0) + kMaxGroup * 4;

/// Where feature_scores reads the bias: from global memory (a row-major [seq_q][seq_kv] head), or
/// from the tile of rows i0 .. i0 + 63 and keys j0 .. j0 + 127 the producer staged by TMA.
struct GlobalBias {
  const float* rows;
  int seq_kv;
  __device__ float operator()(int row, int key) const { return rows[int64_t(row) * seq_kv + key]; }
};
struct StagedBias {
  float* tile;
  int i0, j0;
  __device__ float operator()(int row, int key) const { return *bias_at(tile, row - i0, key - j0); }
};

/// The rows that see each of a thread's two keys, key_a and key_a + 8 (probabilities' runs).
struct WindowKeyRows {
  WindowMask mask;
  int key_a;
  __device__ KeyRun operator()(int h) const { return mask.rows(key_a + 8 * h); }
};

/// A block's items in order: query head `head` of the K/V head's group and Q tile `i0` of the
/// sequence, the group's heads one after another, each over the Q tiles whose rows see a key of
/// the block (first_row .. end_row).
struct ItemWalk {
  int first_row, end_row;
  __device__ void next(int& head, int& i0, int rows) const {
    i0 += rows;
    if (i0 == end_row) {
      i0 = first_row;
      ++head;
    }
  }
};

//! [hopper_backward_scores]
/// How a tile's scores change: not at all (chapter 07's steps), shifted by ALiBi or the bias
/// (dS keeps its form: the exponentials still run under dP^T), or capped (the softcap's slope
/// multiplies dS: both products are waited for, then one pass forms P and dS).
enum class Changes { kNone, kShift, kCap };

/// P^T (and, with kCap, dS^T) of one tile whose scores change: element 4 n + j of the accumulators
/// (j = 0 .. 3) is key key_a + 8 (j / 2), row row0 + 8 n + (j & 1), row0 = i0 + 2 t. Each score is
/// changed as modified_score says (features.h), P = exp(x - LSE) where the row sees the key (all
/// of them unless `masked`), else 0; with kCap dS = P (dP - D) times the softcap's slope at x.
/// `bias` reads the bias (GlobalBias or StagedBias) when c.bias is set.
template <Changes kChanges, int kN, class Bias>
__device__ inline void feature_scores(float (&s)[kN], float (&dp)[kN], const ColumnStats& stats, const ScoreChanges& c,
                                      const Bias& bias, const AttentionShape& one, bool masked,
                                      const WindowKeyRows& runs, int row0, int key_a) {
  KeyRun live[2] = {{-1, 1 << 30}, {-1, 1 << 30}};  // every row, unless the tile is masked
  if (masked) {
    live[0] = runs(0);
    live[1] = runs(1);
  }
#pragma unroll
  for (int i = 0; i < kN; i += 2) {
    const float2 lse = stats.lse_pair(i), delta = kChanges == Changes::kCap ? stats.delta_pair(i) : float2{};
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int k = i + e, h = (k % 4) / 2, key = key_a + 8 * h, row = row0 + 8 * (k / 4) + e;
      const bool sees = row >= live[h].begin && row < live[h].end;
      float x = s[k] * c.scale, slope = 1.0f;
      // c.cap > 0 holds whenever kCap does; tested all the same, it keeps ptxas's schedule of this
      // loop at the 20 spilled bytes of the budget (92 without the test).
      if (kChanges == Changes::kCap && c.cap > 0.0f) {
        const float th = fast_tanh(s[k] * c.scale_per_cap);
        x = c.cap * th;
        slope = 1.0f - th * th;  // d(cap tanh(x / cap)) / dx
      }
      if (c.slope != 0.0f) x -= c.slope * fabsf(float(row + one.causal_offset() - key));
      if (c.bias && sees) x += bias(row, key);
      const float p = sees ? fast_exp2(fmaf(x, kLog2e, -(e ? lse.y : lse.x))) : 0.0f;
      s[k] = p;
      if constexpr (kChanges == Changes::kCap) dp[k] = p * (dp[k] - (e ? delta.y : delta.x)) * slope;
    }
  }
}
//! [hopper_backward_scores]

/// Rows i0 .. i0 + kRows - 1 and keys j0 .. j0 + 127 of one head's bias into L2, asked for by
/// the producer warp when it loads the tile's Q and dO: the consumers' reads of the bias then
/// wait for L2, not for memory. A row of the tile is 512 bytes, 4 lines of 128 when it starts on
/// a line (else it touches a fifth, not asked for); each lane asks for kRows / 8 lines.
template <int kRows>
__device__ inline void prefetch_bias_tile(const float* bias, const AttentionShape& one, int i0, int j0, int lane) {
#pragma unroll
  for (int e = lane; e < 4 * kRows; e += 32) {
    const int row = i0 + e / 4, key = j0 + 32 * (e % 4);
    if (row < one.seq_q && key < one.seq_kv)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(bias + int64_t(row) * one.seq_kv + key));
  }
}

/// One 128-key block of one sequence's K/V head. dQ goes by chapter 07's atomics into the
/// row-major fp32 dQ, or (kBulk, a batch that is not packed) by its bulk reductions part by part.
/// With kStageBias (head_dim 128, a bias TMA can read) the producer copies each item's bias tile
/// by TMA into shared memory (one buffer, handed over by bias_full and bias_empty); otherwise the
/// consumers read the bias from global memory, asked into L2 by the producer first.
template <int kD, Changes kChanges, DqPath kPath, bool kStageBias>
__global__ void __launch_bounds__(kThreads, 1)
    features_backward_hopper_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                                    const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
                                    const __grid_constant__ CUtensorMap tm_bias, AttentionShape shape,
                                    AttentionFeatures features, AttentionExtras extras, const float* lse,
                                    const float* delta, float* dq32, StridedRows<__nv_bfloat16> dk,
                                    StridedRows<__nv_bfloat16> dv) {
  constexpr int kRows = kRowsOf<kD>;
  using L = KvLayout<kD, kRows, kExtraBytes<kD, kPath, kStageBias>>;
  static_assert(!kStageBias || (kRows == kBiasBoxRows && kKvKeys == kBiasTileKeys), "one bias tile per item");
  using Split = DqSplit<kD>;
  //! [hopper_backward_sequence]
  // The sequence, as the first query head of this K/V head sees it (the group shares its rows),
  // and the Q tiles whose rows see a key of this block.
  const int group = shape.group_size(), b = int(blockIdx.y) / shape.heads_kv, kvh = int(blockIdx.y) % shape.heads_kv;
  const SequenceRows kv_seq = sequence_rows(shape, features, extras, b, kvh * group);
  const AttentionShape& one = kv_seq.shape;
  const WindowMask mask = kv_seq.mask();
  const int j0 = blockIdx.x * kKvKeys;
  if (j0 >= one.seq_kv) return;  // the grid covers the longest sequence; no barrier exists yet
  const KeySpan rows = rows_for_keys(mask, j0, min(j0 + kKvKeys, one.seq_kv));
  const int first_row = rows.begin / kRows * kRows;
  const int row_tiles = rows.end > rows.begin ? (rows.end - 1) / kRows + 1 - first_row / kRows : 0;
  const int n_items = group * row_tiles;
  const ItemWalk walk{first_row, first_row + row_tiles * kRows};
  //! [hopper_backward_sequence]

  extern __shared__ unsigned char shared_raw[];
  unsigned char* smem = aligned_smem(shared_raw);
  const auto [kv_full, full, empty, lse_s, delta_s] = dkdv_shared<L>(smem);
  // The warpgroup read through a shuffle from lane 0 (warp-uniform to the compiler), as in
  // chapter 07's fused kernel: the descriptors that derive from it stay in uniform registers.
  const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid / 128, 0), wg_tid = tid % 128;
  unsigned char* bias_tile = smem + L::kExtra + kExtraOf<kD, kPath>;
  float* slopes = reinterpret_cast<float*>(bias_tile + (kStageBias ? kBiasTileBytes : 0));
  uint64_t* bias_full = reinterpret_cast<uint64_t*>(slopes + kMaxGroup);
  uint64_t* bias_empty = bias_full + 1;
  if (features.alibi)
    for (int h = tid; h < group; h += kThreads) slopes[h] = extras.alibi_slope(shape, b, kvh * group + h);
  if (kStageBias && tid == 0) {
    mbarrier_init(bias_full, 1);
    mbarrier_init(bias_empty, kConsumerThreads);
  }
  init_stages(kv_full, full, empty, 32, kConsumerThreads);  // its fence and __syncthreads publish all

  if (wg == 0) {
    setmaxnreg_dec<40>();
    if (tid >= 32) return;
    //! [hopper_backward_producer]
    // Chapter 07's producer warp; the boxes start at the sequence's first row of their plane.
    const int lane = tid;
    if (lane == 0) {
      mbarrier_arrive_expect_tx(kv_full, 2 * tile_bytes<kD>(kKvKeys));
      for (int x = 0; x < kBoxes<kD>; ++x) {
        tma_load_head(smem + L::kK + x * kKvKeys * kBoxRowBytes, &tm_k, 64 * x, kv_seq.kv_start + j0, kv_seq.kv_plane,
                      shape.heads_kv, kv_full);
        tma_load_head(smem + L::kV + x * kKvKeys * kBoxRowBytes, &tm_v, 64 * x, kv_seq.kv_start + j0, kv_seq.kv_plane,
                      shape.heads_kv, kv_full);
      }
    }
    for (int it = 0, head = kvh * group, i0 = first_row; it < n_items; ++it, walk.next(head, i0, kRows)) {
      const int st = StageRing::stage(it);
      if (it >= kStages) mbarrier_wait(&empty[st], StageRing::empty_parity(it));
      const SequenceRows seq = sequence_rows(shape, features, extras, b, head);
      for (int r = lane; r < kRows; r += 32) {
        const int row = i0 + r;
        const bool in = row < one.seq_q;  // rows past the end: masked, LSE = D = 0
        lse_s[st * kRows + r] = in ? lse[seq.q_row0 + row] * kLog2e : 0.0f;
        delta_s[st * kRows + r] = in ? delta[seq.q_row0 + row] : 0.0f;
      }
      if (lane == 0) {
        mbarrier_arrive_expect_tx(&full[st], 2 * tile_bytes<kD>(kRows));
        for (int x = 0; x < kBoxes<kD>; ++x) {
          const int at = st * tile_bytes<kD>(kRows) + x * kRows * kBoxRowBytes;
          tma_load_head(smem + L::kQ + at, &tm_q, 64 * x, seq.q_start + i0, seq.q_plane, shape.heads_q, &full[st]);
          tma_load_head(smem + L::kDo + at, &tm_do, 64 * x, seq.q_start + i0, seq.q_plane, shape.heads_q, &full[st]);
        }
        if constexpr (kStageBias) {  // the item's bias tile, once the consumers have read the last one
          if (it > 0) mbarrier_wait(bias_empty, (it - 1) & 1);
          mbarrier_arrive_expect_tx(bias_full, kBiasTileBytes);
          load_bias_tile(bias_tile, &tm_bias, j0, seq.q_start + i0, seq.q_plane, bias_full,
                         ampere::l2_evict_first_policy());
        }
      } else {
        mbarrier_arrive(&full[st]);
      }
      if (!kStageBias && kChanges != Changes::kNone && features.bias)
        prefetch_bias_tile<kRows>(extras.bias + seq.bias0, one, i0, j0, lane);
    }
    //! [hopper_backward_producer]
    return;
  }

  setmaxnreg_inc<232>();
  const int c = wg - 1, warp = wg_tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int jc = j0 + 64 * c;            // this consumer's first key
  const int key_a = jc + 16 * warp + g;  // this thread's keys: key_a, key_a + 8
  const WindowKeyRows runs{mask, key_a};
  float dk_acc[kD / 2] = {}, dv_acc[kD / 2] = {};
  // Descriptors' low words, as in chapter 07's fused kernel.
  const uint32_t lo16 = desc_lo(smem, 16), lo_q = desc_lo(smem, tile_bytes<64>(kRows)),
                 lo_keys = desc_lo(smem, kKeyBoxBytes);
  const uint32_t k_lo = lo16 + (L::kK + 64 * c * kBoxRowBytes) / 16, v_lo = lo16 + (L::kV + 64 * c * kBoxRowBytes) / 16;
  // score_changes' scale and softcap, the same for every head; per item the head's slope and
  // bias join them.
  const float scale = float(shape.softmax_scale()), cap = float(features.softcap);
  const ScoreChanges block_changes{scale, cap, cap > 0.0f ? scale / cap : 0.0f, 0.0f, nullptr};
  mbarrier_wait(kv_full, 0);

  for (int it = 0, head = kvh * group, i0 = first_row; it < n_items; ++it, walk.next(head, i0, kRows)) {
    const int st = StageRing::stage(it);
    const SequenceRows seq = sequence_rows(shape, features, extras, b, head);
    ScoreChanges changes = block_changes;  // score_changes(shape, seq, extras), the slope from shared memory
    changes.slope = features.alibi ? slopes[head - kvh * group] : 0.0f;
    changes.bias = features.bias ? extras.bias + seq.bias0 : nullptr;
    mbarrier_wait(&full[st], StageRing::full_parity(it));
    const int q_at = L::kQ + st * tile_bytes<kD>(kRows), do_at = L::kDo + st * tile_bytes<kD>(kRows);
    const int ds_at = L::kExtra + (it % 2) * kDsBytes<kD>;
    float st_acc[kRows / 2], dpt[kRows / 2];
    wgmma_fence();
    issue_abt<kD, kRows>(st_acc, k_lo, tile_bytes<64>(kKvKeys), lo16 + q_at / 16, tile_bytes<64>(kRows));
    wgmma_commit();
    issue_abt<kD, kRows>(dpt, v_lo, tile_bytes<64>(kKvKeys), lo16 + do_at / 16, tile_bytes<64>(kRows));
    wgmma_commit();
    // Masked unless every row of the tile sees every key of this consumer, all inside the
    // sequence: past its ends a box holds the next sequence's rows (or TMA's zeros).
    const bool masked = !mask.tile_visible(i0, kRows, jc, 64);
    const ColumnStats stats{lse_s + st * kRows, delta_s + st * kRows, t};
    if constexpr (kChanges == Changes::kCap) {
      // The softcap's slope is needed where dS is formed: both products first, then one pass.
      wgmma_wait<0>();
      fence_operands(st_acc);
      fence_operands(dpt);
      feature_scores<kChanges>(st_acc, dpt, stats, changes, GlobalBias{changes.bias, one.seq_kv}, one, masked, runs,
                               i0 + 2 * t, key_a);
    } else {
      wgmma_wait<1>();  // the exponentials under dP^T, as in chapter 07
      fence_operands(st_acc);
      if constexpr (kStageBias) {
        mbarrier_wait(bias_full, it & 1);
        const StagedBias staged{reinterpret_cast<float*>(bias_tile), i0, j0};
        feature_scores<kChanges>(st_acc, dpt, stats, changes, staged, one, masked, runs, i0 + 2 * t, key_a);
        mbarrier_arrive(bias_empty);  // the buffer is free for the next item's tile
      } else if constexpr (kChanges == Changes::kShift) {
        feature_scores<kChanges>(st_acc, dpt, stats, changes, GlobalBias{changes.bias, one.seq_kv}, one, masked, runs,
                                 i0 + 2 * t, key_a);
      } else probabilities(st_acc, stats, changes.scale * kLog2e, masked, runs, i0 + 2 * t);
      wgmma_wait<0>();
      fence_operands(dpt);
      score_gradients(dpt, st_acc, stats);
    }
    uint32_t a_p[kRows / 16][4], a_ds[kRows / 16][4];
    pack_a_bf16(st_acc, a_p);
    pack_a_bf16(dpt, a_ds);
    store_ds_t<kRows>(smem + ds_at, a_ds, 64 * c + 16 * warp, lane);
    fence_proxy_async_shared();
    wgmma_fence();
    issue_a_regs_b<kD, kRows>(dv_acc, a_p, lo_q + do_at / 16);  // dV_c += P^T dO
    wgmma_commit();
    // With kBulk the thread that hands the dQ part over waits, while dV runs, until the last bulk
    // reduction has read it, as in chapter 07's variant 6.
    if (kPath == DqPath::kBulk && wg_tid == 0) bulk_wait_read<0>();
    named_barrier_sync<kConsumerThreads>(kDsStored);
    float dq_acc[Split::kCols / 2];
    wgmma_fence();
    issue_dq<kD>(dq_acc, lo_keys + ds_at / 16, lo_keys + L::kK / 16, c);
    wgmma_commit();
    issue_a_regs_b<kD, kRows>(dk_acc, a_ds, lo_q + q_at / 16);  // dK_c += dS^T Q
    wgmma_commit();
    wgmma_wait<1>();  // dV and dQ done
    fence_operands(dq_acc);
    if constexpr (kPath == DqPath::kAtomics) {
      // dQ32 += scale * dQ_i for this thread's rows of the sequence (two floats per atomic), while
      // dK is on the tensor cores.
      const int row0 = i0 + (Split::kByRows ? 64 * c : 0), col0 = Split::kByRows ? 0 : c * Split::kCols;
      float* dq_rows = dq32 + seq.q_row0 * kD;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row0 + 16 * warp + g + 8 * h;
        if (row >= one.seq_q) continue;
#pragma unroll
        for (int n = 0; n < Split::kCols / 8; ++n)
          atomicAdd(reinterpret_cast<float2*>(dq_rows + int64_t(row) * kD + col0 + 8 * n + 2 * t),
                    make_float2(dq_acc[4 * n + 2 * h] * changes.scale, dq_acc[4 * n + 2 * h + 1] * changes.scale));
      }
    } else {
      // dQ_i into this consumer's part, then one bulk reduction into part (plane, Q tile, c):
      // chapter 07's variant 6; the rounding kernel applies the scale.
      float* part_s = reinterpret_cast<float*>(smem + L::kExtra + 2 * kDsBytes<kD> + c * kDqPartBytes);
      add_dq_part<kD, kDqStored>(dq_acc, part_s, dq32, seq.q_plane, (one.seq_q + kRows - 1) / kRows, i0 / kRows, c,
                                 wg_tid);
    }
    wgmma_wait<0>();  // dK done: the stage's Q and dO are free
    fence_operands(dv_acc);
    fence_operands(dk_acc);
    mbarrier_arrive(&empty[st]);
  }

  if (kPath == DqPath::kBulk && wg_tid == 0) bulk_wait<0>();  // the shared memory stays until it is read
  // dK (times the scale) and dV of this thread's keys of the sequence; keys no row sees get 0.
  const float dk_scale[2] = {block_changes.scale, block_changes.scale}, dv_scale[2] = {1.0f, 1.0f};
  store_rows_bf16<kD / 2, kD>(dk_acc, dk.head_start(kv_seq.kv_plane) + int64_t(kv_seq.kv_start) * dk.strides.row, key_a,
                              one.seq_kv, t, dk_scale, dk.strides.row);
  store_rows_bf16<kD / 2, kD>(dv_acc, dv.head_start(kv_seq.kv_plane) + int64_t(kv_seq.kv_start) * dv.strides.row, key_a,
                              one.seq_kv, t, dv_scale, dv.strides.row);
}

template <int kD, Changes kChanges, DqPath kPath, bool kStageBias = false>
void launch_dim(const BackwardParams& p) {
  const AttentionShape& s = p.shape;
  const AttentionFeatures& f = p.features;
  float* delta = static_cast<float*>(p.workspace);
  float* dq32 = delta + dq32_offset(s);
  const std::size_t dq_floats = dq32_floats(s, kPath);
  CUDA_CHECK(cudaMemsetAsync(dq32, 0, dq_floats * sizeof(float), p.stream));
  backward::launch_delta<__nv_bfloat16>(p, delta);
  const int keys = f.varlen() ? p.extras.max_seqlen_k : s.seq_kv;
  if (int64_t(f.sequence_count(s)) * s.heads_kv > 65535)  // the grid's y dimension
    throw std::invalid_argument("sequences * heads_kv must be at most 65535, got " +
                                std::to_string(int64_t(f.sequence_count(s)) * s.heads_kv));
  if (keys > 0) {
    // A packed batch is the dense layout with a batch of one: planes are heads, rows the totals.
    constexpr int kRows = kRowsOf<kD>;
    const BackwardStrides st = p.strides ? *p.strides : BackwardStrides::packed(s);
    const CUtensorMap tm_q = make_tensor_map_heads(p.q, kD, s.seq_q, s.heads_q, s.batch, st.q, kRows);
    const CUtensorMap tm_do = make_tensor_map_heads(p.d_o, kD, s.seq_q, s.heads_q, s.batch, st.d_o, kRows);
    const CUtensorMap tm_k = make_tensor_map_heads(p.k, kD, s.seq_kv, s.heads_kv, s.batch, st.k, kKvKeys);
    const CUtensorMap tm_v = make_tensor_map_heads(p.v, kD, s.seq_kv, s.heads_kv, s.batch, st.v, kKvKeys);
    const StridedRows<__nv_bfloat16> dk{static_cast<__nv_bfloat16*>(p.dk), st.dk, s.heads_kv},
        dv{static_cast<__nv_bfloat16*>(p.dv), st.dv, s.heads_kv};
    // The bias as [planes][seq_q][seq_kv] floats, in boxes of 64 rows x 32 keys; unused unless staged.
    const CUtensorMap tm_bias =
        kStageBias ? make_tensor_map_swizzled(p.extras.bias, 4, s.seq_kv, s.seq_q, s.batch * s.heads_q, kRows, 128)
                   : CUtensorMap{};
    constexpr int kBytes = KvLayout<kD, kRows, kExtraBytes<kD, kPath, kStageBias>>::kBytes;
    static_assert(kBytes <= 227 * 1024, "a block may have 227 KiB of shared memory");
    auto kernel = features_backward_hopper_kernel<kD, kChanges, kPath, kStageBias>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes));
    const dim3 grid(unsigned((keys + kKvKeys - 1) / kKvKeys), unsigned(f.sequence_count(s) * s.heads_kv));
    kernel<<<grid, kThreads, kBytes, p.stream>>>(tm_q, tm_k, tm_v, tm_do, tm_bias, s, f, p.extras, p.lse, delta, dq32,
                                                 dk, dv);
    CUDA_CHECK_LAUNCH();
  }
  if constexpr (kPath == DqPath::kAtomics) {
    backward::launch_round_dq<__nv_bfloat16>(dq32, p);
  } else {
    const BackwardStrides st = p.strides ? *p.strides : BackwardStrides::packed(s);
    const StridedRows<__nv_bfloat16> dq{static_cast<__nv_bfloat16*>(p.dq), st.dq, s.heads_q};
    const int64_t n4 = int64_t(dq_floats / 4);
    round_dq_parts_kernel<kD><<<unsigned((n4 + 255) / 256), 256, 0, p.stream>>>(
        reinterpret_cast<const float4*>(dq32), dq, s.seq_q, (s.seq_q + kRowsOf<kD> - 1) / kRowsOf<kD>, n4,
        float(s.softmax_scale()));
    CUDA_CHECK_LAUNCH();
  }
}

/// launch_dim with dQ's path: the bulk reductions for a batch that is not packed (its parts, a
/// function of the shape, fit the workspace), the atomics for a packed one. At head_dim 64 the
/// shifted scores keep the atomics: the bulk path gains ALiBi nothing there and costs the bias a
/// sixth of its speed (the performance notes' measurement). At head_dim 128, without the softcap,
/// a bias that TMA can read (it and its rows on 16-byte boundaries) is staged, with the atomics: a
/// bias tile fits next to their layout, not next to the bulk path's dQ parts.
template <int kD, Changes kChanges>
void launch_path(const BackwardParams& p) {
  const AttentionFeatures& f = p.features;
  if constexpr (kD == 128 && kChanges == Changes::kShift) {
    if (f.bias && !f.varlen() && p.shape.seq_kv % 4 == 0 && reinterpret_cast<uintptr_t>(p.extras.bias) % 16 == 0)
      return launch_dim<kD, kChanges, DqPath::kAtomics, true>(p);
  }
  if constexpr (kD == 64 && kChanges == Changes::kShift) launch_dim<kD, kChanges, DqPath::kAtomics>(p);
  else if (f.varlen()) launch_dim<kD, kChanges, DqPath::kAtomics>(p);
  else launch_dim<kD, kChanges, DqPath::kBulk>(p);
}

void launch_backward_hopper(const BackwardParams& p) {
  require_window_tiles();  // the tile ranges are this chapter's exercise
  const AttentionFeatures& f = p.features;
  const int d = p.shape.head_dim;
  if (f.softcap > 0.0) with_head_dim<64, 128>(d, [&](auto dim) { launch_path<dim.value, Changes::kCap>(p); });
  else if (f.alibi || f.bias) with_head_dim<64, 128>(d, [&](auto dim) { launch_path<dim.value, Changes::kShift>(p); });
  else with_head_dim<64, 128>(d, [&](auto dim) { launch_path<dim.value, Changes::kNone>(p); });
}

BackwardKernel hopper_backward_kernel() {
  BackwardKernel k{"ch09_hopper_backward_bf16",
                   9,
                   2,
                   "hopper",
                   DType::BF16,
                   "chapter 07's fused Hopper backward with packed batches, windows, softcap, ALiBi and a bias",
                   launch_backward_hopper};
  k.supports = [](const AttentionShape& s) {
    const std::string why = hopper_support(s, "chapter 09's hopper backward", {64, 128});
    if (!why.empty() || s.group_size() <= kMaxGroup) return why;
    return "at most " + std::to_string(kMaxGroup) + " query heads per K/V head, got " + std::to_string(s.group_size());
  };
  k.workspace_bytes = [](const AttentionShape& s) {  // room for either path's fp32 dQ
    return (dq32_offset(s) + std::max(dq32_floats(s, DqPath::kAtomics), dq32_floats(s, DqPath::kBulk))) * sizeof(float);
  };
  k.features = kAllFeatures;
  k.strided = true;  // the tensor maps, D's rows, dK/dV's stores and dQ's rounding take any strides
  return k;
}

}  // namespace

FA_REGISTER_BACKWARD_KERNEL(hopper_backward_kernel());

}  // namespace fa::features
