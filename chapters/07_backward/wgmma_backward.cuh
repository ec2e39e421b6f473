// The pieces chapter 07's Hopper backward kernels share (variants 4 to 6, bf16, sm_90a): the
// block of one producer and two consumer warpgroups, the two-stage ring, the tile layout of TMA
// boxes, the wgmma products of a 64 x 64 tile, the dS step, the dK/dV kernels' shared-memory
// pointers and their producer warp, the dQ kernels' producer thread. Include it only from
// *_sm90a.cu files.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "hopper.cuh"
#include "log2_units.h"
#include "mask.h"
#include "problem.h"

namespace fa::backward::sm90 {

using namespace fa::hopper;

constexpr int kConsumers = 2, kThreads = 128 * (1 + kConsumers), kConsumerThreads = 128 * kConsumers;
constexpr int kStages = 2;
/// The kernels' two-stage ring of Q/dO (dK/dV kernels) or K/V (dQ kernels) tiles: a full barrier
/// per stage (the producer's copies landed) and an empty one (the consumers that read the stage
/// are done with it: both, except in dq_wide_kernel, where each stage has one).
using StageRing = Ring<kStages>;
constexpr int kBoxRowBytes = 128;  // a TMA box row: 64 bf16 columns, stored with the 128-byte swizzle

/// Tiles and accumulators are laid out for kPaddedDim<kD> (hopper.cuh): at kD = 96 the kernels
/// run as at 128, the zero columns TMA fills in add nothing to S or dP, and the dQ, dK, dV
/// columns they produce are not stored. kBoxes: the 64-column TMA boxes of a row.
template <int kD>
constexpr int kBoxes = kPaddedDim<kD> / 64;

/// A tile of `rows` rows of head_dim kD as TMA boxes of rows x 64 columns, side by side.
template <int kD>
__host__ __device__ constexpr int tile_bytes(int rows) {
  return kBoxes<kD> * rows * kBoxRowBytes;
}

/// The high word of every descriptor here: 8-row groups 1024 bytes apart, the 128-byte swizzle.
constexpr uint32_t kDescHi = desc_hi(1024, 1);

/// Issues c (64 x kN) = A B^T over kD as kD / 16 wgmma, without committing: A = 64 rows starting
/// at a_rows in a tile of boxes a_box_bytes apart, B = the kN (64 or 128) rows of a tile of boxes
/// b_box_bytes apart, both K-major (kD contiguous). The k-th 16-column step starts 32 bytes
/// further in a swizzled row; columns 64 and up are in the next box. a_lo and b_lo are the
/// descriptors' low words of a_rows and b_rows (desc_lo with leading 16): each step adds a
/// constant to them.
template <int kD, int kN = 64>
__device__ inline void issue_abt(float (&c)[kN / 2], uint32_t a_lo, int a_box_bytes, uint32_t b_lo, int b_box_bytes) {
  static_assert(kN == 64 || kN == 128, "wgmma n64 or n128");
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks) {
    const int box = ks / 4, step = ks % 4;
    const uint64_t a = desc_join(a_lo + (box * a_box_bytes + step * 32) / 16, kDescHi);
    const uint64_t b = desc_join(b_lo + (box * b_box_bytes + step * 32) / 16, kDescHi);
    if constexpr (kN == 128) wgmma_m64n128k16_ss<0>(c, a, b, ks > 0);
    else wgmma_m64n64k16_ss<0>(c, a, b, ks > 0);
  }
}
/// The same from the operands' addresses.
template <int kD, int kN = 64>
__device__ inline void issue_abt(float (&c)[kN / 2], const unsigned char* a_rows, int a_box_bytes,
                                 const unsigned char* b_rows, int b_box_bytes) {
  issue_abt<kD, kN>(c, desc_lo(a_rows, 16), a_box_bytes, desc_lo(b_rows, 16), b_box_bytes);
}

