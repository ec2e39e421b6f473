// Chapter 08 kernels: attention over a paged KV cache.
//
//   write_kv_cache_kernel  new tokens' K/V rows scattered into their slots (the slot mapping)
//   copy_blocks_kernel     the block manager's copy-on-write copies
//   paged_attention_kernel one thread block per (partition, K/V head, sequence x 16-row tile);
//                          variant 1 has one partition per sequence and writes O and LSE,
//                          variant 2 (split-KV, "flash-decoding") writes a partial O and LSE
//                          per partition, and merge_partitions_kernel combines them exactly.
//
// Inside a block: the 16 query rows are the (query token, query head) pairs of one K/V head's
// group, so GQA reads each K/V row once for all the heads that share it. The block's keys are
// cut into 16-key chunks dealt round-robin to 4 warps; each warp streams its own chunks
// through a private ring of shared memory with cp.async (no block-wide barrier in the loop),
// computes S = Q K^T and O += P V with mma.sync (chapter 05's wrappers), and keeps its own
// online-softmax state. At the end the 4 warps' states are merged through shared memory.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "../05_flash_attention_v2/mma_sync.cuh"
#include "cuda_check.h"
#include "device_utils.cuh"
#include "paged_kernels.h"
#include "registry.h"

namespace fa::paged {
namespace {

using flash2::cp_async_16;
using flash2::cp_async_commit;
using flash2::cp_async_wait;
using flash2::ldmatrix_x4;
using flash2::ldmatrix_x4_trans;
using flash2::Mma;

// ---- the cache write and the copy-on-write copies -------------------------------------------

/// One thread per 16-bit element: this kernel moves a few tokens per step, not the cache.
__global__ void write_kv_cache_kernel(const uint16_t* k_new, const uint16_t* v_new, const int64_t* slots, uint16_t* k_cache,
                                      uint16_t* v_cache, int64_t num_tokens, int heads_kv, int head_dim, int block_size) {
  const int64_t per_token = int64_t(heads_kv) * head_dim;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < num_tokens * per_token;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t token = e / per_token, slot = slots[token];
    if (slot < 0) continue;  // a padding token
    const int h = int(e % per_token / head_dim), x = int(e % head_dim);
    const int64_t block = slot / block_size, row = slot % block_size;
    const int64_t at = ((block * heads_kv + h) * block_size + row) * head_dim + x;
    k_cache[at] = k_new[e];
    v_cache[at] = v_new[e];
  }
}

__global__ void copy_blocks_kernel(const int* pairs, int n, uint4* k_cache, uint4* v_cache, int64_t block_vectors) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n * block_vectors; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t pair = e / block_vectors, i = e % block_vectors;
    const int64_t from = pairs[2 * pair] * block_vectors + i, to = pairs[2 * pair + 1] * block_vectors + i;
    k_cache[to] = k_cache[from];
    v_cache[to] = v_cache[from];
  }
}

// ---- decode ------------------------------------------------------------------------------

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 16;   // query rows per block: one mma M tile
constexpr int kChunk = 16;  // keys per warp step

template <int kD>
struct Layout {
  static constexpr int kRowBytes = kD * 2;               // one 16-bit row of Q, K or V
  static constexpr int kTileBytes = kChunk * kRowBytes;  // 16 rows
#ifndef FA_DECODE_STAGES128
#define FA_DECODE_STAGES128 3
#endif
  static constexpr int kStages = kD == 128 ? FA_DECODE_STAGES128 : 4;  // chunks in flight per warp, plus the one in use
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
  return uint32_t(r * Layout<kD>::kRowBytes + ((c ^ (r & 7)) << 4));
}

template <class T>
__device__ T from_float(float x);
template <>
__device__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

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
  using L = Layout<kD>;
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
        const int64_t row = ((int64_t(block) * a.heads_kv + kv_head) * block_size + (key & (block_size - 1))) * kD + c * 8;
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
      float top = fmaxf(fmaxf(s[0][2 * h], s[0][2 * h + 1]), fmaxf(s[1][2 * h], s[1][2 * h + 1]));
      top = fmaxf(top, __shfl_xor_sync(0xFFFFFFFFu, top, 1));
      top = fmaxf(top, __shfl_xor_sync(0xFFFFFFFFu, top, 2));
      const float m_new = fmaxf(m[h], top * a.scale_log2);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet: keep p = 0
      p_scale[h] = fast_exp2(m[h] - m_use);
      m[h] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int c = 2 * h; c < 2 * h + 2; ++c) {
          s[n][c] = fast_exp2(fmaf(s[n][c], a.scale_log2, -m_use));
          sum += s[n][c];
        }
      l[h] = l[h] * p_scale[h] + sum;
    }
