// Chapter 06, variant 5 -- `fp8`: variant 4's warp-specialized ping-pong kernel on e4m3 operands, with
// FlashAttention-3's two accuracy tricks. bf16 in and out; head_dim 64 and 128.
//
// Two preprocessing kernels turn the bf16 inputs into what the FP8 tensor cores take:
//   * Q and K: each row times diag(signs) * H / sqrt(128) (incoherent processing: the same
//     random orthogonal matrix for Q and K leaves Q K^T unchanged and spreads outliers), then one
//     scale per 128-row block (block quantization) and e4m3.
//   * V: one scale per 128-key block and e4m3, stored *transposed* ([d][keys]): FP8 wgmma wants
//     both operands K-major, and for P V the reduction runs over keys. Within each 32-key group
//     the keys are also permuted, so that the P values a thread already holds in its S
//     accumulators are exactly its A-fragment slots (see p_slot_key); P V sums over keys, so any
//     order works as long as P and V agree.
// The attention kernel: variant 4's producer/consumers and ping-pong schedule, on e4m3 operands:
//   S = Q8 K8^T with wgmma.m64n128k32.e4m3, times scale_q * scale_k folded into the exponent;
//   P * 2^8 (inside the exponent) rounded to e4m3 in registers (2^8 keeps small probabilities
//   above e4m3's floor);
//   O += P8 V8 with O kept in units of the largest V block scale: each tile's own V scale goes
//   into P's exponent too (see fp8_units), and O * v_ref / (2^8 l) at the end;
//   at head_dim 128, l from the tensor cores: P8 times a tile of ones (see fp8_row_sums).
// The CPU model of all this, and its accuracy experiment, is algorithm.h / tests/cpu/test_fp8.cpp.
// Run: build/bin/ch06_flash_attention_v3 --variant fp8
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "algorithm.h"
#include "compare.h"
#include "cuda_check.h"
#include "device_utils.cuh"
#include "flash3_tile.cuh"
#include "flash_attention_v3.h"
#include "phase_timer.h"
#include "random.h"
#include "registry.h"
#include "tma.h"

