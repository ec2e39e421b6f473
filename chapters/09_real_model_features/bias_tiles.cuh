// Chapter 09: a float bias tile of 64 rows x 128 keys staged in shared memory by TMA, as the
// Hopper forward's bias warp and the Hopper backward's producer load it. The tile is four boxes
// of 64 rows x 32 keys (128 bytes a row) with the 128-byte swizzle, the layout of Q, K and V, so
// that the rows a warp reads at once fall in different banks.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "ampere.cuh"
#include "hopper.cuh"

namespace fa::features {

constexpr int kBiasBoxKeys = 32, kBiasBoxRows = 64, kBiasTileKeys = 128;
constexpr int kBiasBoxBytes = kBiasBoxRows * kBiasBoxKeys * 4, kBiasTileBytes = kBiasBoxRows * kBiasTileKeys * 4;

/// Element (row, key) of a staged tile: box key / 32, the 16-byte chunk c of a box row r stored at
/// chunk c ^ (r % 8), so that the 8 rows a warp reads at once fall in different banks.
__device__ inline float* bias_at(float* tile, int row, int key) {
  return tile + (key / kBiasBoxKeys) * (kBiasBoxBytes / 4) + row * kBiasBoxKeys +
         ((((key % kBiasBoxKeys) / 4) ^ (row % 8)) * 4) + key % 4;
}

/// TMA's copy of one box (tma_load_3d) under an L2 cache policy: the bias, read once, goes through
/// L2 as evict-first, so that its stream does not push K and V out.
__device__ inline void tma_load_3d_hint(void* dst, const CUtensorMap* map, int c0, int c1, int c2, uint64_t* bar,
                                        uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3, "
      "%4}], [%5], %6;\n" ::"r"(hopper::smem_addr(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(hopper::smem_addr(bar)), "l"(policy)
      : "memory");
}

/// The same box into L2 only (no shared memory, no barrier).
__device__ inline void tma_prefetch_3d(const CUtensorMap* map, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.prefetch.tensor.3d.L2.global.tile [%0, {%1, %2, %3}];\n" ::"l"(map), "r"(c0), "r"(c1),
               "r"(c2)
               : "memory");
}

/// Rows row0 .. row0 + 63 and keys key0 .. key0 + 127 of query plane `plane` of the bias
/// ([planes][seq_q][seq_kv]; boxes past seq_q or seq_kv read zeros) into `tile`, completing on
/// `bar`, whose arrival expects kBiasTileBytes.
__device__ inline void load_bias_tile(unsigned char* tile, const CUtensorMap* tm_bias, int key0, int row0, int plane,
                                      uint64_t* bar, uint64_t policy) {
  for (int b = 0; b < kBiasTileKeys / kBiasBoxKeys; ++b)
    tma_load_3d_hint(tile + b * kBiasBoxBytes, tm_bias, key0 + kBiasBoxKeys * b, row0, plane, bar, policy);
}

/// The same tile into L2 only.
__device__ inline void prefetch_bias_boxes(const CUtensorMap* tm_bias, int key0, int row0, int plane) {
  for (int b = 0; b < kBiasTileKeys / kBiasBoxKeys; ++b) tma_prefetch_3d(tm_bias, key0 + kBiasBoxKeys * b, row0, plane);
}

}  // namespace fa::features
