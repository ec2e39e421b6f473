// Chapter 06, variant 5's tile scheduler: which (Q block, plane) each block of the grid takes,
// and how the last wave is split. The attention kernel's grid is one-dimensional. Blocks run in
// waves of `slots` (SMs x blocks per SM); when the blocks do not fill the last wave, its few
// blocks would run alone while most SMs idle. So each of those `tail` blocks runs as `pieces`
// blocks, each over a share of the K/V tiles, and the last piece to finish merges the partial
// results (merge_pieces). How many pieces: tail_pieces in algorithm.h; on the host,
// fp8_tail_split in flash_attention_v3_fp8_sm90a.cu.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "flash3_tile.cuh"

namespace fa::flash3 {
namespace {

/// The grid, one dimension: the (Q block, plane) pairs, of which those from split_from on each
/// run as `pieces` blocks that share the pair's K/V tiles (tail_pieces in algorithm.h), and
/// where those pieces leave their partial results.
struct Fp8Grid {
  int q_blocks, planes, split_from, pieces;
  float* records;  // per tail block, piece, consumer and warp: O / l and LSE (merge_pieces)
  int* counters;   // per tail block, consumer and warp: how many pieces are done
};

/// Block `block` of the grid: work item `item` (an index for longest_first), as piece `piece` of
/// `pieces` (a block before split_from is one whole piece); `tail` counts the split items.
struct Piece {
  int item, piece, pieces, tail;
  __device__ Piece(const Fp8Grid& grid, int block) {
    const int split = block - grid.split_from;
    pieces = split < 0 ? 1 : grid.pieces;
    tail = split < 0 ? 0 : split / pieces;
    piece = split < 0 ? 0 : split % pieces;
    item = split < 0 ? block : grid.split_from + tail;
  }
};

/// The K/V side of a block's work: its K/V head's plane, and this piece's share [tile0, tile0 +
/// n_tiles) of the K/V tiles that the block's rows [i0, i0 + block_m) see.
struct PieceTiles {
  int kv_plane, tile0, n_tiles;
  __device__ PieceTiles(const AttentionShape& shape, const Piece& work, int bh, int i0, int block_m) {
    kv_plane = (bh / shape.heads_q) * shape.heads_kv + shape.kv_head(bh % shape.heads_q);
    const int key_end = shape.causal ? shape.visible_keys(min(i0 + block_m, shape.seq_q) - 1) : shape.seq_kv;
    const int all_tiles = key_end > 0 ? (key_end + kBlockN - 1) / kBlockN : 0;
    tile0 = all_tiles * work.piece / work.pieces;
    n_tiles = all_tiles * (work.piece + 1) / work.pieces - tile0;
  }
};

//! [block_order]
/// The (Q block, plane) of work item `item`, the Q block counted from the end (the last Q block
/// of a plane first). Items start in the order of their index. Without the causal mask all
/// blocks are equally long: plane by plane, so that the blocks running at once share their
/// plane's K and V in L2. With it, a plane's last Q block is its longest: planes are taken 8 at
/// a time (their K and V still fit in L2 together), and within a group the longest Q blocks of
/// all 8 planes first, so that the grid ends on short blocks, not on a long one that started
/// late. (Variant 4 keeps plane by plane, the chapter's performance notes say why; variant 7,
/// whose blocks take items from a counter, takes this order.)
__device__ inline void longest_first(bool causal, int item, int q_blocks, int planes, int& q_block, int& bh) {
  if (!causal) {  // plane by plane
    q_block = q_blocks - 1 - item % q_blocks;
    bh = item / q_blocks;
    return;
  }
  constexpr int kGroup = 8;
  const int per_group = kGroup * q_blocks;
  const int group = item / per_group, in_group = item % per_group;
  const int group_planes = min(kGroup, planes - group * kGroup);
  bh = group * kGroup + in_group % group_planes;
  q_block = q_blocks - 1 - in_group / group_planes;
}
//! [block_order]

//! [merge_pieces]
/// The floats of one warp's record: its 16 rows of O / l (kD / 2 per lane) and their LSE (2 per
/// lane, log2 units).
template <int kD>
constexpr int kRecordFloats = (kD / 2 + 2) * 32;

/// The end of a split block, for one warp's 16 rows (l: each row's whole sum). Each piece stores
/// its O / l and LSE in its own record, then counts itself done; the warp that finds all the
/// other pieces done merges the records, in piece order so that the bits do not depend on which
/// piece came last:
///   LSE = log2(sum_p 2^LSE_p),  O = sum_p 2^(LSE_p - LSE) O_p.
/// records: this warp's record of piece 0 (piece p's is p * stride floats further).
template <int kD>
__device__ void merge_pieces(float (&out)[kD / 2], const float (&m)[2], const float (&l)[2], int piece, int pieces,
                             float* records, int64_t stride, int* counter, const AttentionShape& shape, int bh,
                             int row0, int t, __nv_bfloat16* o, float* lse) {
  const int lane = threadIdx.x % 32;
  float inv[2], lse_log2[2];
  row_totals(m, l, inv, lse_log2);
  float* mine = records + piece * stride;
#pragma unroll
  for (int c = 0; c < kD / 8; ++c)  // float4 c of every lane, side by side: 512 coalesced bytes
    reinterpret_cast<float4*>(mine)[c * 32 + lane] =
        make_float4(out[4 * c] * inv[0], out[4 * c + 1] * inv[0], out[4 * c + 2] * inv[1], out[4 * c + 3] * inv[1]);
  reinterpret_cast<float2*>(mine + kD / 2 * 32)[lane] = make_float2(lse_log2[0], lse_log2[1]);
  __threadfence();  // the record reaches L2 before the count says so
  __syncwarp();
  int done = 0;
  if (lane == 0) done = atomicAdd(counter, 1);
  if (__shfl_sync(0xFFFFFFFFu, done, 0) != pieces - 1) return;  // another piece merges
  __threadfence();
  float top[2] = {-INFINITY, -INFINITY};
  for (int p = 0; p < pieces; ++p) {
    const float2 x = __ldcg(reinterpret_cast<const float2*>(records + p * stride + kD / 2 * 32) + lane);
    top[0] = fmaxf(top[0], x.x);
    top[1] = fmaxf(top[1], x.y);
  }
  float sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) out[i] = 0.0f;
  for (int p = 0; p < pieces; ++p) {
    const float* rec = records + p * stride;
    const float2 x = __ldcg(reinterpret_cast<const float2*>(rec + kD / 2 * 32) + lane);
    const float w[2] = {top[0] == -INFINITY ? 0.0f : exp2f(x.x - top[0]),
                        top[1] == -INFINITY ? 0.0f : exp2f(x.y - top[1])};
    sum[0] += w[0];
    sum[1] += w[1];
#pragma unroll
    for (int c = 0; c < kD / 8; ++c) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(rec) + c * 32 + lane);
      out[4 * c] += w[0] * v.x;
      out[4 * c + 1] += w[0] * v.y;
      out[4 * c + 2] += w[1] * v.z;
      out[4 * c + 3] += w[1] * v.w;
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // the weights sum to >= 1 (the top piece's is 1), or 0 for a row with no keys
    inv[h] = sum[h] > 0.0f ? 1.0f / sum[h] : 0.0f;
    lse_log2[h] = top[h] == -INFINITY ? -INFINITY : top[h] + log2f(sum[h]);
  }
  store_output<kD>(out, inv, lse_log2, shape, bh, row0, t,
                   StridedRows<__nv_bfloat16>::packed(o, shape.heads_q, shape.seq_q, kD), lse);
}
//! [merge_pieces]

}  // namespace
}  // namespace fa::flash3