namespace fa::flash3 {
namespace {

using namespace fa::hopper;

constexpr int kRows8 = 128;                  // rows per Q block, keys per K/V block (and per scale)
constexpr uint64_t kSignSeed = 0x5EED;       // the incoherent-processing signs (as algorithm.h)
constexpr int kStages = 4;                    // e4m3 tiles are small: 4 stages fit
/// Bytes of one tile: 128 rows of head_dim e4m3 (Q, K), or head_dim rows of 128 keys (V^T).
template <int kD>
constexpr int kTileBytes8 = kRows8 * kD;
/// Consumer warpgroups (64 Q rows each): three at head_dim 128, two at 64 (see kThreeConsumers).
template <int kD>
constexpr int kConsumers8 = kD == 128 ? 3 : 2;

// ---- preprocessing ------------------------------------------------------------------------

constexpr int kPrepThreads = 256;                          // preprocessing: 8 warps per 128-row block
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
__device__ inline void load_rows(float (&v)[kN][kD / 32], const __nv_bfloat16* plane_base, int row0, int rows, int lane) {
  using Raw = std::conditional_t<kD == 128, uint2, uint32_t>;  // kD / 32 bf16
  Raw raw[kN];
#pragma unroll
  for (int r = 0; r < kN; ++r)
    raw[r] = row0 + r < rows ? *reinterpret_cast<const Raw*>(plane_base + int64_t(row0 + r) * kD + (kD / 32) * lane) : Raw{};
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
  const float norm = kD == 128 ? 0.08838834764831845f : 0.125f;  // 1 / sqrt(kD)
#pragma unroll
  for (int e = 0; e < kPer; ++e) v[e] *= norm;
}
//! [device_hadamard]

/// Q or K, one block per (128-row block, plane), one warp per 16 rows (a row is kD * 2 coalesced
/// bytes): rotate (unless kRotate is off: the control kernel), take the block's largest |x|,
/// then e4m3 with that block's scale. Block (0, 0) also sets zero[0 .. zero_count) to 0 (the
/// attention kernel's split-tail counters, see merge_pieces), saving a launch.
template <int kD, bool kRotate>
__global__ void __launch_bounds__(kPrepThreads) quantize_rotated_kernel(const __nv_bfloat16* x, int rows, uint8_t* x8,
                                                                        float* scales, int* zero, int zero_count) {
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
  amax = block_all_reduce(amax, MaxOp(), 0.0f, scratch);
  const float scale = amax > 0.0f ? amax / 448.0f : 1.0f, inv = 1.0f / scale;
  if (threadIdx.x == 0) scales[int64_t(plane) * gridDim.x + blockIdx.x] = scale;
  uint8_t* dst = x8 + int64_t(plane) * rows * kD;
#pragma unroll
  for (int r = 0; r < kN; ++r) {
    if (row0 + r >= rows) continue;
    uint8_t* row_dst = dst + int64_t(row0 + r) * kD + (kD / 32) * lane;
    if constexpr (kD == 128) {
      *reinterpret_cast<uint32_t*>(row_dst) = e4m3x4(v[r][0] * inv, v[r][1] * inv, v[r][2] * inv, v[r][3] * inv);
    } else {
      *reinterpret_cast<uint16_t*>(row_dst) =
          uint16_t(__nv_cvt_float2_to_fp8x2(make_float2(v[r][0] * inv, v[r][1] * inv), __NV_SATFINITE, __NV_E4M3));
    }
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
__global__ void __launch_bounds__(kPrepThreads) quantize_v_kernel(const __nv_bfloat16* v, int rows, int rows_padded,
                                                                  uint8_t* vt8, float* scales) {
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
    uint8_t* at = tile + (key0 + r) * kPitch + (kD / 32) * lane;
    if constexpr (kD == 128) {
      *reinterpret_cast<uint32_t*>(at) = e4m3x4(x[r][0] * inv, x[r][1] * inv, x[r][2] * inv, x[r][3] * inv);
    } else {
      *reinterpret_cast<uint16_t*>(at) =
          uint16_t(__nv_cvt_float2_to_fp8x2(make_float2(x[r][0] * inv, x[r][1] * inv), __NV_SATFINITE, __NV_E4M3));
    }
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
      const uint32_t t2 = __byte_perm(w[4 * j + 2], w[4 * j + 3], 0x5140), t3 = __byte_perm(w[4 * j + 2], w[4 * j + 3], 0x7362);
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

// ---- attention ----------------------------------------------------------------------------

struct Fp8Scales {
  const float* q;  // [planes_q][q blocks]
  const float* k;  // [planes_kv][kv blocks]
  const float* v;
  int q_blocks, kv_blocks;
};

// Q tile (64 rows per consumer), kStages K tiles, kStages V^T tiles; with three consumers two P
// tiles per consumer (P goes through shared memory there); barriers q_full, k_full, v_full,
// k_empty, v_empty.
template <int kD>
struct Fp8Smem {
  static constexpr int kC = kConsumers8<kD>;
  static constexpr int kTile = kTileBytes8<kD>, kQTile = 64 * kC * kD, kPTile = 64 * kBlockN;
  static constexpr int kQ = 0, kK = kQTile, kV = kK + kStages * kTile, kP = kV + kStages * kTile;
  static constexpr int kOnes = kP + (kC == 3 ? 2 * kC * kPTile : 0);  // 8 rows of 128 e4m3 ones (fp8_row_sums)
  static constexpr int kBars = kOnes + (kC == 3 ? 1024 : 0);
  static constexpr int kBytes = kBars + 8 * (1 + 4 * kStages) + 1024;
};

/// P (fp32, already times 2^8) as e4m3 A fragments for the 4 k-steps of 32 keys.
__device__ inline void pack_p_e4m3(const float (&s)[kBlockN / 2], uint32_t (&p)[kBlockN / 32][4]) {
#pragma unroll
  for (int kk = 0; kk < kBlockN / 32; ++kk) {
    const int j = 4 * kk;  // the step's first 8-key block; s[4j + e]: e = 0, 1 row g, e = 2, 3 row g + 8
    p[kk][0] = e4m3x4(s[4 * j + 0], s[4 * j + 1], s[4 * (j + 1) + 0], s[4 * (j + 1) + 1]);
    p[kk][1] = e4m3x4(s[4 * j + 2], s[4 * j + 3], s[4 * (j + 1) + 2], s[4 * (j + 1) + 3]);
    p[kk][2] = e4m3x4(s[4 * (j + 2) + 0], s[4 * (j + 2) + 1], s[4 * (j + 3) + 0], s[4 * (j + 3) + 1]);
    p[kk][3] = e4m3x4(s[4 * (j + 2) + 2], s[4 * (j + 2) + 3], s[4 * (j + 3) + 2], s[4 * (j + 3) + 3]);
  }
}

//! [three_consumers]
// At head_dim 128, three consumer warpgroups (192 Q rows per block) instead of two. FP8 halves
// the tensor cores' time per tile, but not the softmax's: with two consumers the tensor cores
// waited while both ran their softmax. A third warpgroup's GEMMs fill that time. The register
// file sets the terms: 4 warpgroups share 64K registers, so a consumer gets 160 (the producer
// keeps 24), and O (64) + S (64) fill most of them. P_j, which in variant 4 sits in 16 more
// registers while S_{j+1} is computed, goes to shared memory instead (wgmma reads A from there
// too), in two buffers per warpgroup, so that P_{j+1} can be stored while P_j V_j still reads
// P_j. Q is read from shared memory. No turns: three warpgroups issue when they are ready.
template <int kD>
constexpr bool kThreeConsumers = kConsumers8<kD> == 3;
//! [three_consumers]

/// Byte offset in a P buffer of the row that lane gives stmatrix (matrix i = lane / 8 is rows
/// 16 warp + 8 (i % 2) + 0..7, chunk i / 2 of k-step 0; see pack), swizzled.
__device__ inline uint32_t p_matrix_row(int warp, int lane) {
  const int i = lane / 8, row = 16 * warp + 8 * (i % 2) + lane % 8;
  return row * 128 + ((i / 2) ^ (lane % 8)) * 16;
}

/// The e4m3 operations variant 4's schedule (pingpong_schedule in flash3_tile.cuh) runs here.
template <int kD>
struct Fp8Ops {
  using L = Fp8Smem<kD>;
  static constexpr int kC = L::kC;
  static constexpr bool kPInSmem = kThreeConsumers<kD>;
  /// At head_dim 128 the row sums come from the tensor cores (see fp8_row_sums).
  static constexpr bool kTensorSums = kPInSmem;
  unsigned char* smem;
  const unsigned char* q_rows;
  uint64_t *k_full, *v_full, *k_empty, *v_empty;
  AttentionShape shape;
  const float *k_scales, *v_scales;  // this K/V head's block scales
  int mask_i0;  // the first of the kMaskRows rows whose mask test decides whether a tile needs the mask
  int tile0;    // the first K/V tile of this block's range: ring slot j holds tile tile0 + j
  static constexpr int kMaskRows = kC == 2 ? 64 * kC : 64;
  int row0, t, last_block;
  float scale_log2;  // softmax scale * log2(e) * this Q block's scale
  float v_ref, log2_v_ref;  // O's unit: the largest V block scale among this block's tiles
  float k_next, v_next;     // the next tile's K and V scales, loaded a tile ahead
  unsigned char* p_tile;    // this warpgroup's first P buffer in shared memory (kPInSmem)
  uint32_t p_store;         // this lane's stmatrix row address in it, for k-step 0 (see pack)
  uint32_t p_cur = 1;       // the buffer pack wrote last, which pv reads
  float out[kD / 2] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  uint32_t p[kBlockN / 32][4] = {};
  float sums[4] = {};                // kTensorSums: row sums of the P that pv issued last (see fp8_row_sums)
  float w_soft = 0.0f, w_pv = 0.0f;  // l's weight 1 / r for the P that softmax made last / pv issued last

  __device__ static uint32_t phase(int j) { return uint32_t((j / kStages) & 1); }
  __device__ void wait_k(int j) { mbarrier_wait(&k_full[j % kStages], phase(j)); }
  __device__ void wait_v(int j) { mbarrier_wait(&v_full[j % kStages], phase(j)); }
  __device__ void release_k(int j) { mbarrier_arrive(&k_empty[j % kStages]); }
  __device__ void release_v(int j) { mbarrier_arrive(&v_empty[j % kStages]); }
  /// Descriptor high words. Q and K rows are kD bytes: the 128-byte swizzle at head_dim 128, the
  /// 64-byte one at 64 (8-row groups 1024 or 512 bytes apart). V^T and P rows are 128 bytes.
  static constexpr uint32_t kRowsHi = kD == 128 ? desc_hi(1024, 1) : desc_hi(512, 2), kKeysHi = desc_hi(1024, 1);
  /// The descriptor low word of smem's first byte (leading offset 16 bytes): a tile at byte
  /// offset x of smem has the low word smem_lo + x / 16 (see desc_lo).
  uint32_t smem_lo;
  __device__ void scores(int j, float (&s)[kBlockN / 2]) {
    //! [fp8_scores]
    // S = Q8 K8^T: kD / 32 wgmma of k = 32 bytes; the true scores are S * scale_q * scale_k.
    // Descriptors by 32-bit adds (desc_lo): the k-th step starts 32 bytes further in Q and K.
    const uint32_t q_lo = smem_lo + uint32_t(q_rows - smem) / 16, k_lo = smem_lo + (L::kK + (j % kStages) * L::kTile) / 16;
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kD / 32; ++ks)
      wgmma_m64n128k32_e4m3_ss(s, desc_join(q_lo + 2 * ks, kRowsHi), desc_join(k_lo + 2 * ks, kRowsHi), ks > 0);
    wgmma_commit();
    //! [fp8_scores]
  }
  __device__ void pv(int j) {
    //! [fp8_pv]
    // O += P8 V8: B = the V^T tile, K-major (keys contiguous in each of its kD rows of 128 bytes).
    const uint32_t v_lo = smem_lo + (L::kV + (j % kStages) * L::kTile) / 16;
    const uint32_t p_lo = smem_lo + uint32_t(p_tile - smem) / 16 + p_cur * (kC * L::kPTile / 16);
    if constexpr (kPInSmem) {
      // wgmma reads shared memory through the async proxy: pack's stores must be made visible to
      // it. The fence waits for those stores to land, so it sits here, after S_{j+1} is issued,
      // not right after the stores (there it cost 0.4-1.9%). Each warp's 16 rows of P feed only its own
      // 16 rows of O, so the warp's own stores are all that must be visible: no warpgroup barrier.
      fence_proxy_async_shared();
      __syncwarp();
    }
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 32; ++kk) {
      const uint64_t b = desc_join(v_lo + 2 * kk, kKeysHi);
      if constexpr (kPInSmem) {  // head_dim 128
        wgmma_m64n128k32_e4m3_ss(out, desc_join(p_lo + 2 * kk, kKeysHi), b, true);
      } else {
        wgmma_m64n64k32_e4m3_rs(out, p[kk], b, true);
      }
    }
    wgmma_commit_row_sums(p_lo);
    //! [fp8_pv]
  }
  //! [fp8_row_sums]
  // l from the tensor cores (head_dim 128). The softmax's row sums cost an FADD per score; a
  // wgmma of P against 8 columns of ones (m64n8k32, B a constant tile of e4m3 1.0) gives the same
  // sums from the P8 that P V uses, in the same commit group. They are read once that group is
  // done (rescale_out), and enter l as O's columns do: l = (l + sums / r) * rescale. Summing the
  // rounded P8 also makes l the exact total of the weights O was built from.
  __device__ void wgmma_commit_row_sums(uint32_t p_lo) {
    if constexpr (kTensorSums) {
      const uint32_t ones_lo = smem_lo + L::kOnes / 16;
      w_pv = w_soft;
#pragma unroll
      for (int kk = 0; kk < kBlockN / 32; ++kk)
        wgmma_m64n8k32_e4m3_ss(sums, desc_join(p_lo + 2 * kk, kKeysHi), desc_join(ones_lo + 2 * kk, kKeysHi), kk > 0);
    }
    wgmma_commit();
  }
  /// The row sums of the P V just finished into l (after the last tile, the kernel calls it too).
  __device__ void add_sums() {
    if constexpr (kTensorSums) {
      l[0] += sums[0] * w_pv;
      l[1] += sums[2] * w_pv;
    }
  }
  __device__ void rescale_out(const float (&rescale)[2]) {
    if constexpr (kTensorSums) {
      add_sums();
      l[0] *= rescale[0];
      l[1] *= rescale[1];
    }
    rescale_output<kD>(out, rescale);
  }
  //! [fp8_row_sums]
  //! [fp8_stale_max]
  // A row keeps its running max m until a tile's max passes m + kMaxRise (log2 units). Until
  // then P = 2^(x - m + 8) stays below 2^8.75 = 430, inside e4m3's range (448), and the row's
  // factor exp2(m_old - m_new) is exactly 1, so rescale_output can skip O's multiplies. With the
  // exact max, some row of a warp's 16 rose on most tiles of random inputs (a row's max rises at
  // tile j with probability about 1 / (j + 1)), and those multiplies took 9% of a consumer's time.
  static constexpr float kMaxRise = 0.75f;
  //! [fp8_stale_max]
  __device__ void softmax(int j, float (&s)[kBlockN / 2], float (&rescale)[2]) {
    const int key0 = (tile0 + j) * kBlockN;
    if (tile_needs_mask(shape, mask_i0, kMaskRows, key0)) mask_scores(s, shape, row0, key0, t);
    //! [fp8_units]
    // O stays in units of v_ref for the whole loop: V_j's own scale, as r = v_scale_j / v_ref <= 1,
    // rides in P's exponent next to the 2^8 (kPScale) that lifts P into e4m3's range. l must
    // not carry r, so the row sums are divided by it again (w). An all-zero V block (scale 0)
    // takes r = 1: its P V is 0 whatever P is, and its P must still count in l. r is floored at
    // 2^-16.
    const float k_scale_j = k_next, v_scale_j = v_next;
    const float log2_r = v_scale_j == 0.0f ? 0.0f : fmaxf(__log2f(v_scale_j) - log2_v_ref, -16.0f);
    const float w = fast_exp2(-log2_r);
    online_softmax<!kTensorSums>(s, m, l, rescale, scale_log2 * k_scale_j, 8.0f + log2_r, w, kMaxRise);
    w_soft = w;
    //! [fp8_units]
    // The scales were loaded one tile ahead: a global load here would put its latency on the
    // softmax's critical path every tile.
    const int ahead = min(tile0 + j + 1, last_block);
    k_next = k_scales[ahead];
    v_next = v_scales[ahead];
  }
  __device__ void pack(const float (&s)[kBlockN / 2]) {
    pack_p_e4m3(s, p);
    if constexpr (kPInSmem) {
      //! [p_to_smem]
      // The A fragments' bytes, stored where an SS wgmma reads them, in the buffer pv(j - 1) is not
      // reading: row r of 128 bytes, 16-byte chunk c at chunk c ^ (r % 8) (the 128-byte swizzle).
      // p[kk][i] is row 16 warp + g + 8 (i % 2), chunk 2 kk + i / 2, bytes 4t .. 4t + 3 of it:
      // exactly what stmatrix takes as matrix i of an x4 (8 rows of 16 bytes, thread g t holding
      // row g's bytes 4t .. 4t + 3), so one stmatrix per k-step stores all four. Each lane gives
      // one row's address (p_store, for k-step 0); k-step kk moves the chunk by 2 kk, an XOR.
      p_cur ^= 1u;
      const uint32_t base = p_store + p_cur * kC * L::kPTile;
#pragma unroll
      for (int kk = 0; kk < kBlockN / 32; ++kk) stmatrix_x4(base ^ uint32_t(32 * kk), p[kk]);
      // (The fence that makes these stores visible to wgmma is in pv.)
      //! [p_to_smem]
    }
  }
  __device__ void fence_out() {
    fence_operands(out);
    if constexpr (kTensorSums) fence_operands(sums);
  }
};

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

//! [block_order]
/// The (Q block, plane) of work item `item`, the Q block counted from the end (the last Q block
/// of a plane first). Items start in the order of their index. Without the causal mask all
/// blocks are equally long: plane by plane, so that the blocks running at once share their
/// plane's K and V in L2. With it, a plane's last Q block is its longest: planes are taken 8 at
/// a time (their K and V still fit in L2 together), and within a group the longest Q blocks of
/// all 8 planes first, so that the grid ends on short blocks, not on a long one that started
/// late. (The bf16 variants keep plane by plane: on variant 4 this order measured 0.96-1.03x.)
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

/// The end of a split block, for one warp's 16 rows. Each piece stores its O / l and LSE in its
/// own record, then counts itself done; the warp that finds all the other pieces done merges
/// the records, in piece order so that the bits do not depend on which piece came last:
///   LSE = log2(sum_p 2^LSE_p),  O = sum_p 2^(LSE_p - LSE) O_p.
/// records: this warp's record of piece 0 (piece p's is p * stride floats further).
template <int kD, bool kQuadSum>
__device__ void merge_pieces(float (&out)[kD / 2], const float (&m)[2], float (&l)[2], int piece, int pieces,
                             float* records, int64_t stride, int* counter, const AttentionShape& shape, int bh, int row0,
                             int t, __nv_bfloat16* o, float* lse) {
  const int lane = threadIdx.x % 32;
  float inv[2], lse_log2[2];
  row_totals<kQuadSum>(m, l, inv, lse_log2);
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
    const float w[2] = {top[0] == -INFINITY ? 0.0f : exp2f(x.x - top[0]), top[1] == -INFINITY ? 0.0f : exp2f(x.y - top[1])};
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
  store_output<kD>(out, inv, lse_log2, shape, bh, row0, t, o, lse);
}
//! [merge_pieces]

template <int kD>
__global__ void __launch_bounds__(128 * (1 + kConsumers8<kD>), 1)
    flash3_fp8_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                      const __grid_constant__ CUtensorMap tm_vt, AttentionShape shape, Fp8Scales scales, Fp8Grid grid,
                      __nv_bfloat16* o, float* lse) {
  using L = Fp8Smem<kD>;
  constexpr int kC = L::kC, kBlockM = 64 * kC;
  extern __shared__ unsigned char shared_raw[];
  unsigned char* smem = aligned_smem(shared_raw);
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + L::kBars);
  uint64_t* k_full = q_full + 1;
  uint64_t* v_full = k_full + kStages;
  uint64_t* k_empty = v_full + kStages;
  uint64_t* v_empty = k_empty + kStages;