/// Issues acc (64 x kD) += A B without committing: A = 64 x kRows from registers (kRows / 16
/// k-steps), B = the kRows rows of a [kRows][kD] tile (boxes of kRows rows), read "MN-major" (kD
/// contiguous), the way chapter 06 reads V in P V. b_lo: the descriptor's low word of the tile
/// (desc_lo with leading kBox, the distance between its boxes).
template <int kD, int kRows = 64>
__device__ inline void issue_a_regs_b(float (&acc)[kPaddedDim<kD> / 2], const uint32_t (&a)[kRows / 16][4],
                                      uint32_t b_lo) {
  constexpr int kBox = tile_bytes<64>(kRows);
#pragma unroll
  for (int kk = 0; kk < kRows / 16; ++kk) {
    const uint64_t b = desc_join(b_lo + kk * 16 * kBoxRowBytes / 16, kDescHi);
    if constexpr (kPaddedDim<kD> == 256) {  // two halves of acc, columns 0-127 (boxes 0-1) and 128-255 (boxes 2-3)
      const uint64_t b_hi = desc_join(b_lo + (2 * kBox + kk * 16 * kBoxRowBytes) / 16, kDescHi);
      wgmma_m64n128k16_rs<1>(*reinterpret_cast<float(*)[64]>(&acc[0]), a[kk], b, true);
      wgmma_m64n128k16_rs<1>(*reinterpret_cast<float(*)[64]>(&acc[64]), a[kk], b_hi, true);
    } else if constexpr (kPaddedDim<kD> == 128) {
      wgmma_m64n128k16_rs<1>(acc, a[kk], b, true);
    } else {
      wgmma_m64n64k16_rs<1>(acc, a[kk], b, true);
    }
  }
}
/// The same from the tile's address.
template <int kD, int kRows = 64>
__device__ inline void issue_a_regs_b(float (&acc)[kPaddedDim<kD> / 2], const uint32_t (&a)[kRows / 16][4],
                                      const unsigned char* b_tile) {
  issue_a_regs_b<kD, kRows>(acc, a, desc_lo(b_tile, tile_bytes<64>(kRows)));
}

// ---- the dS step ---------------------------------------------------------------------------
// Every kernel here turns a tile's S and dP accumulators into P and dS the same way:
//   P = exp(S scale - LSE), 0 where the mask hides the score;   dS = P (dP - D).
// The dQ kernels hold the tile rows x keys: the thread's two rows are fixed, their LSE and D in
// registers (RowStats). The dK/dV kernels hold it keys x rows (S^T, dP^T): the thread's two keys
// are fixed and the rows are the columns, their LSE and D read from the stage in shared memory
// (ColumnStats). Either way the thread's two runs (mask.h: the rows that see each of its keys,
// KeyRows, or the keys each of its rows sees, RowKeys) are asked for only on a tile the mask
// cuts: held across the loop, their four values would be live next to the accumulators.

/// LSE (log2 units) and D of a keys x rows tile's rows, from the stage: element i of the
/// accumulator is row 8 (i / 4) + 2 t + (i & 1) of the tile, so from the thread's first row
/// (lse and delta point at row 2 t) the offsets are constants. Elements i and i + 1 (i even) are
/// two adjacent rows: one 8-byte load (the stage and 2 t are 8-byte aligned) reads both.
struct ColumnStats {
  const float *lse, *delta;
  __device__ ColumnStats(const float* stage_lse, const float* stage_delta, int t)
      : lse(stage_lse + 2 * t), delta(stage_delta + 2 * t) {}
  __device__ float2 lse_pair(int i) const { return *reinterpret_cast<const float2*>(lse + 8 * (i / 4)); }
  __device__ float2 delta_pair(int i) const { return *reinterpret_cast<const float2*>(delta + 8 * (i / 4)); }
};

/// LSE (log2 units) and D of a thread's two rows of a rows x keys tile: element i is row (i % 4) / 2,
/// so elements i and i + 1 (i even) share their row.
struct RowStats {
  float lse[2], delta[2];
  __device__ float2 lse_pair(int i) const { return make_float2(lse[(i % 4) / 2], lse[(i % 4) / 2]); }
  __device__ float2 delta_pair(int i) const { return make_float2(delta[(i % 4) / 2], delta[(i % 4) / 2]); }
};

