// The warp-level tensor-core and copy instructions of sm_80 and newer, each wrapped once in inline
// PTX with a comment on what it does. Used by chapters 05, 07 and 08 (and by chapter 06's
// variant 1 through chapter 05's tuned_tile.cuh).
//
// The pieces, in the order a tile meets them:
//   cp.async  copies global -> shared memory without passing through registers; a thread
//             commits its copies as a group and later waits until at most N groups are pending;
//   ldmatrix  a warp loads four 8 x 8 matrices of 16-bit values from shared memory straight
//             into the fragment layout mma.sync expects (.trans transposes each matrix);
//   mma.sync  a warp multiplies a 16 x 16 A fragment by a 16 x 8 B fragment into a 16 x 8 fp32
//             accumulator, synchronously.
//
// Fragment layouts (PTX ISA, mma.m16n8k16, g = lane / 4, t = lane % 4):
//   A (16 x 16, row-major) four 32-bit registers: (g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)
//   B (16 x 8, "col")      two registers: (k = 2t..2t+1, n = g), (k = 2t+8..2t+9, n = g)
//   C (16 x 8, fp32)       four floats:   (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)
// A row of C is spread over the 4 lanes of a quad, which is why row reductions are quad_max /
// quad_sum (device_utils.cuh). Two neighbouring C tiles of 8 columns, packed to 16 bits, are
// exactly one A fragment of 16 columns: P = softmax(S) feeds P V without leaving registers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "strides.h"

namespace fa::ampere {

// ---- mma.sync ------------------------------------------------------------------------------
/// D = A B + D for one 16 x 8 x 16 tile: A and B 16-bit (T), C and D fp32.
template <class T>
struct Mma;

template <>
struct Mma<__half> {
  __device__ static uint32_t pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  __device__ static void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <>
struct Mma<__nv_bfloat16> {
  __device__ static uint32_t pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  __device__ static void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// ---- fragments by plain loads --------------------------------------------------------------
/// Two neighbouring 16-bit values (one fragment register) from memory.
__device__ inline uint32_t load32(const void* p) { return *static_cast<const uint32_t*>(p); }
/// Two 16-bit values from two places (a column pair of a row-major tile) as one register.
__device__ inline uint32_t pack16(const void* lo, const void* hi) {
  return uint32_t(*static_cast<const uint16_t*>(lo)) | (uint32_t(*static_cast<const uint16_t*>(hi)) << 16);
}

// ---- cp.async ------------------------------------------------------------------------------
/// 16 bytes global -> shared without passing through registers; `valid` = false fills zeros.
__device__ inline void cp_async_16(void* smem, const void* gmem, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(valid ? 16 : 0));
}
/// An L2 cache policy for data read once: its lines are the first the L2 evicts, so a stream of
/// it does not push out data the kernel reads again (createpolicy, sm_80+).
__device__ inline uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
/// cp_async_16 under an L2 cache policy (l2_evict_first_policy).
__device__ inline void cp_async_16_hint(void* smem, const void* gmem, bool valid, uint64_t policy) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(gmem),
               "r"(valid ? 16 : 0), "l"(policy));
}
/// 4 bytes global -> shared, zeros when !valid (.ca: the L2-only .cg form exists for 16 bytes alone).
__device__ inline void cp_async_4(void* smem, const void* gmem, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem), "r"(valid ? 4 : 0));
}
/// Closes this thread's copies issued so far into one group.
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
/// Waits until at most `kPending` committed groups are still in flight.
template <int kPending>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// ---- ldmatrix ------------------------------------------------------------------------------
/// Four 8 x 8 matrices of 16-bit values from shared memory into fragment registers: lane L gives
/// the address of row L % 8 of matrix L / 8, and receives the two values at (row lane/4, columns
/// 2*(lane%4), +1) of each matrix -- the row/column pattern of the mma A, B and C fragments.
/// `.trans` transposes each matrix.
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
/// The same two, given a 32-bit shared-memory address (what __cvta_generic_to_shared returns).
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem));
}
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem));
}

// ---- whole tiles ---------------------------------------------------------------------------
/// Rows [first, first + kRows) of a [n_rows, kD] 16-bit matrix whose rows are `ld` elements apart
/// (strides.h) into shared memory (row stride kLd), 16 bytes per thread per step through
/// registers; rows past the end are zero.
template <class T, int kD, int kLd, int kRows, class Ld = PackedStride<kD>>
__device__ void load_tile(T* tile, const T* src, int first, int n_rows, Ld ld = {}) {
  constexpr int kChunks = kD / 8;  // 8 elements = 16 bytes
  for (int e = threadIdx.x; e < kRows * kChunks; e += blockDim.x) {
    const int r = e / kChunks, c = e % kChunks;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (first + r < n_rows) value = *reinterpret_cast<const uint4*>(src + int64_t(first + r) * ld + c * 8);
    *reinterpret_cast<uint4*>(tile + r * kLd + c * 8) = value;
  }
}

}  // namespace fa::ampere