  const int tid = threadIdx.x, wg = tid / 128;
  const Piece work(grid, blockIdx.x);
  int q_block, bh;
  longest_first(kC == 3 && shape.causal, work.item, grid.q_blocks, grid.planes, q_block, bh);  // two consumers: plane by plane
  // With three consumers, when the 64-row groups do not fill the last block, the first block is
  // the short one (under the causal mask the cheapest), not the last: its first consumers have no
  // rows (TMA fills Q rows above 0 with zeros) and only keep the ring's counts.
  const int empty_groups = kC == 3 ? (3 - (shape.seq_q + 63) / 64 % 3) % 3 : 0;
  const int i0 = q_block * kBlockM - 64 * empty_groups;
  const int kv_plane = (bh / shape.heads_q) * shape.heads_kv + shape.kv_head(bh % shape.heads_q);
  const int key_end = shape.causal ? shape.visible_keys(min(i0 + kBlockM, shape.seq_q) - 1) : shape.seq_kv;
  const int all_tiles = key_end > 0 ? (key_end + kBlockN - 1) / kBlockN : 0;
  // This piece's share of the tiles: [tile0, tile0 + n_tiles).
  const int tile0 = all_tiles * work.piece / work.pieces, n_tiles = all_tiles * (work.piece + 1) / work.pieces - tile0;

