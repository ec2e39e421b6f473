// Chapter 06, variant 5: the per-tile work both FP8 attention kernels share (the two-consumer
// ping-pong at head_dim 64, fp8_pingpong.cuh, and the kernel with P through shared memory at 128
// and 256, fp8_three_consumers.cuh). Variant 4's structure on e4m3 operands:
//   S = Q8 K8^T with wgmma.m64nNk32.e4m3, times scale_q * scale_k folded into the exponent;
//   P * 2^8 (inside the exponent) rounded to e4m3 (2^8 keeps small probabilities above e4m3's
//   floor);
//   O += P8 V8 with O kept in units of the largest V block scale: each tile's own V scale goes
//   into P's exponent too (see fp8_units), and O * v_ref / (2^8 l) at the end.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "algorithm.h"
#include "flash3_tile.cuh"
#include "fp8_quantize.cuh"
#include "fp8_scheduler.cuh"

namespace fa::flash3 {
namespace {

using namespace fa::hopper;

/// Ring stages: e4m3 tiles are small, 4 stages fit up to head_dim 128; at 256 a K or V^T tile is
/// 32 KiB and two stages of each are what fits beside Q and the P buffers.
template <int kD>
constexpr int kStages8 = kD == 256 ? 2 : 4;
/// Bytes of one tile: 128 rows of head_dim e4m3 (Q, K), or head_dim rows of 128 keys (V^T).
template <int kD>
constexpr int kTileBytes8 = (kRows8 * kD);
/// Q and K rows are head_dim bytes; a swizzled TMA box row is at most 128, so at 256 a row is
/// two boxes (columns 0..127 and 128..255), each stored as its own sub-tile.
template <int kD>
constexpr int kBoxBytes8 = kD < 128 ? kD : 128;
/// Consumer warpgroups (64 Q rows each) of the kernel that runs at head_dim kD: the two-consumer
/// ping-pong at 64, P through shared memory with three consumers at 128 and with two at 256
/// (where O alone is 128 registers per thread).
template <int kD>
constexpr int kConsumers8 = kD == 128 ? 3 : 2;

struct Fp8Scales {
  const float* q;  // [planes_q][q blocks]
  const float* k;  // [planes_kv][kv blocks]
  const float* v;
  int q_blocks, kv_blocks;
};

/// Byte offsets of a block's shared memory: the Q tile (64 rows per consumer), kStages K tiles,
/// kStages V^T tiles, kExtra bytes the kernel adds (P buffers, the tile of ones), the barriers
/// q_full, k_full, v_full, k_empty, v_empty. Q and K tiles are kD / kBox sub-tiles of kBox-byte
/// rows (kBoxBytes8), Q's of 64 * kConsumers rows and K's of 128.
template <int kD, int kConsumers, int kExtra = 0>
struct Fp8Smem {
  static constexpr int kStages = kStages8<kD>, kBox = kBoxBytes8<kD>;
  static constexpr int kTile = kTileBytes8<kD>, kQTile = 64 * kConsumers * kD;
  static constexpr int kQBox = 64 * kConsumers * kBox, kKBox = kRows8 * kBox;  // one sub-tile of Q, of K
  static constexpr int kQ = 0, kK = kQTile, kV = kK + kStages * kTile, kExtraAt = kV + kStages * kTile;
  static constexpr int kBars = kExtraAt + kExtra;
  static constexpr int kBytes = kBars + 8 * (1 + 4 * kStages) + 1024;  // + slack to align the base to 1024
};

/// The ring's barriers, laid out at `bars`, for a ring of `stages` stages.
struct Fp8Barriers {
  uint64_t *q_full, *k_full, *v_full, *k_empty, *v_empty;
  __device__ Fp8Barriers(unsigned char* bars, int stages)
      : q_full(reinterpret_cast<uint64_t*>(bars)),
        k_full(q_full + 1),
        v_full(k_full + stages),
        k_empty(v_full + stages),
        v_empty(k_empty + stages) {}
};

/// The producer warpgroup's one thread: the Q tile, then the piece's K/V tiles into the ring, as
/// in variant 3. Q and K come in boxes of kBox columns (two per row at head_dim 256); V^T tiles
/// are (keys, d rows) boxes.
template <class L>
__device__ inline void produce_fp8(unsigned char* smem, const Fp8Barriers& bars, const CUtensorMap& tm_q,
                                   const CUtensorMap& tm_k, const CUtensorMap& tm_vt, int i0, int bh,
                                   const PieceTiles& tiles) {
  constexpr int kBoxes = L::kTile / L::kKBox;
  const int kv_plane = tiles.kv_plane, tile0 = tiles.tile0;
  mbarrier_arrive_expect_tx(bars.q_full, L::kQTile);
#pragma unroll
  for (int b = 0; b < kBoxes; ++b) tma_load_3d(smem + L::kQ + b * L::kQBox, &tm_q, b * L::kBox, i0, bh, bars.q_full);
  produce_kv<L::kStages>(
      tiles.n_tiles, bars.k_empty, bars.v_empty,
      [&](int j, int stage) {
        mbarrier_arrive_expect_tx(&bars.k_full[stage], L::kTile);
#pragma unroll
        for (int b = 0; b < kBoxes; ++b)
          tma_load_3d(smem + L::kK + stage * L::kTile + b * L::kKBox, &tm_k, b * L::kBox, (tile0 + j) * kBlockN,
                      kv_plane, &bars.k_full[stage]);
      },
      [&](int j, int stage) {
        mbarrier_arrive_expect_tx(&bars.v_full[stage], L::kTile);
        tma_load_3d(smem + L::kV + stage * L::kTile, &tm_vt, (tile0 + j) * kBlockN, 0, kv_plane, &bars.v_full[stage]);
      });
}

/// P (fp32, already times 2^8) as e4m3 A fragments for the 4 k-steps of 32 keys.
__device__ inline void pack_p_e4m3(const float (&s)[kBlockN / 2], uint32_t (&p)[kBlockN / 32][4]) {
#pragma unroll
  for (int kk = 0; kk < kBlockN / 32; ++kk) {
    const int j = 4 * kk;  // the step's first 8-key block; s[4j + e]: e = 0, 1 row g, e = 2, 3 row g + 8
    p[kk][0] = e4m3x4(s[4 * j + 0], s[4 * j + 1], s[4 * (j + 1) + 0], s[4 * (j + 1) + 1]);
    p[kk][1] = e4m3x4(s[4 * j + 2], s[4 * j + 3], s[4 * (j + 1) + 2], s[4 * (j + 1) + 3]);
    p[kk][2] = e4m3x4(s[4 * (j + 2) + 0], s[4 * (j + 2) + 1], s[4 * (j + 3) + 0], s[4 * (j + 3) + 1]);
    p[kk][3] = e4m3x4(s[4 * (j + 2) + 2], s[4 * (j + 2) + 3], s[4 * (j + 3) + 2], s[4 * (j + 3) + 3]);
  }
}

/// FP8's online softmax on the raw scores: variant 4's (online_softmax in flash3_tile.cuh) with
/// three changes, each explained where the ops use it (fp8_units, fp8_stale_max):
///   p_log2_scale  every P comes out times 2^p_log2_scale, for free inside the exponent;
///   l_weight      the tile's row sums enter l times this weight;
///   max_rise      (> 0) a row keeps its running max until a tile's max passes it by more
///                 than max_rise (log2 units), so that its factor stays exactly 1.
/// kRowSums off: l is left alone (the three-consumer kernel takes the row sums from the tensor
/// cores instead).
template <bool kRowSums>
__device__ inline void fp8_online_softmax(float (&s)[kBlockN / 2], float (&m)[2], float (&l)[2], float (&rescale)[2],
                                          float scale_log2, float p_log2_scale, float l_weight, float max_rise) {
  //! [fp8_online_softmax]
  float m_use[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float tile_max = -INFINITY;
#pragma unroll
    for (int c = 0; c < kBlockN / 8; ++c) tile_max = fmaxf(tile_max, fmaxf(s[4 * c + 2 * h], s[4 * c + 2 * h + 1]));
    const float tile_m = quad_max(tile_max) * scale_log2;
    const float m_new = tile_m > m[h] + max_rise ? tile_m : m[h];
    const bool seen = m_new != -INFINITY;
    rescale[h] = seen ? fast_exp2(m[h] - m_new) : 1.0f;
    m_use[h] = (seen ? m_new : 0.0f) - p_log2_scale;
    m[h] = m_new;
  }
  // The exponentials in fragment order, both rows of an 8-key block together: each group of four
  // that pack_p_e4m3 turns into e4m3 bytes is complete early, and its conversion overlaps the
  // exponentials still to come.
  float row_sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < kBlockN / 2; ++i) {
    const int h = (i % 4) / 2;  // s[4c + e]: e = 0, 1 row g, e = 2, 3 row g + 8
    s[i] = fast_exp2(fmaf(s[i], scale_log2, -m_use[h]));
    if (kRowSums) row_sum[h] += s[i];
  }
  if (kRowSums) {
#pragma unroll
    for (int h = 0; h < 2; ++h) l[h] = l[h] * rescale[h] + row_sum[h] * l_weight;
  }
  //! [fp8_online_softmax]
}

/// Where a consumer warpgroup's work lies: the block-wide parts from the constructor, the
/// warpgroup's own set by name in the kernel.
struct Fp8ConsumerSetup {
  unsigned char* smem;
  Fp8Barriers bars;
  const AttentionShape* shape;
  const Fp8Scales* scales;
  int bh, kv_plane;
  int tile0;         // the first K/V tile of this block's range: ring slot j holds tile tile0 + j
  int c0 = 0;        // the warpgroup's first Q row (< 0 in an empty group: no rows)
  int mask_i0 = 0;   // the first of the rows whose mask test decides whether a tile needs the mask
  int my_tiles = 0;  // the tiles this warpgroup computes (it may wait for and release more)
  int consumer = 0, warp = 0, lane = 0;
  __device__ Fp8ConsumerSetup(unsigned char* smem_, const Fp8Barriers& bars_, const AttentionShape& shape_,
                              const Fp8Scales& scales_, int bh_, const PieceTiles& tiles)
      : smem(smem_),
        bars(bars_),
        shape(&shape_),
        scales(&scales_),
        bh(bh_),
        kv_plane(tiles.kv_plane),
        tile0(tiles.tile0) {}
};

/// The e4m3 operations a consumer's schedule runs, except those that differ between the two
/// kernels (pv, pack, rescale_out, fence_out: in fp8_pingpong.cuh and fp8_three_consumers.cuh).
/// kMaskRows: the rows whose mask test decides whether a tile needs the mask.
template <int kD, class L, int kMaskRows>
struct Fp8OpsBase {
  using R = Ring<L::kStages>;
  static constexpr int kKeys = kBlockN;
  unsigned char* smem;
  uint32_t smem_lo;  // the descriptor low word of smem's first byte (see desc_lo)
  const unsigned char* q_rows;
  Fp8Barriers bars;
  AttentionShape shape;
  const float *k_scales, *v_scales;  // this K/V head's block scales
  int mask_i0, tile0, row0, t, last_block;
  float scale_log2;         // softmax scale * log2(e) * this Q block's scale
  float v_ref, log2_v_ref;  // O's unit: the largest V block scale among this warpgroup's tiles
  float k_next, v_next;     // the next tile's K and V scales, loaded a tile ahead
  float out[kD / 2] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  uint32_t p[kBlockN / 32][4] = {};

