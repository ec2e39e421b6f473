// Chapter 08's decode kernel: attention of a few query rows per sequence over a paged KV cache.
// Variant 1 (`block_table`) runs it with one partition per sequence and writes O and LSE;
// variant 2 (`split_kv`, flash-decoding) cuts each context into partitions and writes a
// normalized partial O and LSE per partition, which merge_partitions_kernel (paged_attention.cu)
// combines exactly. What changes from chapter 05: K and V are gathered row by row through the
// block table instead of read as contiguous tiles, and the block's rows are one K/V head's
// query heads, so the tensor cores still get a full M tile at one query token.
//
// Tiling: one block (4 warps) per (partition, K/V head, sequence x 16-row tile). The 16 query
// rows are the (query token, query head) pairs of one K/V head's group, so GQA reads each K/V row
// once for all the heads that share it. The block's keys are cut into 16-key chunks dealt
// round-robin to the 4 warps; each warp streams its own chunks through a private ring of shared
// memory with cp.async (no block-wide barrier in the loop), computes S = Q K^T and O += P V with
// mma.sync (common/ampere.cuh), and keeps its own online-softmax state. At the end the 4 warps'
// states are merged through shared memory.
// Run: build/bin/ch08_paged_attention --variant block_table   (or --variant split_kv)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "ampere.cuh"
#include "device_utils.cuh"
#include "log2_units.h"
#include "online_softmax.cuh"