  if (Fp8Ops<kD>::kTensorSums) {  // the all-ones B of the row-sum wgmma (e4m3 1.0 = 0x38)
    if (tid < 256) reinterpret_cast<uint32_t*>(smem + L::kOnes)[tid] = 0x38383838u;
    fence_proxy_async_shared();  // seen by wgmma after init_ring's __syncthreads
  }
  init_ring(q_full, k_full, v_full, kStages, k_empty, v_empty, 128 * kC);

  if (wg == 0) {  // the producer, as in variant 3; V^T tiles are (keys, d rows) boxes
    setmaxnreg_dec<24>();
    if (tid == 0) {
      mbarrier_arrive_expect_tx(q_full, L::kQTile);
      tma_load_3d(smem + L::kQ, &tm_q, 0, i0, bh, q_full);
      produce_kv(
          n_tiles, kStages, k_empty, v_empty,
          [&](int j, int stage) {
            mbarrier_arrive_expect_tx(&k_full[stage], L::kTile);
            tma_load_3d(smem + L::kK + stage * L::kTile, &tm_k, 0, (tile0 + j) * kBlockN, kv_plane, &k_full[stage]);
          },
          [&](int j, int stage) {
            mbarrier_arrive_expect_tx(&v_full[stage], L::kTile);
            tma_load_3d(smem + L::kV + stage * L::kTile, &tm_vt, (tile0 + j) * kBlockN, 0, kv_plane, &v_full[stage]);
          });
    }
    return;
  }

