// Chapter 08's decode kernels as registered variants: the launchers, variant 2's split plan
// and its merge kernel. The decode kernel itself is in decode_kernel.cuh, the cache writes in
// kv_cache_write.cu.
//
//   variant 1, block_table  one partition per sequence: paged_attention_kernel writes O and LSE
//   variant 2, split_kv     flash-decoding: the context cut into partitions (split_plan picks
//                           how many), one block each writing a partial O and LSE, then
//                           merge_partitions_kernel combines them exactly, one warp per row
// Run: build/bin/ch08_paged_attention --variant split_kv   (or --variant block_table)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "cuda_check.h"
#include "decode_kernel.cuh"
#include "device_utils.cuh"
#include "log2_units.h"
#include "not_implemented.h"
#include "paged_kernels.h"
#include "registry.h"
#include "static_switch.h"

namespace fa::paged {
namespace {

/// What the merge reads and writes, and nothing else: the partitions' O and LSE, the context
/// lengths that say how many partitions a row has, and the outputs (no query, no cache).
struct MergeArgs {
  const int* lens;
  const float* part_o;    // [row][partition][kD]
  const float* part_lse;  // [row][partition]
  uint16_t* o;
  float* lse;
  int heads_q, query_len, partition_tokens, partitions;
};

//! [merge_partitions]
/// Variant 2's reduce: one warp per query row merges its sequence's partitions exactly,
/// LSE = log sum_p e^(LSE_p), O = sum_p e^(LSE_p - LSE) O_p (chapter 03's merge, done once).
template <class T, int kD>
__global__ void merge_partitions_kernel(const MergeArgs a, int64_t rows) {
  const int64_t row = blockIdx.x * int64_t(kWarps) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  wait_for_prerequisite_grid();  // the partials of paged_attention_kernel, complete and visible
  // BEGIN SOLUTION ch08_merge (device): warp `row` (rows of a.lse, 32 lanes) merges its sequence's parts = ceil(a.lens[seq] / a.partition_tokens) partitions, seq = row / (a.heads_q * a.query_len): part LSEs at a.part_lse + row * a.partitions, part O rows (kD floats) at a.part_o + (row * a.partitions + p) * kD; top = max LSE_p over the warp, w_p = e^(LSE_p - top) (0 for -inf), O = sum w_p O_p / sum w_p written as T to a.o + row * kD, a.lse[row] = top + log(sum w_p); an empty row: O = 0, LSE = -inf
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
  // END SOLUTION
}
//! [merge_partitions]

// ---- variant 2's split plan -------------------------------------------------------------

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
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, DecodeLayout<kD>::kSmemBytes));
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, DecodeLayout<kD>::kSmemBytes));
  return std::max(n, 1);
}

int blocks_per_sm(int head_dim) {
  static const int d64 = occupancy<64>(), d128 = occupancy<128>();
  return head_dim == 64 ? d64 : d128;
}

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
  constexpr int64_t kBlockCost = 64;
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

}  // namespace

// The search above loops over up to context / 16 partition counts (2048 at 32k tokens), and
// every launch needs the plan; done inside the timed launch it would be host time the GPU
// waits through. So the last answer is kept per thread and reused while the inputs repeat.
SplitPlan split_plan(const DecodeShape& s, bool split) {
  struct Key {
    int seqs, heads_q, heads_kv, dim, query_len, context;
    bool split;
    bool operator==(const Key& o) const {
      return seqs == o.seqs && heads_q == o.heads_q && heads_kv == o.heads_kv && dim == o.dim &&
             query_len == o.query_len && context == o.context && split == o.split;
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

namespace {

// ---- the launchers and the registrations ----------------------------------------------------

std::size_t split_workspace_bytes(const DecodeShape& s) {
  const SplitPlan plan = split_plan(s, true);
  return std::size_t(s.lse_elems()) * plan.partitions * (s.head_dim + 1) * sizeof(float);
}

std::string decode_support(const DecodeShape& s, bool split) {
  if (s.head_dim != 64 && s.head_dim != 128) return "head_dim must be 64 or 128, got " + std::to_string(s.head_dim);
  const GpuInfo& gpu = detect_gpu();
  if (gpu.available && gpu.sm_major < 8)
    return "needs an sm_80 or newer GPU (mma.sync with bf16, cp.async), this one is sm_" +
           std::to_string(gpu.sm_major * 10 + gpu.sm_minor);
  const SplitPlan plan = split_plan(s, split);
  const int64_t z = int64_t(s.num_seqs) * plan.row_tiles;
  if (z > 65535)
    return "num_seqs x ceil(query_len x heads_q / heads_kv / 16) must be at most 65535, got " + std::to_string(z);
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
  a.scale_log2 = float(1.0 / std::sqrt(double(s.head_dim))) * kLog2e;
  if (kSplit) {
    a.part_o = static_cast<float*>(p.workspace);
    a.part_lse = a.part_o + s.lse_elems() * plan.partitions * s.head_dim;
  }
  constexpr int smem = DecodeLayout<kD>::kSmemBytes;
  static const bool opted_in = [] {  // more than the default 48 KB of shared memory, once per kernel
    CUDA_CHECK(
        cudaFuncSetAttribute(paged_attention_kernel<T, kD, kSplit>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)opted_in;
  const dim3 grid(plan.partitions, s.heads_kv, s.num_seqs * plan.row_tiles);
  paged_attention_kernel<T, kD, kSplit><<<grid, kThreads, smem, p.stream>>>(a);
  CUDA_CHECK_LAUNCH();
  //! [pdl_launch]
  if (kSplit) {
    // BEGIN SOLUTION ch08_merge: write merge_partitions_kernel's body, then delete this line
    // END SOLUTION
    const int64_t rows = s.lse_elems();
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(unsigned((rows + kWarps - 1) / kWarps));
    config.blockDim = dim3(kThreads);
    config.stream = p.stream;
    cudaLaunchAttribute early[1];  // programmatic dependent launch (see decode_kernel.cuh)
    early[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    early[0].val.programmaticStreamSerializationAllowed = 1;
    if (detect_gpu().sm_major >= 9) {  // Hopper and newer
      config.attrs = early;
      config.numAttrs = 1;
    }
    const MergeArgs merge{a.lens,    a.part_o,    a.part_lse,         a.o,         a.lse,
                          a.heads_q, a.query_len, a.partition_tokens, a.partitions};
    CUDA_CHECK(cudaLaunchKernelEx(&config, merge_partitions_kernel<T, kD>, merge, rows));
    CUDA_CHECK_LAUNCH();
  }
  //! [pdl_launch]
}

template <class T, bool kSplit>
void launch_any_dim(const DecodeParams& p) {
  with_head_dim<64, 128>(p.shape.head_dim, [&](auto d) { launch_decode<T, d.value, kSplit>(p); });
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
}  // namespace fa::paged