  __device__ explicit Fp8OpsBase(const Fp8ConsumerSetup& c)
      : smem(c.smem),
        smem_lo(desc_lo(c.smem, 16)),
        q_rows(c.smem + L::kQ + c.consumer * 64 * L::kBox),
        bars(c.bars),
        shape(*c.shape),
        k_scales(c.scales->k + int64_t(c.kv_plane) * c.scales->kv_blocks),
        v_scales(c.scales->v + int64_t(c.kv_plane) * c.scales->kv_blocks),
        mask_i0(c.mask_i0),
        tile0(c.tile0),
        row0(c.c0 + 16 * c.warp + c.lane / 4),
        t(c.lane % 4),
        last_block(c.scales->kv_blocks - 1) {
    const float scale_q =
        c.scales->q[int64_t(c.bh) * c.scales->q_blocks + min(max(c.c0, 0) / kRows8, c.scales->q_blocks - 1)];
    scale_log2 = float(shape.softmax_scale()) * kLog2e * scale_q;
    // O's unit: the largest V scale over the tiles this warpgroup reads (1 if they are all zero).
    float largest = 0.0f;
    for (int j = tile0 + c.lane; j < tile0 + c.my_tiles; j += 32) largest = fmaxf(largest, v_scales[j]);
    largest = warp_all_reduce(largest, MaxOp());
    v_ref = largest == 0.0f ? 1.0f : largest;
    log2_v_ref = __log2f(v_ref);
    const int first = min(tile0, last_block);
    k_next = k_scales[first];
    v_next = v_scales[first];
  }