  setmaxnreg_inc<kC == 2 ? 240 : 160>();  // 128 x (24 + kC x this) <= 65536 registers
  // consumer and warp through a shuffle from lane 0: the compiler then knows they are the same in
  // every lane of a warp, and keeps what derives from them in uniform registers.
  const int consumer = __shfl_sync(0xFFFFFFFFu, wg - 1, 0), warp = __shfl_sync(0xFFFFFFFFu, (tid % 128) / 32, 0);
  const int lane = tid % 32, g = lane / 4, t = lane % 4;
  const int c0 = i0 + 64 * consumer, row0 = c0 + 16 * warp + g;
  // With two consumers both take the block's tiles (their turns alternate, so both must take the
  // same number). With three, a consumer stops at its own last
  // visible tile (under the causal mask the first one's rows see up to 128 keys fewer) and only
  // waits for and releases the rest, so the ring's counts stay the same.
  int my_tiles = n_tiles;
  if (kC != 2) {
    const int my_end = c0 >= shape.seq_q || c0 < 0 ? 0 : shape.causal ? shape.visible_keys(min(c0 + 64, shape.seq_q) - 1) : shape.seq_kv;
    my_tiles = my_end > 0 ? max(0, min(tile0 + n_tiles, (my_end + kBlockN - 1) / kBlockN) - tile0) : 0;
  }
  const float scale_q = scales.q[int64_t(bh) * scales.q_blocks + min(max(c0, 0) / kRows8, scales.q_blocks - 1)];
  const float* k_scales = scales.k + int64_t(kv_plane) * scales.kv_blocks;
  const float* v_scales = scales.v + int64_t(kv_plane) * scales.kv_blocks;
  // O's unit: the largest V scale over the tiles this block reads (1 if they are all zero).
  float v_ref = 0.0f;
  for (int j = tile0 + lane; j < tile0 + my_tiles; j += 32) v_ref = fmaxf(v_ref, v_scales[j]);
  v_ref = warp_all_reduce(v_ref, MaxOp());
  if (v_ref == 0.0f) v_ref = 1.0f;
  const int first = min(tile0, scales.kv_blocks - 1);
  Fp8Ops<kD> ops{smem, smem + L::kQ + consumer * 64 * kD, k_full, v_full, k_empty, v_empty, shape, k_scales, v_scales,
                 kC == 2 ? i0 : c0, tile0, row0, t, scales.kv_blocks - 1,
                 float(shape.softmax_scale()) * 1.4426950408889634f * scale_q, v_ref, __log2f(v_ref), k_scales[first],
                 v_scales[first], smem + L::kP + consumer * L::kPTile,
                 smem_addr(smem + L::kP + consumer * L::kPTile) + p_matrix_row(warp, lane)};
  ops.smem_lo = desc_lo(smem, 16);
  mbarrier_wait(q_full, 0);
  pingpong_schedule</*kTurns=*/kC == 2, /*kPackEarly=*/kC == 3, /*kLateV=*/kC == 3>(ops, my_tiles, consumer);
  ops.add_sums();  // the last tile's row sums (no rescale follows it)
  for (int j = my_tiles; j < n_tiles; ++j) {
    ops.wait_k(j);
    ops.release_k(j);
    ops.wait_v(j);
    ops.release_v(j);
  }
  // O_true = out * v_ref / 2^8 / l, with l itself 2^8 too large: take the 2^8 out of l (for the
  // LSE), and put it into the factor.
  static_assert(kPScale == 256.0f, "the exponent offset passed to online_softmax is log2(kPScale)");
  const float factor[2] = {ops.v_ref / kPScale, ops.v_ref / kPScale};
  ops.l[0] /= kPScale;
  ops.l[1] /= kPScale;
  rescale_output<kD>(ops.out, factor);
  if (c0 < 0) return;  // an empty group of the short block
  constexpr bool kQuadSum = !Fp8Ops<kD>::kTensorSums;  // tensor-core row sums are whole rows already
  if (work.pieces == 1) {
    write_output<kD, kQuadSum>(ops.out, ops.m, ops.l, shape, bh, row0, t, o, lse);
  } else {
    const int warp_slot = consumer * 4 + warp;  // this warp's record and counter within the block's
    constexpr int64_t kRecord = kRecordFloats<kD>, kBlockRecords = kC * 4 * kRecord;
    merge_pieces<kD, kQuadSum>(ops.out, ops.m, ops.l, work.piece, work.pieces,
                     grid.records + int64_t(work.tail) * work.pieces * kBlockRecords + warp_slot * kRecord, kBlockRecords,
                     grid.counters + int64_t(work.tail) * kC * 4 + warp_slot, shape, bh, row0, t, o, lse);
  }
}

// ---- host ---------------------------------------------------------------------------------

/// Q blocks per plane for the attention kernel: 64-row groups, kConsumers8 of them per block.
int fp8_q_blocks(const AttentionShape& s) {
  const int consumers = s.head_dim == 128 ? kConsumers8<128> : kConsumers8<64>;
  return ((s.seq_q + 63) / 64 + consumers - 1) / consumers;
}

/// Block slots on the current GPU for the attention kernel at head_dim kD (SMs x blocks per SM),
/// or 0 when there is no GPU to ask.
template <int kD>
int fp8_block_slots() {
  int device = 0, sms = 0, per_sm = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  auto kernel = flash3_fp8_kernel<kD>;
  constexpr int kBytes = Fp8Smem<kD>::kBytes;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes));
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 128 * (1 + kConsumers8<kD>), kBytes));
  return sms * per_sm;
}

