// The pieces of chapter 07's fused Hopper backward (variants 5 and 6, backward_fused_sm90a.cu)
// that a kernel of the same shape reuses (chapter 09's Hopper backward): the Q tile's rows per
// head_dim, the dS^T tile in shared memory and its stmatrix store, the dQ product read from it,
// where the fp32 dQ sits in the workspace, the bulk way's dQ parts (added, placed and rounded).
// Include it only from *_sm90a.cu files.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "hopper.cuh"
#include "strides.h"
#include "wgmma_backward.cuh"

namespace fa::backward::sm90 {

/// Query rows per Q tile: 128 at head_dim 64, where S^T and dP^T then run as 64 x 128 products
/// per consumer (n = 128 wgmma read less shared memory per FLOP than n = 64) and the registers
/// allow it; 64 at 96 and 128, as in variant 4.
template <int kD>
constexpr int kRowsOf = kD == 64 ? 128 : 64;
/// One dS^T buffer: the block's 128 keys x kRows rows, bf16, as kRows / 64 boxes of 64 rows.
template <int kD>
constexpr int kDsBytes = tile_bytes<64>(kKvKeys) * (kRowsOf<kD> / 64);
/// A box of the block's 128 keys by 64 columns (of K, or of rows in dS^T): 16 KiB.
constexpr int kKeyBoxBytes = kKvKeys * kBoxRowBytes;

/// How the consumers split dQ_i = dS K (kRows x head_dim, over 128 keys): with 128-row tiles
/// each takes 64 rows and every column; with 64-row tiles, all rows and half the columns.
template <int kD>
struct DqSplit {
  static constexpr bool kByRows = kRowsOf<kD> == 128;
  static constexpr int kCols = kByRows ? kPaddedDim<kD> : kPaddedDim<kD> / 2;  // columns per consumer
};

/// How dQ reaches global memory. kAtomics: each consumer thread adds its 32 floats of dQ_i into
/// the row-major fp32 dQ with 16 two-float atomics per tile. kBulk: each consumer writes its
/// 64 x 64 part into shared memory, in fragment order (float4 n of thread x at n * 128 + x),
/// and one thread hands the 16 KiB to the TMA unit as one bulk reduction into an fp32 dQ kept
/// in the same fragment order, part by part; the rounding kernel puts the rows back in order.
enum class DqPath { kAtomics, kBulk };
/// One consumer's dQ part: 64 x 64 floats, 16 KiB.
constexpr int kDqPartFloats = 64 * 64, kDqPartBytes = kDqPartFloats * 4;
/// Shared memory a kernel adds after K, V and the ring: two dS^T buffers, and with kBulk one dQ
/// part per consumer.
template <int kD, DqPath kPath>
constexpr int kExtraOf = 2 * kDsBytes<kD> + (kPath == DqPath::kBulk ? kConsumers * kDqPartBytes : 0);

//! [fused_store_ds]
/// Stores this warp's 16 keys of dS^T (all kRows rows), held as the A fragments of dK += dS^T Q,
/// into the block's dS^T tile: [128 keys][64 rows] boxes, rows of 128 bytes with the 128-byte
/// swizzle (the layout TMA writes). Register a[kk][i], across the warp, is an 8 x 8 matrix: keys
/// key0 + 8 (i & 1) onwards, rows 16 kk + 8 (i >> 1) onwards, the layout stmatrix takes; lane
/// 8 i + k gives the address of its key k.
template <int kRows>
__device__ inline void store_ds_t(unsigned char* ds_tile, const uint32_t (&a)[kRows / 16][4], int key0, int lane) {
  const int i = lane / 8, key = key0 + lane % 8 + 8 * (i & 1);
#pragma unroll
  for (int kk = 0; kk < kRows / 16; ++kk) {
    const int chunk = (2 * (kk % 4) + (i >> 1)) ^ (key % 8);  // 16-byte chunk of the row, swizzled
    stmatrix_x4(smem_addr(ds_tile + (kk / 4) * kKeyBoxBytes + key * kBoxRowBytes + chunk * 16), a[kk]);
  }
}
//! [fused_store_ds]

//! [fused_issue_dq]
/// Issues consumer c's part of dQ_i = dS K over the block's 128 keys, without committing. A = dS,
/// read from the dS^T tile as an MN-major operand (the rows contiguous): box c (rows 64 c ..)
/// when split by rows, box 0 otherwise. B = the K tile, MN-major as in issue_a_regs_b, from
/// column c kCols on when split by columns. ds_lo and k_lo: the descriptors' low words of the
/// two tiles (desc_lo with leading kKeyBoxBytes, the distance between their boxes).
template <int kD>
__device__ inline void issue_dq(float (&acc)[DqSplit<kD>::kCols / 2], uint32_t ds_lo, uint32_t k_lo, int c) {
  using Split = DqSplit<kD>;
  static_assert(Split::kCols == 64, "the n = 64 wgmma");
  const uint32_t ds_rows = ds_lo + (Split::kByRows ? c * kKeyBoxBytes / 16 : 0);
  const uint32_t k_cols = k_lo + (Split::kByRows ? 0 : c * kKeyBoxBytes / 16);  // box c of K
#pragma unroll
  for (int kk = 0; kk < kKvKeys / 16; ++kk) {
    const uint64_t a = desc_join(ds_rows + kk * 16 * kBoxRowBytes / 16, kDescHi);
    const uint64_t b = desc_join(k_cols + kk * 16 * kBoxRowBytes / 16, kDescHi);
    wgmma_m64n64k16_ss<1, 1>(acc, a, b, kk > 0);
  }
}
//! [fused_issue_dq]

/// The fp32 dQ sits in the workspace after D, from a 16-byte boundary (the atomics add float2,
/// the bulk reductions whole 16 KiB parts).
inline std::size_t dq32_offset(const AttentionShape& s) { return (std::size_t(s.lse_elems()) + 3) / 4 * 4; }

/// Where float4 `within` of consumer c's dQ part (fragment order: float4 n of consumer thread x
/// at n * 128 + x) belongs in dQ_i: rows r = 16 (x / 32) + (x % 32) / 4 (and r + 8) of the Q
/// tile, columns col (and col + 1), as the thread held them in dq_acc[4 n .. 4 n + 3].
struct PartPlace {
  int row, col;
};
template <int kD>
__host__ __device__ inline PartPlace part_place(int within, int c) {
  const int n = within / 128, x = within % 128;
  const int r = 16 * (x / 32) + (x % 32) / 4, col8 = 8 * n + 2 * (x % 4);
  const bool by_rows = DqSplit<kD>::kByRows;
  return {(by_rows ? 64 * c : 0) + r, (by_rows ? 0 : 64 * c) + col8};
}

//! [bulk_dq]
/// The bulk way's dQ step for consumer c: dQ_i (this thread's dq_acc) into the consumer's part in
/// shared memory, float4 n of this thread at n * 128 + wg_tid (a warp's stores fill 512
/// consecutive bytes), then one bulk reduction adds the part to part (plane, Q tile, c) of dQ32.
/// The scale is applied once, to the sum, by the rounding kernel. kBarrier and kBarrier + 1: the
/// named barriers of consumers 0 and 1 (literal ids: ptxas counts the barriers a kernel uses).
template <int kD, int kBarrier>
__device__ inline void add_dq_part(const float (&dq_acc)[DqSplit<kD>::kCols / 2], float* part_s, float* dq32,
                                   int64_t plane, int q_tiles, int tile, int c, int wg_tid) {
  float4* part = reinterpret_cast<float4*>(part_s);
#pragma unroll
  for (int n = 0; n < DqSplit<kD>::kCols / 8; ++n)
    part[n * 128 + wg_tid] = make_float4(dq_acc[4 * n], dq_acc[4 * n + 1], dq_acc[4 * n + 2], dq_acc[4 * n + 3]);
  fence_proxy_async_shared();
  if (c == 0) named_barrier_sync<128>(kBarrier);
  else named_barrier_sync<128>(kBarrier + 1);
  if (wg_tid == 0) {
    const int64_t part_index = (plane * q_tiles + tile) * kConsumers + c;
    bulk_reduce_add_f32(dq32 + part_index * kDqPartFloats, part_s, kDqPartBytes);
    bulk_commit();
  }
}
//! [bulk_dq]

/// Floats of the fp32 dQ: the row-major dQ for kAtomics; for kBulk, whole parts of every Q tile
/// (two per tile of 128 x 64 or 64 x 128, rows past seq_q included).
inline std::size_t dq32_floats(const AttentionShape& s, DqPath path) {
  if (path == DqPath::kAtomics) return std::size_t(s.q_elems());
  static_assert(kRowsOf<64> == 128 && kRowsOf<96> == 64 && kRowsOf<128> == 64, "the rule below is kRowsOf's");
  const int rows = s.head_dim == 64 ? 128 : 64;
  const std::size_t q_tiles = std::size_t((s.seq_q + rows - 1) / rows);
  return std::size_t(s.batch) * s.heads_q * q_tiles * kConsumers * kDqPartFloats;
}

//! [fused_round_parts]
/// dQ = scale * the bulk way's fp32 sum (bf16, row-major), one thread per float4 of a part:
/// float4 n of consumer thread x holds dQ_i's rows r = 16 (x / 32) + (x % 32) / 4 (and r + 8) at
/// columns 8 n + 2 (x % 4) (and + 1) of the part, as in the atomics of kAtomics.
template <int kD>
__global__ void round_dq_parts_kernel(const float4* dq32, StridedRows<__nv_bfloat16> dq, int seq_q, int q_tiles,
                                      int64_t n4, float scale) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n4) return;
  float4 v = dq32[i];
  v = make_float4(v.x * scale, v.y * scale, v.z * scale, v.w * scale);
  const int64_t part = i / (kDqPartFloats / 4);
  const int c = int(part % kConsumers), tile = int(part / kConsumers % q_tiles);
  const int64_t bh = part / kConsumers / q_tiles;
  const PartPlace at_part = part_place<kD>(int(i % (kDqPartFloats / 4)), c);
  const int row = tile * kRowsOf<kD> + at_part.row, col = at_part.col;
  if (col >= kD) return;  // head_dim 96's padding columns
  __nv_bfloat16* head = dq.head_start(int(bh));
  const int64_t at = int64_t(row) * dq.strides.row + col, step = 8 * dq.strides.row;
  if (row < seq_q) *reinterpret_cast<__nv_bfloat162*>(head + at) = __floats2bfloat162_rn(v.x, v.y);
  if (row + 8 < seq_q) *reinterpret_cast<__nv_bfloat162*>(head + at + step) = __floats2bfloat162_rn(v.z, v.w);
}
//! [fused_round_parts]

}  // namespace fa::backward::sm90