  __device__ void wait_k(int j) { mbarrier_wait(&bars.k_full[R::stage(j)], R::full_parity(j)); }
  __device__ void wait_v(int j) { mbarrier_wait(&bars.v_full[R::stage(j)], R::full_parity(j)); }
  __device__ void release_k(int j) { mbarrier_arrive(&bars.k_empty[R::stage(j)]); }
  __device__ void release_v(int j) { mbarrier_arrive(&bars.v_empty[R::stage(j)]); }
  /// Descriptor high words. Q and K sub-tile rows are kBox bytes: the 128-byte swizzle at head_dim
  /// 128 and 256, the 64-byte one at 64 (8-row groups 1024 or 512 bytes apart). V^T and P rows
  /// are 128 bytes.
  static constexpr uint32_t kRowsHi = L::kBox == 128 ? desc_hi(1024, 1) : desc_hi(512, 2), kKeysHi = desc_hi(1024, 1);
  /// The descriptor low word of the V^T tile of item j (a tile at byte offset x of smem has the
  /// low word smem_lo + x / 16).
  __device__ uint32_t v_lo(int j) const { return smem_lo + (L::kV + R::stage(j) * L::kTile) / 16; }

  __device__ void scores(int j, float (&s)[kBlockN / 2]) {
    //! [fp8_scores]
    // S = Q8 K8^T: kD / 32 wgmma of k = 32 bytes; the true scores are S * scale_q * scale_k.
    // Descriptors by 32-bit adds (desc_lo): the k-th step starts 32 bytes further in Q and K,
    // and every kBox / 32 steps moves on to the next sub-tile (head_dim 256 only).
    constexpr int kSteps = L::kBox / 32;
    const uint32_t q_lo = smem_lo + uint32_t(q_rows - smem) / 16,
                   k_lo = smem_lo + (L::kK + R::stage(j) * L::kTile) / 16;
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kD / 32; ++ks) {
      const uint32_t b = ks / kSteps, step = 2 * (ks % kSteps);
      wgmma_m64n128k32_e4m3_ss(s, desc_join(q_lo + b * (L::kQBox / 16) + step, kRowsHi),
                               desc_join(k_lo + b * (L::kKBox / 16) + step, kRowsHi), ks > 0);
    }
    wgmma_commit();
    //! [fp8_scores]
  }