namespace fa::paged {

using ampere::cp_async_16;
using ampere::cp_async_commit;
using ampere::cp_async_wait;
using ampere::ldmatrix_x4;
using ampere::ldmatrix_x4_trans;
using ampere::Mma;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 16;   // query rows per block: one mma M tile
constexpr int kChunk = 16;  // keys per warp step

/// The block's shared memory: the Q tile, then each warp's ring of K/V chunk stages.
template <int kD>
struct DecodeLayout {
  static constexpr int kRowBytes = kD * 2;               // one 16-bit row of Q, K or V
  static constexpr int kTileBytes = kChunk * kRowBytes;  // 16 rows
  // Chunks in flight per warp, plus the one in use. A stage at head_dim 128 is twice the bytes:
  // 3 stages keep the block at 100 KB, so two blocks share an H100 SM (4 would leave one).
  static constexpr int kStages = kD == 128 ? 3 : 4;
  static constexpr int kWarpRing = kStages * 2 * kTileBytes;
  static constexpr int kSmemBytes = kTileBytes + kWarps * kWarpRing;  // Q tile, then each warp's ring
  // After the loop each warp's ring holds its O (16 x kD floats), row maxima and sums.
  static_assert(kRows * kD * 4 + 2 * kRows * 4 <= kWarpRing, "a warp's merge data must fit its ring");
};

/// Byte offset of 16-byte chunk `c` of row `r` in a tile of kD-element rows: the chunk index is
/// XOR-ed with r % 8, so the 8 rows an ldmatrix reads at one column sit in 8 different banks
/// (and so do the cp.async writes of one row's chunks).
template <int kD>
__device__ __forceinline__ uint32_t swizzled(int r, int c) {
  return uint32_t(r * DecodeLayout<kD>::kRowBytes + ((c ^ (r & 7)) << 4));
}

template <class T>
__device__ T from_float(float x);
template <>
__device__ inline __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

/// Programmatic dependent launch (sm_90+): a kernel launched with the programmatic-stream-
/// serialization attribute may start before the kernel ahead of it in the stream has finished,
/// once every block of that kernel has called allow_dependent_launch() or exited; it must call
/// wait_for_prerequisite_grid() before touching that kernel's output. Both are no-ops on older
/// GPUs and without the attribute. Here it hides the merge kernel's launch behind variant 2's tail.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_prerequisite_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

struct DecodeArgs {
  const uint16_t* q;
  const uint16_t* k_cache;
  const uint16_t* v_cache;
  const int* tables;
  const int* lens;
  uint16_t* o;
  float* lse;
  float* part_o;    // variant 2: [row][partition][kD], row = (seq * heads_q + head) * query_len + token
  float* part_lse;  // [row][partition]
  int heads_q, heads_kv, query_len, block_shift, max_blocks, partition_tokens, partitions, row_tiles;
  float scale_log2;  // softmax scale * log2(e): scores go straight to exp2
};

//! [paged_attention_kernel]
template <class T, int kD, bool kSplit>
__global__ void __launch_bounds__(kThreads) paged_attention_kernel(const DecodeArgs a) {
  using L = DecodeLayout<kD>;
  extern __shared__ __align__(128) unsigned char smem[];
  const int part = blockIdx.x, kv_head = blockIdx.y;
  const int seq = blockIdx.z / a.row_tiles, tile = blockIdx.z % a.row_tiles;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int group = a.heads_q / a.heads_kv, rows_total = group * a.query_len;
  const int ctx = a.lens[seq];
  const int first_row = tile * kRows;
  // Query row r of this block: token (first_row + r) / group of the chunk, head kv_head * group + ...
  auto row_index = [&](int r) {  // into Q, O ([seq][head][token]) and LSE
    const int gr = first_row + r, token = gr / group, head = kv_head * group + gr % group;
    return (int64_t(seq) * a.heads_q + head) * a.query_len + token;
  };
  // Row r sees keys [0, visible(r)): the cache holds the query tokens' own K/V, and token i of
  // the chunk sits at position ctx - query_len + i (causal, bottom-right).
  auto visible = [&](int r) {
    const int token = (first_row + r) / group;
    return max(0, min(ctx, ctx - a.query_len + token + 1));
  };
  const int last_row = min(kRows, rows_total - first_row) - 1;
  const int key_begin = part * a.partition_tokens;
  if (kSplit && key_begin >= ctx) return;  // no such partition for this sequence (the merge reads none)
  const int key_end = min(min(ctx, key_begin + a.partition_tokens), visible(last_row));

  // The Q tile (rows past the last are zeros), then each warp's A fragments in registers.
  unsigned char* q_tile = smem;
  for (int e = threadIdx.x; e < kRows * (kD / 8); e += kThreads) {
    const int r = e / (kD / 8), c = e % (kD / 8);
    uint4 value = make_uint4(0, 0, 0, 0);
    if (r <= last_row) value = *reinterpret_cast<const uint4*>(a.q + row_index(r) * kD + c * 8);
    *reinterpret_cast<uint4*>(q_tile + swizzled<kD>(r, c)) = value;
  }
  __syncthreads();
  uint32_t qf[kD / 16][4];
  const uint32_t q_base = static_cast<uint32_t>(__cvta_generic_to_shared(q_tile));
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks)  // matrices: rows 0-7 / 8-15 x dims 0-7 / 8-15 of the k-step
    ldmatrix_x4(qf[ks], q_base + swizzled<kD>((lane / 8 % 2) * 8 + lane % 8, ks * 2 + lane / 16));

