// Chapter 06, variant 5's preprocessing: bf16 Q, K and V turned into what the FP8 tensor cores
// take, by three small memory-bound kernels that run before the attention kernel.
//   * Q and K: each row times diag(signs) * H / sqrt(d) (incoherent processing: the same random
//     orthogonal matrix for Q and K leaves Q K^T unchanged and spreads outliers over the row),
//     then one scale per 128-row block (block quantization) and e4m3.
//   * V: one scale per 128-key block and e4m3, stored *transposed* ([d][keys]): FP8 wgmma wants
//     both operands K-major, and for P V the reduction runs over keys. Within each 32-key group
//     the keys are also permuted, so that the P values a thread already holds in its S
//     accumulators are exactly its A-fragment slots (see p_slot_key); P V sums over keys, so any
//     order works as long as P and V agree.
// The CPU model of the same steps is algorithm.h (fp8_attention_cpu).
// Run: build/bin/ch06_flash_attention_v3 --variant fp8   (its "quantize" phase is these kernels)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "device_utils.cuh"
#include "random.h"

namespace fa::flash3 {
namespace {

constexpr int kRows8 = 128;                                     // rows per Q block, keys per K/V block (and per scale)
constexpr uint64_t kSignSeed = 0x5EED;                          // the incoherent-processing signs (as algorithm.h)
constexpr int kPrepThreads = 256;                               // preprocessing: 8 warps per 128-row block
constexpr int kPrepRowsPerWarp = kRows8 / (kPrepThreads / 32);  // 16

/// Four floats (already divided by the scale) as four e4m3 bytes, the first in the lowest byte.
__device__ inline uint32_t e4m3x4(float a, float b, float c, float d) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
}

/// Rows row0 .. row0 + kN - 1 of a plane, this lane's kD / 32 floats of each (columns
/// (kD / 32) lane ...), zeros past the end. All kN loads are issued before any is used: the
/// preprocessing is a pure memory pass, and a warp with kN loads in flight hides their latency.
template <int kD, int kN>
__device__ inline void load_rows(float (&v)[kN][kD / 32], const __nv_bfloat16* plane_base, int row0, int rows,
                                 int lane) {
  using Raw = std::conditional_t<kD == 256, uint4, std::conditional_t<kD == 128, uint2, uint32_t>>;  // kD / 32 bf16
  Raw raw[kN];
#pragma unroll
  for (int r = 0; r < kN; ++r)
    raw[r] =
        row0 + r < rows ? *reinterpret_cast<const Raw*>(plane_base + int64_t(row0 + r) * kD + (kD / 32) * lane) : Raw{};
#pragma unroll
  for (int r = 0; r < kN; ++r) {
    const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw[r]);
#pragma unroll
    for (int e = 0; e < kD / 32; e += 2) {
      const float2 f = __bfloat1622float2(pairs[e / 2]);
      v[r][e] = f.x;
      v[r][e + 1] = f.y;
    }
  }
}

/// A lane's kD / 32 floats (already divided by the scale) as e4m3 bytes at `at`.
template <int kD>
__device__ inline void store_e4m3(uint8_t* at, const float (&v)[kD / 32], float inv) {
  if constexpr (kD == 64) {
    *reinterpret_cast<uint16_t*>(at) =
        uint16_t(__nv_cvt_float2_to_fp8x2(make_float2(v[0] * inv, v[1] * inv), __NV_SATFINITE, __NV_E4M3));
  } else {
#pragma unroll
    for (int w = 0; w < kD / 128; ++w)  // 4-byte stores: the V kernel's staging rows are only 4-byte aligned
      reinterpret_cast<uint32_t*>(at)[w] =
          e4m3x4(v[4 * w] * inv, v[4 * w + 1] * inv, v[4 * w + 2] * inv, v[4 * w + 3] * inv);
  }
}