struct Fp8Workspace {
  uint8_t *q8, *k8, *vt8;
  float *q_scales, *k_scales, *v_scales;
  float* records;  // the split tail's partial results (Fp8Grid)
  int* counters;
  int q_blocks, kv_blocks, kv_padded, counter_count;
  Fp8TailSplit split;
  std::size_t bytes;  // all of it, each part 256-byte aligned
};

Fp8Workspace carve_workspace(const AttentionShape& s, void* base) {
  auto align = [](std::size_t x) { return (x + 255) / 256 * 256; };
  Fp8Workspace w{};
  w.q_blocks = (s.seq_q + kRows8 - 1) / kRows8;
  w.kv_blocks = (s.seq_kv + kRows8 - 1) / kRows8;
  w.kv_padded = w.kv_blocks * kRows8;
  w.split = fp8_tail_split(s);
  const int64_t planes_q = int64_t(s.batch) * s.heads_q, planes_kv = int64_t(s.batch) * s.heads_kv;
  auto* p = static_cast<unsigned char*>(base);
  std::size_t at = 0;
  auto take = [&](std::size_t bytes) {
    unsigned char* r = p ? p + at : nullptr;
    at += align(bytes);
    return r;
  };
  const std::size_t d = std::size_t(s.head_dim);
  w.q8 = take(std::size_t(planes_q) * s.seq_q * d);
  w.k8 = take(std::size_t(planes_kv) * s.seq_kv * d);
  w.vt8 = take(std::size_t(planes_kv) * d * w.kv_padded);
  w.q_scales = reinterpret_cast<float*>(take(std::size_t(planes_q) * w.q_blocks * sizeof(float)));
  w.k_scales = reinterpret_cast<float*>(take(std::size_t(planes_kv) * w.kv_blocks * sizeof(float)));
  w.v_scales = reinterpret_cast<float*>(take(std::size_t(planes_kv) * w.kv_blocks * sizeof(float)));
  // One record per warp of every piece of every tail block; one counter per warp of every tail block.
  const int warps = 4 * (s.head_dim == 128 ? kConsumers8<128> : kConsumers8<64>);
  const int record = s.head_dim == 128 ? kRecordFloats<128> : kRecordFloats<64>;
  const int split_warps = w.split.pieces > 1 ? w.split.tail * warps : 0;
  w.counter_count = split_warps;
  w.records = reinterpret_cast<float*>(take(std::size_t(split_warps) * w.split.pieces * record * sizeof(float)));
  w.counters = reinterpret_cast<int*>(take(std::size_t(split_warps) * sizeof(int)));
  w.bytes = at;
  return w;
}