  // This warp's chunks: numbers warp, warp + 4, ... of the block's range.
  unsigned char* ring = smem + L::kTileBytes + warp * L::kWarpRing;
  const uint32_t ring_base = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
  const int chunks = key_end > key_begin ? (key_end - key_begin + kChunk - 1) / kChunk : 0;
  const int my_chunks = chunks > warp ? (chunks - warp + kWarps - 1) / kWarps : 0;
  const int block_size = 1 << a.block_shift;
  const int* table = a.tables + int64_t(seq) * a.max_blocks;
  //! [paged_gather]
  // Chunk i of this warp: its 16 K rows and 16 V rows into ring stage i % kStages. Lane l looks
  // up the physical block of key l % 16 once; each copy asks that lane for its row's block.
  auto issue = [&](int i) {
    if (i < my_chunks) {
      const int k0 = key_begin + (warp + i * kWarps) * kChunk;
      const int my_key = k0 + lane % 16;
      const int my_block = my_key < key_end ? table[my_key >> a.block_shift] : 0;
      unsigned char* stage = ring + (i % L::kStages) * 2 * L::kTileBytes;
#pragma unroll
      for (int e = lane; e < kChunk * (kD / 8); e += 32) {
        const int r = e / (kD / 8), c = e % (kD / 8), key = k0 + r;
        const int block = __shfl_sync(0xFFFFFFFFu, my_block, r);
        const bool valid = key < key_end;  // past the end: zeros, and no read of the table or cache
        const int64_t row =
            ((int64_t(block) * a.heads_kv + kv_head) * block_size + (key & (block_size - 1))) * kD + c * 8;
        cp_async_16(stage + swizzled<kD>(r, c), a.k_cache + (valid ? row : 0), valid);
        cp_async_16(stage + L::kTileBytes + swizzled<kD>(r, c), a.v_cache + (valid ? row : 0), valid);
      }
    }
    cp_async_commit();  // empty groups too, so wait_group counts the same in every iteration
  };
  //! [paged_gather]
  // Where the causal boundary can cut a chunk: from the first row's limit on.
  const int first_limit = visible(0);
  const int limit_g = visible(min(g, last_row)), limit_g8 = visible(min(g + 8, last_row));

  float o[kD / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g and g + 8, log2 units
#pragma unroll
  for (int i = 0; i < L::kStages - 1; ++i) issue(i);
  for (int i = 0; i < my_chunks; ++i) {
    issue(i + L::kStages - 1);  // into the stage chunk i - 1 used
    cp_async_wait<L::kStages - 1>();
    __syncwarp();
    const int k0 = key_begin + (warp + i * kWarps) * kChunk;
    const uint32_t k_tile = ring_base + (i % L::kStages) * 2 * L::kTileBytes, v_tile = k_tile + L::kTileBytes;
    float s[2][4] = {};
#pragma unroll
    for (int ks = 0; ks < kD / 16; ++ks) {  // matrices: keys 0-7 / 8-15 x dims 0-7 / 8-15
      uint32_t b[4];
      ldmatrix_x4(b, k_tile + swizzled<kD>((lane / 16) * 8 + lane % 8, ks * 2 + lane / 8 % 2));
      Mma<T>::run(s[0], qf[ks], b[0], b[1]);
      Mma<T>::run(s[1], qf[ks], b[2], b[3]);
    }
    if (k0 + kChunk > first_limit) {  // the chunk reaches past some row's last visible key
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int c = 0; c < 4; ++c)
          if (k0 + n * 8 + 2 * t + (c & 1) >= (c < 2 ? limit_g : limit_g8)) s[n][c] = -INFINITY;
    }
    // Online softmax, rows g (c = 0, 1) and g + 8 (c = 2, 3); a row's 16 scores sit in 4 lanes.
    float p_scale[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      auto row = [&](int j) -> float& { return s[j / 2][2 * h + j % 2]; };  // row h's 4 scores in this thread
      p_scale[h] = online_softmax_row<4, true>(row, m[h], l[h], a.scale_log2);
    }
#pragma unroll
    for (int n = 0; n < kD / 8; ++n) {
      o[n][0] *= p_scale[0], o[n][1] *= p_scale[0];
      o[n][2] *= p_scale[1], o[n][3] *= p_scale[1];
    }
    // P (C layout of the two 8-key tiles) is the A fragment of P V as it stands.
    const uint32_t p[4] = {Mma<T>::pack(s[0][0], s[0][1]), Mma<T>::pack(s[0][2], s[0][3]),
                           Mma<T>::pack(s[1][0], s[1][1]), Mma<T>::pack(s[1][2], s[1][3])};
#pragma unroll
    for (int n2 = 0; n2 < kD / 16; ++n2) {  // matrices: keys 0-7 / 8-15 x dims 16 n2 + 0-7 / 8-15, transposed
      uint32_t b[4];
      ldmatrix_x4_trans(b, v_tile + swizzled<kD>((lane / 8 % 2) * 8 + lane % 8, n2 * 2 + lane / 16));
      Mma<T>::run(o[2 * n2], p, b[0], b[1]);
      Mma<T>::run(o[2 * n2 + 1], p, b[2], b[3]);
    }
    __syncwarp();  // every lane is done with this stage before the next issue refills it
  }
  cp_async_wait<0>();
  // Variant 2's merge kernel may start launching now (programmatic dependent launch, sm_90):
  // it waits in griddepcontrol.wait until this grid has finished and its writes are visible.
  if constexpr (kSplit) {
    allow_dependent_launch();
  }

