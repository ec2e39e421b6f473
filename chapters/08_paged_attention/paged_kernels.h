// Chapter 08's GPU entry points besides the registered decode kernels: writing new tokens into
// the paged cache, performing the block manager's copy-on-write copies, and the split plan of
// variant 2. Caches hold 16-bit elements (fp16 or bf16) laid out as DecodeShape describes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "problem.h"

namespace fa::paged {

/// Scatters num_tokens new tokens into the cache: k_new and v_new are [num_tokens][heads_kv]
/// [head_dim]; token i goes to slot slots[i] = physical block * block_size + row of the cache
/// (vLLM's "slot mapping"), or nowhere when slots[i] is -1 (a padding token). slots is device
/// memory. Throws std::invalid_argument for a shape the caches cannot have.
void launch_write_kv_cache(const DecodeShape& cache, const void* k_new, const void* v_new, const int64_t* slots,
                           int num_tokens, void* k_cache, void* v_cache, cudaStream_t stream = nullptr);

/// Copies whole blocks, K and V, every K/V head: pairs is device memory [n][2] of (from, to),
/// as BlockManager::take_copies() returned them (no block both a source and a destination).
/// Run it before writing the new tokens.
void launch_copy_blocks(const DecodeShape& cache, const int* pairs, int n, void* k_cache, void* v_cache,
                        cudaStream_t stream = nullptr);

/// How variant 2 cuts the contexts: partitions of partition_tokens keys (a multiple of 16, the
/// warps' chunk), `partitions` of them for the longest context, `row_tiles` 16-row tiles of
/// query rows per (sequence, K/V head).
struct SplitPlan {
  int partition_tokens = 0;
  int partitions = 1;
  int row_tiles = 1;
};
/// split = false: one partition covering the whole context (variant 1). Otherwise the count
/// that keeps the GPU's block slots busiest (see the comment in paged_attention.cu).
SplitPlan split_plan(const DecodeShape& s, bool split);

}  // namespace fa::paged