/// The RowStats of rows row_a and row_a + 8 of query plane bh (0 for a row past the end).
__device__ inline RowStats row_stats(const AttentionShape& s, const float* lse, const float* delta, int bh, int row_a) {
  RowStats r;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row_a + 8 * h;
    r.lse[h] = row < s.seq_q ? lse[int64_t(bh) * s.seq_q + row] * kLog2e : 0.0f;
    r.delta[h] = row < s.seq_q ? delta[int64_t(bh) * s.seq_q + row] : 0.0f;
  }
  return r;
}

/// S -> P in place. With `masked`, the scores outside the thread's two runs (mask_fragment's
/// layout, `first` the thread's first column; runs() gives them, asked only then) become 0. The
/// exponent is taken first and the hidden values are replaced, whatever they are (inf for a row
/// that sees no key, whose LSE is -inf).
template <int kN, class Stats, class Runs>
__device__ inline void probabilities(float (&s)[kN], const Stats& stats, float scale_log2, bool masked,
                                     const Runs& runs, int first) {
#pragma unroll
  for (int i = 0; i < kN; i += 2) {
    const float2 lse = stats.lse_pair(i);
    s[i] = fast_exp2(fmaf(s[i], scale_log2, -lse.x));
    s[i + 1] = fast_exp2(fmaf(s[i + 1], scale_log2, -lse.y));
  }
  if (masked) {
    const KeyRun r[2] = {runs(0), runs(1)};
    mask_fragment(s, r, first, 0.0f);
  }
}

/// dP -> dS = P (dP - D) in place.
template <int kN, class Stats>
__device__ inline void score_gradients(float (&dp)[kN], const float (&p)[kN], const Stats& stats) {
#pragma unroll
  for (int i = 0; i < kN; i += 2) {
    const float2 d = stats.delta_pair(i);
    dp[i] = p[i] * (dp[i] - d.x);
    dp[i + 1] = p[i + 1] * (dp[i + 1] - d.y);
  }
}

//! [wgmma_ds_step]
/// The dS step of one tile: S -> P and dP -> dS.
template <int kN, class Stats, class Runs>
__device__ inline void ds_step(float (&s)[kN], float (&dp)[kN], const Stats& stats, float scale_log2, bool masked,
                               const Runs& runs, int first) {
  probabilities(s, stats, scale_log2, masked, runs, first);
  score_gradients(dp, s, stats);
}
//! [wgmma_ds_step]

/// The runs of a keys x rows tile: the query rows that see the thread's keys key_a and key_a + 8.
struct KeyRows {
  AttentionShape s;
  int key_a;
  __device__ KeyRun operator()(int h) const { return shape_rows(s, key_a + 8 * h); }
};

/// The runs of a rows x keys tile: the keys that rows row_a and row_a + 8 see.
struct RowKeys {
  AttentionShape s;
  int row_a;
  __device__ KeyRun operator()(int h) const { return shape_keys(s, row_a + 8 * h); }
};

/// Thread 0 sets up a kernel's ring (first: kv_full or q_full, one arrival; full[kStages] and
/// empty[kStages] with the given arrival counts), then the block waits for it.
__device__ inline void init_stages(uint64_t* first, uint64_t* full, uint64_t* empty, int full_arrivals,
                                   int empty_arrivals) {
  if (threadIdx.x == 0) {
    mbarrier_init(first, 1);
    for (int st = 0; st < kStages; ++st) {
      mbarrier_init(&full[st], full_arrivals);
      mbarrier_init(&empty[st], empty_arrivals);
    }
    fence_barrier_init();
  }
  __syncthreads();
}

// ---- the dK/dV kernels' common parts ------------------------------------------------------

constexpr int kKvKeys = 64 * kConsumers;  // keys per block
constexpr int kKvRows = 64;               // query rows per Q tile (variant 5 at head_dim 64: 128)