  // Merge the 4 warps: each posts its O, maxima and sums in its own ring...
#pragma unroll
  for (int h = 0; h < 2; ++h) l[h] = quad_sum(l[h]);
  __syncthreads();  // (rings are private, but the Q tile region is reused below)
  float* post = reinterpret_cast<float*>(ring);
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) {
    *reinterpret_cast<float2*>(post + g * kD + n * 8 + 2 * t) = make_float2(o[n][0], o[n][1]);
    *reinterpret_cast<float2*>(post + (g + 8) * kD + n * 8 + 2 * t) = make_float2(o[n][2], o[n][3]);
  }
  if (t == 0) {
    post[kRows * kD + g] = m[0], post[kRows * kD + g + 8] = m[1];
    post[kRows * kD + kRows + g] = l[0], post[kRows * kD + kRows + g + 8] = l[1];
  }
  __syncthreads();
  // ... then one thread per row weighs them (weights[r][w] = e^(m_w - M) / L) ...
  float* weights = reinterpret_cast<float*>(smem);  // over the Q tile: [kRows][kWarps], then LSE [kRows]
  if (threadIdx.x < kRows) {
    const int r = threadIdx.x;
    float top = -INFINITY, total = 0.0f, f[kWarps];
#pragma unroll
    for (int w = 0; w < kWarps; ++w)
      top = fmaxf(top, reinterpret_cast<const float*>(smem + L::kTileBytes + w * L::kWarpRing)[kRows * kD + r]);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float* other = reinterpret_cast<const float*>(smem + L::kTileBytes + w * L::kWarpRing);
      f[w] = other[kRows * kD + r] == -INFINITY ? 0.0f : fast_exp2(other[kRows * kD + r] - top);
      total += f[w] * other[kRows * kD + kRows + r];
    }
#pragma unroll
    for (int w = 0; w < kWarps; ++w) weights[r * kWarps + w] = total > 0.0f ? f[w] / total : 0.0f;
    // Natural-log LSE; -inf for a row that saw no key.
    weights[kRows * kWarps + r] = total > 0.0f ? (top + log2f(total)) * kLn2 : -INFINITY;
  }
  __syncthreads();
  // ... and every thread writes a share of O = sum_w weight_w O_w.
  for (int e = threadIdx.x; e < (last_row + 1) * kD; e += kThreads) {
    const int r = e / kD, c = e % kD;
    float value = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w)
      value +=
          weights[r * kWarps + w] * reinterpret_cast<const float*>(smem + L::kTileBytes + w * L::kWarpRing)[r * kD + c];
    if constexpr (kSplit) {
      a.part_o[(row_index(r) * a.partitions + part) * kD + c] = value;
    } else {
      reinterpret_cast<T*>(a.o)[row_index(r) * kD + c] = from_float<T>(value);
    }
  }
  if (threadIdx.x <= last_row) {
    const float lse = weights[kRows * kWarps + threadIdx.x];
    if constexpr (kSplit) a.part_lse[row_index(threadIdx.x) * a.partitions + part] = lse;
    else a.lse[row_index(threadIdx.x)] = lse;
  }
}
//! [paged_attention_kernel]

}  // namespace fa::paged