  //! [fp8_stale_max]
  // A row keeps its running max m until a tile's max passes m + kMaxRise (log2 units). Until
  // then P = 2^(x - m + 8) stays below 2^8.75 = 430, inside e4m3's range (448), and the row's
  // factor exp2(m_old - m_new) is exactly 1, so rescale_output can skip O's multiplies. With the
  // exact max, some row of a warp's 16 would rise on most tiles of random inputs (a row's max
  // rises at tile j with probability about 1 / (j + 1)), and every such tile costs the warp
  // kD / 2 multiplies per thread.
  static constexpr float kMaxRise = 0.75f;
  //! [fp8_stale_max]

  /// Mask, online softmax, P left in s (times 2^8 / r); returns l's weight 1 / r for this P.
  template <bool kRowSums>
  __device__ float softmax_tile(int j, float (&s)[kBlockN / 2], float (&rescale)[2]) {
    const int key0 = (tile0 + j) * kBlockN;
    if (tile_needs_mask(shape, mask_i0, kMaskRows, key0)) mask_scores(s, shape, row0, key0, t);
    //! [fp8_units]
    // O stays in units of v_ref for the whole loop: V_j's own scale, as r = v_scale_j / v_ref <= 1,
    // rides in P's exponent next to the 2^8 (kPScale) that lifts P into e4m3's range. l must
    // not carry r, so the row sums are divided by it again (w). An all-zero V block (scale 0)
    // takes r = 1: its P V is 0 whatever P is, and its P must still count in l. r is floored at
    // 2^-16.
    const float k_scale_j = k_next, v_scale_j = v_next;
    const float log2_r = v_scale_j == 0.0f ? 0.0f : fmaxf(__log2f(v_scale_j) - log2_v_ref, -16.0f);
    const float w = fast_exp2(-log2_r);
    static_assert(kPScale == 256.0f, "the exponent offset below is log2(kPScale)");
    fp8_online_softmax<kRowSums>(s, m, l, rescale, scale_log2 * k_scale_j, 8.0f + log2_r, w, kMaxRise);
    //! [fp8_units]
    // The scales were loaded one tile ahead: a global load here would put its latency on the
    // softmax's critical path every tile.
    const int ahead = min(tile0 + j + 1, last_block);
    k_next = k_scales[ahead];
    v_next = v_scales[ahead];
    return w;
  }