#pragma unroll
    for (int n = 0; n < kD / 8; ++n) {
      o[n][0] *= p_scale[0], o[n][1] *= p_scale[0];
      o[n][2] *= p_scale[1], o[n][3] *= p_scale[1];
    }
    // P (C layout of the two 8-key tiles) is the A fragment of P V as it stands.
    const uint32_t p[4] = {Mma<T>::pack(s[0][0], s[0][1]), Mma<T>::pack(s[0][2], s[0][3]), Mma<T>::pack(s[1][0], s[1][1]),
                           Mma<T>::pack(s[1][2], s[1][3])};
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
  if constexpr (kSplit) allow_dependent_launch();

  // Merge the 4 warps: each posts its O, maxima and sums in its own ring...
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xFFFFFFFFu, l[h], 1);
    l[h] += __shfl_xor_sync(0xFFFFFFFFu, l[h], 2);
  }
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
    weights[kRows * kWarps + r] = total > 0.0f ? (top + log2f(total)) * 0.69314718055994531f : -INFINITY;
  }
  __syncthreads();
  // ... and every thread writes a share of O = sum_w weight_w O_w.
  for (int e = threadIdx.x; e < (last_row + 1) * kD; e += kThreads) {
    const int r = e / kD, c = e % kD;
    float value = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w)
      value += weights[r * kWarps + w] *
               reinterpret_cast<const float*>(smem + L::kTileBytes + w * L::kWarpRing)[r * kD + c];
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

//! [merge_partitions]
/// Variant 2's reduce: one warp per query row merges its sequence's partitions exactly,
/// LSE = log sum_p e^(LSE_p), O = sum_p e^(LSE_p - LSE) O_p (chapter 03's merge, done once).
template <class T, int kD>
__global__ void merge_partitions_kernel(const DecodeArgs a, int64_t rows) {
  const int64_t row = blockIdx.x * int64_t(kWarps) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  wait_for_prerequisite_grid();  // the partials of paged_attention_kernel, complete and visible
  if (row >= rows) return;
  const int seq = int(row / (int64_t(a.heads_q) * a.query_len));
  const int parts = (a.lens[seq] + a.partition_tokens - 1) / a.partition_tokens;
  const float* lse = a.part_lse + row * a.partitions;
  float top = -INFINITY;
  for (int p = lane; p < parts; p += 32) top = fmaxf(top, lse[p]);
  top = warp_all_reduce(top, MaxOp());
  float acc[kD / 32] = {}, total = 0.0f;
  if (top != -INFINITY) {
    for (int p = 0; p < parts; ++p) {
      const float w = lse[p] == -INFINITY ? 0.0f : __expf(lse[p] - top);
      total += w;
      const float* po = a.part_o + (row * a.partitions + p) * kD;
#pragma unroll
      for (int j = 0; j < kD / 32; ++j) acc[j] += w * po[lane + 32 * j];
    }
  }
  T* o = reinterpret_cast<T*>(a.o) + row * kD;
#pragma unroll
  for (int j = 0; j < kD / 32; ++j) o[lane + 32 * j] = from_float<T>(total > 0.0f ? acc[j] / total : 0.0f);
  if (lane == 0) a.lse[row] = total > 0.0f ? top + __logf(total) : -INFINITY;
}
//! [merge_partitions]

int sm_count() {
  const GpuInfo& gpu = detect_gpu();
  return gpu.available && gpu.multiprocessors > 0 ? gpu.multiprocessors : 132;
}

/// How many of variant 2's blocks fit on one SM at once (shared memory decides: 2 at d128, 3
/// at d64 on an H100), from the occupancy calculator; 2 without a GPU.
template <int kD>
int occupancy() {
  if (!detect_gpu().available) return 2;
  const auto kernel = paged_attention_kernel<__half, kD, true>;
  int n = 0;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Layout<kD>::kSmemBytes));
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, Layout<kD>::kSmemBytes));
  return std::max(n, 1);
}

int blocks_per_sm(int head_dim) {
  static const int d64 = occupancy<64>(), d128 = occupancy<128>();
  return head_dim == 64 ? d64 : d128;
}

std::size_t split_workspace_bytes(const DecodeShape& s) {
  const SplitPlan plan = split_plan(s, true);
  return std::size_t(s.lse_elems()) * plan.partitions * (s.head_dim + 1) * sizeof(float);
}

std::string decode_support(const DecodeShape& s, bool split) {
  if (s.head_dim != 64 && s.head_dim != 128) return "head_dim must be 64 or 128, got " + std::to_string(s.head_dim);
  const GpuInfo& gpu = detect_gpu();
  if (gpu.available && gpu.sm_major < 8)
    return "needs an sm_80 or newer GPU (mma.sync with bf16, cp.async), this one is sm_" + std::to_string(gpu.sm_major * 10 + gpu.sm_minor);
  const SplitPlan plan = split_plan(s, split);
  const int64_t z = int64_t(s.num_seqs) * plan.row_tiles;
  if (z > 65535) return "num_seqs x ceil(query_len x heads_q / heads_kv / 16) must be at most 65535, got " + std::to_string(z);
  if (s.heads_kv > 65535) return "heads_kv must be at most 65535, got " + std::to_string(s.heads_kv);
  return "";
}