/// Sizes only (base = nullptr) or lays the parts out in `base`.
std::size_t fp8_workspace_bytes(const AttentionShape& s) { return carve_workspace(s, nullptr).bytes; }

template <int kD, bool kRotate>
void launch_fp8_dim(const ForwardParams& p) {
  const AttentionShape& s = p.shape;
  const Fp8Workspace w = carve_workspace(s, p.workspace);
  const int planes_q = s.batch * s.heads_q, planes_kv = s.batch * s.heads_kv;
  const auto* q = static_cast<const __nv_bfloat16*>(p.q);
  const auto* k = static_cast<const __nv_bfloat16*>(p.k);
  const auto* v = static_cast<const __nv_bfloat16*>(p.v);
  quantize_rotated_kernel<kD, kRotate>
      <<<dim3(w.q_blocks, planes_q), kPrepThreads, 0, p.stream>>>(q, s.seq_q, w.q8, w.q_scales, w.counters, w.counter_count);
  CUDA_CHECK_LAUNCH();
  quantize_rotated_kernel<kD, kRotate>
      <<<dim3(w.kv_blocks, planes_kv), kPrepThreads, 0, p.stream>>>(k, s.seq_kv, w.k8, w.k_scales, nullptr, 0);
  CUDA_CHECK_LAUNCH();
  quantize_v_kernel<kD><<<dim3(w.kv_blocks, planes_kv), kPrepThreads, 0, p.stream>>>(v, s.seq_kv, w.kv_padded, w.vt8, w.v_scales);
  CUDA_CHECK_LAUNCH();
  mark_phase(p.stream, "quantize");

  // Q and K rows are kD bytes (64- or 128-byte swizzle); V^T rows are 128 keys = 128 bytes. A Q
  // box is 64 rows per consumer warpgroup.
  constexpr int kC = kConsumers8<kD>;
  const CUtensorMap tm_q = make_tensor_map_swizzled(w.q8, 1, kD, s.seq_q, planes_q, 64 * kC, kD);
  const CUtensorMap tm_k = make_tensor_map_swizzled(w.k8, 1, kD, s.seq_kv, planes_kv, kRows8, kD);
  const CUtensorMap tm_vt = make_tensor_map_swizzled(w.vt8, 1, w.kv_padded, kD, planes_kv, kD, 128);
  const Fp8Scales scales{w.q_scales, w.k_scales, w.v_scales, w.q_blocks, w.kv_blocks};
  auto kernel = flash3_fp8_kernel<kD>;
  constexpr int kBytes = Fp8Smem<kD>::kBytes;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes));
  const int q_blocks = fp8_q_blocks(s);
  const Fp8TailSplit& split = w.split;
  const int split_from = split.blocks - (split.pieces > 1 ? split.tail : 0);
  const Fp8Grid grid{q_blocks, planes_q, split_from, split.pieces, w.records, w.counters};
  const unsigned blocks = unsigned(split_from + (split.blocks - split_from) * split.pieces);
  kernel<<<blocks, 128 * (1 + kC), kBytes, p.stream>>>(tm_q, tm_k, tm_vt, s, scales, grid, static_cast<__nv_bfloat16*>(p.o),
                                                      p.lse);
  CUDA_CHECK_LAUNCH();
  mark_phase(p.stream, "attention");
}