//! [device_hadamard]
/// x <- x * diag(signs) * H / sqrt(kD) for one row spread over a warp (lane l holds the kD / 32
/// columns from (kD / 32) l). Butterflies shorter than kD / 32 stay inside a lane; longer ones
/// pair lane l with lane l ^ (distance / (kD / 32)), one shuffle per value.
template <int kD>
__device__ inline void rotate_row(float (&v)[kD / 32], int lane) {
  constexpr int kPer = kD / 32;
#pragma unroll
  for (int e = 0; e < kPer; ++e) v[e] *= (splitmix64(kSignSeed + uint64_t(kPer * lane + e)) >> 63) ? -1.0f : 1.0f;
#pragma unroll
  for (int half = 1; half < kPer; half *= 2)
#pragma unroll
    for (int e = 0; e < kPer; ++e)
      if (!(e & half)) {
        const float a = v[e], b = v[e + half];
        v[e] = a + b;
        v[e + half] = a - b;
      }
#pragma unroll
  for (int lanes = 1; lanes < 32; lanes *= 2) {
    const bool upper = lane & lanes;
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const float other = __shfl_xor_sync(0xFFFFFFFFu, v[e], lanes);
      v[e] = upper ? other - v[e] : v[e] + other;
    }
  }
  const float norm = kD == 256 ? 0.0625f : kD == 128 ? 0.08838834764831845f : 0.125f;  // 1 / sqrt(kD)
#pragma unroll
  for (int e = 0; e < kPer; ++e) v[e] *= norm;
}
//! [device_hadamard]

/// Q or K, one block per (128-row block, plane), one warp per 16 rows (a row is kD * 2 coalesced
/// bytes): rotate (unless kRotate is off: the control kernel), take the block's largest |x|,
/// then e4m3 with that block's scale. Block (0, 0) also sets zero[0 .. zero_count) to 0 (the
/// attention kernel's split-tail counters, see merge_pieces), saving a launch.
template <int kD, bool kRotate>
__global__ void __launch_bounds__(kPrepThreads)
    quantize_rotated_kernel(const __nv_bfloat16* x, int rows, uint8_t* x8, float* scales, int* zero, int zero_count) {
  constexpr int kN = kPrepRowsPerWarp;
  __shared__ float scratch[32];
  const int plane = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (blockIdx.x == 0 && blockIdx.y == 0)
    for (int i = threadIdx.x; i < zero_count; i += kPrepThreads) zero[i] = 0;
  const int row0 = blockIdx.x * kRows8 + kN * warp;
  float v[kN][kD / 32];
  load_rows<kD, kN>(v, x + int64_t(plane) * rows * kD, row0, rows, lane);
  float amax = 0.0f;
#pragma unroll
  for (int r = 0; r < kN; ++r) {
    if constexpr (kRotate) rotate_row<kD>(v[r], lane);
#pragma unroll
    for (int e = 0; e < kD / 32; ++e) amax = fmaxf(amax, fabsf(v[r][e]));
  }
  //! [block_scale]
  amax = block_all_reduce(amax, MaxOp(), 0.0f, scratch);
  const float scale = amax > 0.0f ? amax / 448.0f : 1.0f, inv = 1.0f / scale;
  if (threadIdx.x == 0) scales[int64_t(plane) * gridDim.x + blockIdx.x] = scale;
  //! [block_scale]
  uint8_t* dst = x8 + int64_t(plane) * rows * kD;
#pragma unroll
  for (int r = 0; r < kN; ++r) {
    if (row0 + r >= rows) continue;
    store_e4m3<kD>(dst + int64_t(row0 + r) * kD + (kD / 32) * lane, v[r], inv);
  }
}

//! [p_slot_key]
/// Which key (0..31, within a 32-key step) sits in A-fragment slot s. Thread t of a quad holds
/// S at keys 8j + 2t, 8j + 2t + 1 (j = 0..3); its A-fragment bytes are slots 4t..4t+3 and
/// 16 + 4t..19 + 4t. Putting the keys it holds into the slots it owns:
///   slot 16h + 4t + i  <-  key 16h + 8 (i / 2) + 2t + i % 2.
__host__ __device__ constexpr int p_slot_key(int s) {
  return (s / 16) * 16 + ((s % 4) / 2) * 8 + 2 * ((s % 16) / 4) + s % 2;
}
/// The inverse: the slot of key k.
__host__ __device__ constexpr int p_key_slot(int k) {
  return (k / 16) * 16 + 4 * ((k % 8) / 2) + 2 * ((k % 16) / 8) + k % 2;
}
//! [p_slot_key]
static_assert(p_key_slot(p_slot_key(0)) == 0 && p_key_slot(p_slot_key(13)) == 13 && p_key_slot(p_slot_key(31)) == 31,
              "p_key_slot inverts p_slot_key");