/// Shared memory of a dK/dV block of kKvKeys keys and Q tiles of kRows rows: K and V, the ring's
/// Q, dO, LSE and D, then kExtraBytes for a kernel's own use (1024-aligned: variant 5's dS^T
/// buffers), the barriers and the alignment slack.
template <int kD, int kRows = kKvRows, int kExtraBytes = 0>
struct KvLayout {
  static constexpr int kK = 0, kV = kK + tile_bytes<kD>(kKvKeys);
  static constexpr int kQ = kV + tile_bytes<kD>(kKvKeys);             // kStages Q tiles
  static constexpr int kDo = kQ + kStages * tile_bytes<kD>(kRows);    // kStages dO tiles
  static constexpr int kLse = kDo + kStages * tile_bytes<kD>(kRows);  // kStages x kRows floats, log2 units
  static constexpr int kDelta = kLse + kStages * kRows * 4;           // kStages x kRows floats
  static constexpr int kExtra = (kDelta + kStages * kRows * 4 + 1023) / 1024 * 1024;
  static constexpr int kBars = kExtra + kExtraBytes;  // kv_full, full[2], empty[2]
  static constexpr int kBytes = kBars + 8 * (1 + 2 * kStages) + 1024;
};

/// A dK/dV block's work items: item it is (query head kvh * group + it / row_tiles, Q tile
/// first_tile + it % row_tiles, of kRows rows) over the query heads sharing the block's K/V head;
/// with the causal mask, Q tiles wholly above the block's first key j0 are left out.
template <int kRows = kKvRows>
struct KvItems {
  int head0, first_tile, row_tiles, n;
  __device__ KvItems(const AttentionShape& s, int kv_plane, int j0) {
    const int batch = kv_plane / s.heads_kv, kvh = kv_plane % s.heads_kv, group = s.group_size();
    head0 = batch * s.heads_q + kvh * group;
    first_tile = (s.causal ? max(0, j0 - s.causal_offset()) : 0) / kRows;
    row_tiles = max((s.seq_q + kRows - 1) / kRows - first_tile, 0);
    n = group * row_tiles;
  }
  __device__ int bh(int it) const { return head0 + it / row_tiles; }
  __device__ int i0(int it) const { return (first_tile + it % row_tiles) * kRows; }
  /// Steps (bh, i0) from one item to the next without a division: the head's next Q tile, or
  /// the first tile of the next head.
  __device__ void next(int& bh_, int& i0_) const {
    i0_ += kRows;
    if (i0_ == (first_tile + row_tiles) * kRows) {
      i0_ = first_tile * kRows;
      ++bh_;
    }
  }
};

/// Where a dK/dV kernel's layout L (KvLayout, or WideKvLayout at head_dim 256) puts the block's
/// barriers and its LSE and D stages: kv_full (K and V have landed), the ring's full[kStages] and
/// empty[kStages], then LSE and D, kStages x the Q tile's rows each. The kernels and their producer
/// bind the five pointers to these names with one structured binding.
struct DkdvShared {
  uint64_t *kv_full, *full, *empty;
  float *lse_s, *delta_s;
};
template <class L>
__device__ inline DkdvShared dkdv_shared(unsigned char* smem) {
  uint64_t* kv_full = reinterpret_cast<uint64_t*>(smem + L::kBars);
  return {kv_full, kv_full + 1, kv_full + 1 + kStages, reinterpret_cast<float*>(smem + L::kLse),
          reinterpret_cast<float*>(smem + L::kDelta)};
}

