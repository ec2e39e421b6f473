// Chapter 08: the paged KV cache's two write kernels, the GPU side of the block manager.
//
//   write_kv_cache_kernel  new tokens' K/V rows scattered into their slots (vLLM's "slot
//                          mapping": slot = physical block * block_size + row in the block)
//   copy_blocks_kernel     the copy-on-write copies BlockManager::take_copies() asks for
//
// Both move a few rows per decode step, not the cache, so each is a plain grid-stride loop: one
// thread per 16-bit element for the scatter, one per 16 bytes for the whole-block copies.
// Run: build/bin/ch08_paged_attention (its serving step checks both against the CPU, byte for byte)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda_check.h"
#include "paged_kernels.h"

namespace fa::paged {
namespace {

__global__ void write_kv_cache_kernel(const uint16_t* k_new, const uint16_t* v_new, const int64_t* slots,
                                      uint16_t* k_cache, uint16_t* v_cache, int64_t num_tokens, int heads_kv,
                                      int head_dim, int block_size) {
  const int64_t per_token = int64_t(heads_kv) * head_dim;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < num_tokens * per_token;
       e += int64_t(gridDim.x) * blockDim.x) {
    //! [write_kv_cache]
    const int64_t token = e / per_token, slot = slots[token];
    if (slot < 0) continue;  // a padding token
    const int h = int(e % per_token / head_dim), x = int(e % head_dim);
    const int64_t block = slot / block_size, row = slot % block_size;
    const int64_t at = ((block * heads_kv + h) * block_size + row) * head_dim + x;
    k_cache[at] = k_new[e];
    v_cache[at] = v_new[e];
    //! [write_kv_cache]
  }
}

__global__ void copy_blocks_kernel(const int* pairs, int n, uint4* k_cache, uint4* v_cache, int64_t block_vectors) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n * block_vectors;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t pair = e / block_vectors, i = e % block_vectors;
    const int64_t from = pairs[2 * pair] * block_vectors + i, to = pairs[2 * pair + 1] * block_vectors + i;
    k_cache[to] = k_cache[from];
    v_cache[to] = v_cache[from];
  }
}

}  // namespace

void launch_write_kv_cache(const DecodeShape& cache, const void* k_new, const void* v_new, const int64_t* slots,
                           int num_tokens, void* k_cache, void* v_cache, cudaStream_t stream) {
  cache.validate();
  if (num_tokens < 0) throw std::invalid_argument("num_tokens must be >= 0, got " + std::to_string(num_tokens));
  if (num_tokens == 0) return;
  const int64_t elems = int64_t(num_tokens) * cache.heads_kv * cache.head_dim;
  const int grid = int(std::min<int64_t>((elems + 255) / 256, 4096));
  write_kv_cache_kernel<<<grid, 256, 0, stream>>>(
      static_cast<const uint16_t*>(k_new), static_cast<const uint16_t*>(v_new), slots, static_cast<uint16_t*>(k_cache),
      static_cast<uint16_t*>(v_cache), num_tokens, cache.heads_kv, cache.head_dim, cache.block_size);
  CUDA_CHECK_LAUNCH();
}

void launch_copy_blocks(const DecodeShape& cache, const int* pairs, int n, void* k_cache, void* v_cache,
                        cudaStream_t stream) {
  cache.validate();
  const int64_t block_bytes = int64_t(cache.heads_kv) * cache.block_size * cache.head_dim * 2;
  if (block_bytes % 16 != 0)
    throw std::invalid_argument("copy_blocks needs a block of a multiple of 16 bytes, got " +
                                std::to_string(block_bytes));
  if (n <= 0) return;
  const int64_t vectors = int64_t(n) * (block_bytes / 16);
  const int grid = int(std::min<int64_t>((vectors + 255) / 256, 4096));
  copy_blocks_kernel<<<grid, 256, 0, stream>>>(pairs, n, static_cast<uint4*>(k_cache), static_cast<uint4*>(v_cache),
                                               block_bytes / 16);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fa::paged