template <bool kRotate>
void launch_fp8(const ForwardParams& p) {
  if (p.shape.head_dim == 64) {
    launch_fp8_dim<64, kRotate>(p);
  } else {
    launch_fp8_dim<128, kRotate>(p);
  }
}


ForwardKernel fp8_kernel(const char* name, int number, const char* variant, const char* summary,
                         void (*launch)(const ForwardParams&)) {
  ForwardKernel k{name, 6, number, variant, DType::BF16, summary, launch};
  k.supports = hopper_support;  // head_dim 64 or 128, an sm_90 GPU
  k.workspace_bytes = fp8_workspace_bytes;
  k.tolerance = fp8_tolerance();
  return k;
}

}  // namespace

Fp8TailSplit fp8_tail_split(const AttentionShape& s) {
  Fp8TailSplit split;
  if (s.head_dim != 64 && s.head_dim != 128) return split;
  split.blocks = fp8_q_blocks(s) * s.batch * s.heads_q;
  if (s.causal) return split;  // causal blocks differ in length: longest first instead
  // The block slots, asked once per device (the answer does not change).
  static int cached[64][2] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device >= 64) {
    (void)cudaGetLastError();
    return split;
  }
  int& slots = cached[device][s.head_dim == 128];
  if (slots == 0) slots = s.head_dim == 128 ? fp8_block_slots<128>() : fp8_block_slots<64>();
  split.slots = slots;
  if (split.slots == 0) return split;
  split.tail = split.blocks % split.slots;
  split.pieces = tail_pieces(split.blocks, split.slots, (s.seq_kv + kBlockN - 1) / kBlockN);
  return split;
}

FA_REGISTER_FORWARD_KERNEL(fp8_kernel("ch06_fp8", 5, "fp8",
                                      "variant 4 on e4m3: Hadamard-rotated, block-scaled Q/K/V (quantized on the GPU), P in e4m3, bf16 out",
                                      launch_fp8<true>));
FA_REGISTER_FORWARD_KERNEL(fp8_kernel("ch06_fp8_plain", 6, "fp8_plain",
                                      "control for variant 5: the same kernel without the Hadamard rotation (block scales only)",
                                      launch_fp8<false>));
}  // namespace fa::flash3