/// The dK/dV kernels' producer warp (lane = 0 .. 31). L: the kernel's layout; kKeys: its keys per
/// block, j0 the first; kRows: the rows of its Q tiles.
template <int kD, int kKeys, class L, int kRows = kKvRows>
__device__ inline void produce_dkdv(unsigned char* smem, const CUtensorMap& tm_q, const CUtensorMap& tm_k,
                                    const CUtensorMap& tm_v, const CUtensorMap& tm_do, const AttentionShape& s,
                                    const KvItems<kRows>& items, int j0, int kv_plane, const float* lse,
                                    const float* delta, int lane) {
  const auto [kv_full, full, empty, lse_s, delta_s] = dkdv_shared<L>(smem);
  //! [wgmma_dkdv_producer]
  // One warp: lane 0 issues the TMA copies of K and V (once) and of each item's Q and dO; all
  // 32 lanes copy the item's LSE (in log2 units) and D into shared memory, then arrive.
  if (lane == 0) {
    mbarrier_arrive_expect_tx(kv_full, 2 * tile_bytes<kD>(kKeys));
    for (int b = 0; b < kBoxes<kD>; ++b) {
      tma_load_head(smem + L::kK + b * kKeys * kBoxRowBytes, &tm_k, 64 * b, j0, kv_plane, s.heads_kv, kv_full);
      tma_load_head(smem + L::kV + b * kKeys * kBoxRowBytes, &tm_v, 64 * b, j0, kv_plane, s.heads_kv, kv_full);
    }
  }
  for (int it = 0; it < items.n; ++it) {
    const int st = StageRing::stage(it), bh = items.bh(it), i0 = items.i0(it);
    if (it >= kStages) mbarrier_wait(&empty[st], StageRing::empty_parity(it));
    for (int r = lane; r < kRows; r += 32) {
      const int row = i0 + r;
      const bool in = row < s.seq_q;  // rows past the end: Q = dO = 0 (TMA), LSE = D = 0, so P^T dO = dS^T Q = 0
      lse_s[st * kRows + r] = in ? lse[int64_t(bh) * s.seq_q + row] * kLog2e : 0.0f;
      delta_s[st * kRows + r] = in ? delta[int64_t(bh) * s.seq_q + row] : 0.0f;
    }
    if (lane == 0) {
      mbarrier_arrive_expect_tx(&full[st], 2 * tile_bytes<kD>(kRows));
      for (int b = 0; b < kBoxes<kD>; ++b) {
        tma_load_head(smem + L::kQ + st * tile_bytes<kD>(kRows) + b * kRows * kBoxRowBytes, &tm_q, 64 * b, i0, bh,
                      s.heads_q, &full[st]);
        tma_load_head(smem + L::kDo + st * tile_bytes<kD>(kRows) + b * kRows * kBoxRowBytes, &tm_do, 64 * b, i0, bh,
                      s.heads_q, &full[st]);
      }
    } else {
      mbarrier_arrive(&full[st]);
    }
  }
  //! [wgmma_dkdv_producer]
}

// ---- the dQ kernels' common parts ---------------------------------------------------------

constexpr int kQKeys = 64;  // keys per K/V tile of the dQ kernels

/// The dQ kernels' producer thread: the block's kRows rows of Q and dO (from i0), then its K/V
/// tiles into the ring. L: the kernel's layout.
template <int kD, int kRows, class L>
__device__ inline void produce_dq(unsigned char* smem, const CUtensorMap& tm_q, const CUtensorMap& tm_k,
                                  const CUtensorMap& tm_v, const CUtensorMap& tm_do, const AttentionShape& s, int i0,
                                  int bh, int kv_plane, int n_tiles, uint64_t* q_full, uint64_t* full,
                                  uint64_t* empty) {
  mbarrier_arrive_expect_tx(q_full, 2 * tile_bytes<kD>(kRows));
  for (int b = 0; b < kBoxes<kD>; ++b) {
    tma_load_head(smem + L::kQ + b * kRows * kBoxRowBytes, &tm_q, 64 * b, i0, bh, s.heads_q, q_full);
    tma_load_head(smem + L::kDo + b * kRows * kBoxRowBytes, &tm_do, 64 * b, i0, bh, s.heads_q, q_full);
  }
  for (int jt = 0; jt < n_tiles; ++jt) {
    const int st = StageRing::stage(jt);
    if (jt >= kStages) mbarrier_wait(&empty[st], StageRing::empty_parity(jt));
    mbarrier_arrive_expect_tx(&full[st], 2 * tile_bytes<kD>(kQKeys));
    for (int b = 0; b < kBoxes<kD>; ++b) {
      tma_load_head(smem + L::kK + st * tile_bytes<kD>(kQKeys) + b * kQKeys * kBoxRowBytes, &tm_k, 64 * b, jt * kQKeys,
                    kv_plane, s.heads_kv, &full[st]);
      tma_load_head(smem + L::kV + st * tile_bytes<kD>(kQKeys) + b * kQKeys * kBoxRowBytes, &tm_v, 64 * b, jt * kQKeys,
                    kv_plane, s.heads_kv, &full[st]);
    }
  }
}

}  // namespace fa::backward::sm90