  /// After the loop: O_true = out * v_ref / 2^8 / l, with l itself 2^8 too large. The 2^8 comes
  /// out of l (for the LSE) and goes into O's factor.
  __device__ void to_true_units() {
    const float factor[2] = {v_ref / kPScale, v_ref / kPScale};
    l[0] /= kPScale;
    l[1] /= kPScale;
    rescale_output<kD>(out, factor);
  }
};

/// The end of a consumer warpgroup (l: each row's whole sum): O / l and the LSE stored, or, for
/// a piece of a split block, its partial result merged with the other pieces' (merge_pieces).
template <int kD, int kConsumers, class Ops>
__device__ inline void finish_fp8(Ops& ops, const Piece& work, const Fp8Grid& grid, int bh, int consumer, int warp,
                                  __nv_bfloat16* o, float* lse) {
  if (work.pieces == 1) {
    float inv[2], lse_log2[2];
    row_totals(ops.m, ops.l, inv, lse_log2);
    store_output<kD>(ops.out, inv, lse_log2, ops.shape, bh, ops.row0, ops.t,
                     StridedRows<__nv_bfloat16>::packed(o, ops.shape.heads_q, ops.shape.seq_q, kD), lse);
    return;
  }
  const int warp_slot = consumer * 4 + warp;  // this warp's record and counter within the block's
  constexpr int64_t kRecord = kRecordFloats<kD>, kBlockRecords = kConsumers * 4 * kRecord;
  merge_pieces<kD>(ops.out, ops.m, ops.l, work.piece, work.pieces,
                   grid.records + int64_t(work.tail) * work.pieces * kBlockRecords + warp_slot * kRecord, kBlockRecords,
                   grid.counters + int64_t(work.tail) * kConsumers * 4 + warp_slot, ops.shape, bh, ops.row0, ops.t, o,
                   lse);
}

}  // namespace
}  // namespace fa::flash3