/// V: block of 128 keys -> e4m3 with one scale, written transposed and slot-permuted:
/// vt8[plane][x][128 b + slot] for key 128 b + 32 g + p_slot_key(slot). Keys past the end are 0.
/// Two phases through shared memory: warps read 16 keys each (coalesced rows) and store them
/// as e4m3 in [key][x] order; then each thread gathers 4 columns x of 16 slots as 16 words and
/// transposes those bytes with byte permutes into 4 rows of 16 bytes of V^T.
template <int kD>
__global__ void __launch_bounds__(kPrepThreads)
    quantize_v_kernel(const __nv_bfloat16* v, int rows, int rows_padded, uint8_t* vt8, float* scales) {
  constexpr int kN = kPrepRowsPerWarp, kPitch = kD + 4;  // the pad spreads d64's two-chunk warps over the banks
  __shared__ float scratch[32];
  __shared__ __align__(16) uint8_t tile[kRows8 * kPitch];  // e4m3, [key][x]
  const int plane = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int key0 = kN * warp;
  float x[kN][kD / 32];
  load_rows<kD, kN>(x, v + int64_t(plane) * rows * kD, blockIdx.x * kRows8 + key0, rows, lane);
  float amax = 0.0f;
#pragma unroll
  for (int r = 0; r < kN; ++r)
#pragma unroll
    for (int e = 0; e < kD / 32; ++e) amax = fmaxf(amax, fabsf(x[r][e]));
  amax = block_all_reduce(amax, MaxOp(), 0.0f, scratch);
  // An all-zero block gets scale 0 (not 1, as Q and K do): the attention kernel takes the
  // largest V scale of a head as O's unit, and a made-up 1 would swamp the real ones.
  const float scale = amax / 448.0f, inv = amax > 0.0f ? 1.0f / scale : 0.0f;
  if (threadIdx.x == 0) scales[int64_t(plane) * gridDim.x + blockIdx.x] = scale;
#pragma unroll
  for (int r = 0; r < kN; ++r) {
    store_e4m3<kD>(tile + (key0 + r) * kPitch + (kD / 32) * lane, x[r], inv);
  }
  __syncthreads();
  //! [v_transpose]
  // Item = (chunk c of 16 slots, group of 4 columns x0..x0+3): kD / 4 * 8 items.
  for (int item = threadIdx.x; item < kD / 4 * 8; item += kPrepThreads) {
    const int x0 = 4 * (item % (kD / 4)), c = item / (kD / 4);
    uint32_t w[16];  // w[i]: columns x0..x0+3 of the key in slot 16 c + i
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int slot = 16 * c + i, key = (slot / 32) * 32 + p_slot_key(slot % 32);
      w[i] = *reinterpret_cast<const uint32_t*>(tile + key * kPitch + x0);
    }
    uint32_t out[4][4];  // out[q][j]: column x0 + q, slots 4 j .. 4 j + 3
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      // A 4x4 byte transpose: t0 = (w0.b0 w1.b0 w0.b1 w1.b1), t1 = (w0.b2 w1.b2 w0.b3 w1.b3), ...
      const uint32_t t0 = __byte_perm(w[4 * j], w[4 * j + 1], 0x5140), t1 = __byte_perm(w[4 * j], w[4 * j + 1], 0x7362);
      const uint32_t t2 = __byte_perm(w[4 * j + 2], w[4 * j + 3], 0x5140),
                     t3 = __byte_perm(w[4 * j + 2], w[4 * j + 3], 0x7362);
      out[0][j] = __byte_perm(t0, t2, 0x5410);
      out[1][j] = __byte_perm(t0, t2, 0x7632);
      out[2][j] = __byte_perm(t1, t3, 0x5410);
      out[3][j] = __byte_perm(t1, t3, 0x7632);
    }
#pragma unroll
    for (int q = 0; q < 4; ++q)
      *reinterpret_cast<uint4*>(vt8 + (int64_t(plane) * kD + x0 + q) * rows_padded + blockIdx.x * kRows8 + 16 * c) =
          make_uint4(out[q][0], out[q][1], out[q][2], out[q][3]);
  }
  //! [v_transpose]
}

}  // namespace
}  // namespace fa::flash3