template <class T, int kD, bool kSplit>
void launch_decode(const DecodeParams& p) {
  const DecodeShape& s = p.shape;
  const SplitPlan plan = split_plan(s, kSplit);
  DecodeArgs a{};
  a.q = static_cast<const uint16_t*>(p.q);
  a.k_cache = static_cast<const uint16_t*>(p.k_cache);
  a.v_cache = static_cast<const uint16_t*>(p.v_cache);
  a.tables = p.block_tables;
  a.lens = p.context_lens;
  a.o = static_cast<uint16_t*>(p.o);
  a.lse = p.lse;
  a.heads_q = s.heads_q;
  a.heads_kv = s.heads_kv;
  a.query_len = s.query_len;
  a.block_shift = 0;
  while ((1 << a.block_shift) < s.block_size) ++a.block_shift;
  a.max_blocks = s.max_blocks_per_seq;
  a.partition_tokens = plan.partition_tokens;
  a.partitions = plan.partitions;
  a.row_tiles = plan.row_tiles;
  a.scale_log2 = float(1.4426950408889634 / std::sqrt(double(s.head_dim)));
  if (kSplit) {
    a.part_o = static_cast<float*>(p.workspace);
    a.part_lse = a.part_o + s.lse_elems() * plan.partitions * s.head_dim;
  }
  constexpr int smem = Layout<kD>::kSmemBytes;
  static const bool opted_in = [] {  // more than the default 48 KB of shared memory, once per kernel
    CUDA_CHECK(cudaFuncSetAttribute(paged_attention_kernel<T, kD, kSplit>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)opted_in;
  const dim3 grid(plan.partitions, s.heads_kv, s.num_seqs * plan.row_tiles);
  paged_attention_kernel<T, kD, kSplit><<<grid, kThreads, smem, p.stream>>>(a);
  CUDA_CHECK_LAUNCH();
  if (kSplit) {
    const int64_t rows = s.lse_elems();
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(unsigned((rows + kWarps - 1) / kWarps));
    config.blockDim = dim3(kThreads);
    config.stream = p.stream;
#ifndef FA_DECODE_NO_PDL
    cudaLaunchAttribute early[1];
    early[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    early[0].val.programmaticStreamSerializationAllowed = 1;
    if (detect_gpu().sm_major >= 9) {  // Hopper and newer
      config.attrs = early;
      config.numAttrs = 1;
    }
#endif
    CUDA_CHECK(cudaLaunchKernelEx(&config, merge_partitions_kernel<T, kD>, a, rows));
    CUDA_CHECK_LAUNCH();
  }
}

template <class T, bool kSplit>
void launch_any_dim(const DecodeParams& p) {
  if (p.shape.head_dim == 64) launch_decode<T, 64, kSplit>(p);
  else launch_decode<T, 128, kSplit>(p);
}

DecodeKernel decode_kernel(DType dtype, bool split) {
  DecodeKernel k;
  const std::string type = dtype == DType::F16 ? "fp16" : "bf16";
  k.name = std::string(split ? "ch08_split_kv_" : "ch08_block_table_") + type;
  k.chapter = 8;
  k.number = split ? 2 : 1;
  k.variant = split ? "split_kv" : "block_table";
  k.dtype = dtype;
  k.summary = split ? "split-KV (flash-decoding): partitions of the context in parallel, then an exact LSE merge"
                    : "one thread block per (sequence, K/V head) walks the block table; GQA heads share each K/V read";
  if (dtype == DType::F16) k.launch = split ? launch_any_dim<__half, true> : launch_any_dim<__half, false>;
  else k.launch = split ? launch_any_dim<__nv_bfloat16, true> : launch_any_dim<__nv_bfloat16, false>;
  k.supports = [split](const DecodeShape& s) { return decode_support(s, split); };
  if (split) k.workspace_bytes = split_workspace_bytes;
  return k;
}

FA_REGISTER_DECODE_KERNEL(decode_kernel(DType::F16, false));
FA_REGISTER_DECODE_KERNEL(decode_kernel(DType::BF16, false));
FA_REGISTER_DECODE_KERNEL(decode_kernel(DType::F16, true));
FA_REGISTER_DECODE_KERNEL(decode_kernel(DType::BF16, true));

}  // namespace

//! [split_plan]
SplitPlan search_split_plan(const DecodeShape& s, bool split) {
  SplitPlan plan;
  const int64_t rows = int64_t(s.group_size()) * s.query_len;
  plan.row_tiles = int((rows + kRows - 1) / kRows);
  const int context = std::max(s.max_context, 1);
  plan.partition_tokens = (context + kChunk - 1) / kChunk * kChunk;
  plan.partitions = 1;
  if (!split) return plan;
  // Blocks run in waves of `slots` (SMs x blocks per SM); a wave lasts about as long as one
  // block's partition. So the time goes as waves x partition length, plus a fixed cost per
  // block (Q, the merge, the partial O written and read back) worth about kBlockCost keys.
  // Pick the partition count that minimizes it: 8 sequences x 8 K/V heads on 132 SMs get 4
  // partitions (256 blocks, one wave), not 9 (576 blocks, 2.2 waves, the last one mostly idle).
#ifndef FA_DECODE_BLOCK_COST
#define FA_DECODE_BLOCK_COST 64
#endif
  constexpr int64_t kBlockCost = FA_DECODE_BLOCK_COST;
  const int64_t blocks = int64_t(s.num_seqs) * s.heads_kv * plan.row_tiles;  // per partition
  const int64_t slots = int64_t(sm_count()) * blocks_per_sm(s.head_dim);
  int64_t best_cost = INT64_MAX;
  for (int64_t parts = 1; parts <= (context + kChunk - 1) / kChunk; ++parts) {
    const int64_t tokens = ((context + parts - 1) / parts + kChunk - 1) / kChunk * kChunk;
    const int64_t actual = (context + tokens - 1) / tokens;
    const int64_t cost = (blocks * actual + slots - 1) / slots * (tokens + kBlockCost);
    if (cost < best_cost) {
      best_cost = cost;
      plan.partition_tokens = int(tokens);
      plan.partitions = int(actual);
    }
  }
  return plan;
}
//! [split_plan]

// The search above loops over up to context / 16 partition counts (2048 at 32k tokens), and
// every launch needs the plan; done inside the timed launch it would be host time the GPU
// waits through. So the last answer is kept per thread and reused while the inputs repeat.
SplitPlan split_plan(const DecodeShape& s, bool split) {
  struct Key {
    int seqs, heads_q, heads_kv, dim, query_len, context;
    bool split;
    bool operator==(const Key& o) const {
      return seqs == o.seqs && heads_q == o.heads_q && heads_kv == o.heads_kv && dim == o.dim && query_len == o.query_len &&
             context == o.context && split == o.split;
    }
  };
  thread_local Key last{-1, 0, 0, 0, 0, 0, false};
  thread_local SplitPlan last_plan;
  const Key key{s.num_seqs, s.heads_q, s.heads_kv, s.head_dim, s.query_len, s.max_context, split};
  if (!(key == last)) {
    last_plan = search_split_plan(s, split);
    last = key;
  }
  return last_plan;
}

void launch_write_kv_cache(const DecodeShape& cache, const void* k_new, const void* v_new, const int64_t* slots,
                           int num_tokens, void* k_cache, void* v_cache, cudaStream_t stream) {
  cache.validate();
  if (num_tokens < 0) throw std::invalid_argument("num_tokens must be >= 0, got " + std::to_string(num_tokens));
  if (num_tokens == 0) return;
  const int64_t elems = int64_t(num_tokens) * cache.heads_kv * cache.head_dim;
  const int grid = int(std::min<int64_t>((elems + 255) / 256, 4096));
  write_kv_cache_kernel<<<grid, 256, 0, stream>>>(static_cast<const uint16_t*>(k_new), static_cast<const uint16_t*>(v_new), slots,
                                                  static_cast<uint16_t*>(k_cache), static_cast<uint16_t*>(v_cache), num_tokens,
                                                  cache.heads_kv, cache.head_dim, cache.block_size);
  CUDA_CHECK_LAUNCH();
}

void launch_copy_blocks(const DecodeShape& cache, const int* pairs, int n, void* k_cache, void* v_cache, cudaStream_t stream) {
  cache.validate();
  const int64_t block_bytes = int64_t(cache.heads_kv) * cache.block_size * cache.head_dim * 2;
  if (block_bytes % 16 != 0)
    throw std::invalid_argument("copy_blocks needs a block of a multiple of 16 bytes, got " + std::to_string(block_bytes));
  if (n <= 0) return;
  const int64_t vectors = int64_t(n) * (block_bytes / 16);
  const int grid = int(std::min<int64_t>((vectors + 255) / 256, 4096));
  copy_blocks_kernel<<<grid, 256, 0, stream>>>(pairs, n, static_cast<uint4*>(k_cache), static_cast<uint4*>(v_cache), block_bytes / 16);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fa::paged
