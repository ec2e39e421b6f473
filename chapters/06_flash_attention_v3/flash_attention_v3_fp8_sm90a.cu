// Chapter 06, variant 5 -- `fp8`: variant 4's warp-specialized ping-pong kernel on e4m3 operands, with
// FlashAttention-3's two accuracy tricks. bf16 in and out; head_dim 128.
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
//   O += P8 V8 with O kept in units of the current V block's scale (one more factor in the
//   per-row rescale), and O / (2^8 l) at the end.
// The CPU model of all this, and its accuracy experiment, is algorithm.h / tests/cpu/test_fp8.cpp.
// Run: build/bin/ch06_flash_attention_v3 --variant fp8
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "algorithm.h"
#include "compare.h"
#include "cuda_check.h"
#include "flash3_tile.cuh"
#include "flash_attention_v3.h"
#include "phase_timer.h"
#include "random.h"
#include "registry.h"
#include "tma.h"

namespace fa::flash3 {
namespace {

using namespace fa::hopper;

constexpr int kD8 = 128;                     // head_dim (one 128-byte row of e4m3)
constexpr int kRows8 = 128;                  // rows per Q block, keys per K/V block (and per scale)
constexpr uint64_t kSignSeed = 0x5EED;       // the incoherent-processing signs (as algorithm.h)
constexpr int kConsumers = 2, kThreads = 128 * (1 + kConsumers), kStages = 4;  // e4m3 tiles are small: 4 stages fit
constexpr int kTileBytes8 = kRows8 * 128;    // one 128 x 128-byte tile of Q, K or V^T
constexpr int kBlockM8 = 64 * kConsumers;   // = kRows8: a Q tile is one scale block

// ---- preprocessing ------------------------------------------------------------------------

/// Largest |x| over the block's threads (128), through shared memory.
__device__ inline float block_amax(float v, float* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  v = fmaxf(fmaxf(scratch[0], scratch[1]), fmaxf(scratch[2], scratch[3]));
  __syncthreads();
  return v;
}

/// Four floats (already divided by the scale) as four e4m3 bytes, the first in the lowest byte.
__device__ inline uint32_t e4m3x4(float a, float b, float c, float d) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
}

/// Row `row` of a plane as this lane's 4 floats (columns 4 lane .. 4 lane + 3), zeros past the end.
__device__ inline float4 load_row4(const __nv_bfloat16* plane_base, int row, int rows, int lane) {
  if (row >= rows) return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const uint2 raw = *reinterpret_cast<const uint2*>(plane_base + int64_t(row) * kD8 + 4 * lane);
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
  return make_float4(a.x, a.y, b.x, b.y);
}

//! [device_hadamard]
/// x <- x * diag(signs) * H / sqrt(128) for one row spread over a warp (lane l holds columns
/// 4l .. 4l + 3). Butterflies of distance 1 and 2 stay inside a lane; distance 4 .. 64 pairs
/// lane l with lane l ^ (distance / 4), one shuffle per value.
__device__ inline void rotate_row(float (&v)[4], int lane) {
#pragma unroll
  for (int e = 0; e < 4; ++e) v[e] *= (splitmix64(kSignSeed + uint64_t(4 * lane + e)) >> 63) ? -1.0f : 1.0f;
#pragma unroll
  for (int half = 1; half < 4; half *= 2)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (!(e & half)) {
        const float a = v[e], b = v[e + half];
        v[e] = a + b;
        v[e + half] = a - b;
      }
#pragma unroll
  for (int lanes = 1; lanes < 32; lanes *= 2) {
    const bool upper = lane & lanes;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float other = __shfl_xor_sync(0xFFFFFFFFu, v[e], lanes);
      v[e] = upper ? other - v[e] : v[e] + other;
    }
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) v[e] *= 0.08838834764831845f;  // 1 / sqrt(128)
}
//! [device_hadamard]

/// Q or K, one block per (128-row block, plane), one warp per 32 rows (a row is 256 coalesced
/// bytes): rotate (unless kRotate is off: the control kernel), take the block's largest |x|,
/// then e4m3 with that block's scale.
template <bool kRotate>
__global__ void __launch_bounds__(128) quantize_rotated_kernel(const __nv_bfloat16* x, int rows, uint8_t* x8,
                                                               float* scales) {
  __shared__ float scratch[4];
  const int plane = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row0 = blockIdx.x * kRows8 + 32 * warp;
  const __nv_bfloat16* base = x + int64_t(plane) * rows * kD8;
  float v[32][4];
  float amax = 0.0f;
#pragma unroll
  for (int r = 0; r < 32; ++r) {
    const float4 f = load_row4(base, row0 + r, rows, lane);
    v[r][0] = f.x, v[r][1] = f.y, v[r][2] = f.z, v[r][3] = f.w;
    if constexpr (kRotate) rotate_row(v[r], lane);
#pragma unroll
    for (int e = 0; e < 4; ++e) amax = fmaxf(amax, fabsf(v[r][e]));
  }
  amax = block_amax(amax, scratch);
  const float scale = amax > 0.0f ? amax / 448.0f : 1.0f, inv = 1.0f / scale;
  if (threadIdx.x == 0) scales[int64_t(plane) * gridDim.x + blockIdx.x] = scale;
  uint8_t* dst = x8 + int64_t(plane) * rows * kD8;
#pragma unroll
  for (int r = 0; r < 32; ++r)
    if (row0 + r < rows)
      *reinterpret_cast<uint32_t*>(dst + int64_t(row0 + r) * kD8 + 4 * lane) =
          e4m3x4(v[r][0] * inv, v[r][1] * inv, v[r][2] * inv, v[r][3] * inv);
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
/// One warp per 32 keys (coalesced reads); the transpose goes through shared memory so the
/// writes are 128-byte rows too.
__global__ void __launch_bounds__(128) quantize_v_kernel(const __nv_bfloat16* v, int rows, int rows_padded, uint8_t* vt8,
                                                         float* scales) {
  __shared__ float scratch[4];
  __shared__ __align__(16) uint8_t tile[kD8][kRows8 + 16];  // [x][slot], rows padded against bank conflicts
  const int plane = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int key0 = blockIdx.x * kRows8 + 32 * warp;
  const __nv_bfloat16* base = v + int64_t(plane) * rows * kD8;
  float x[32][4];
  float amax = 0.0f;
#pragma unroll
  for (int r = 0; r < 32; ++r) {
    const float4 f = load_row4(base, key0 + r, rows, lane);
    x[r][0] = f.x, x[r][1] = f.y, x[r][2] = f.z, x[r][3] = f.w;
    amax = fmaxf(amax, fmaxf(fmaxf(fabsf(f.x), fabsf(f.y)), fmaxf(fabsf(f.z), fabsf(f.w))));
  }
  amax = block_amax(amax, scratch);
  const float scale = amax > 0.0f ? amax / 448.0f : 1.0f, inv = 1.0f / scale;
  if (threadIdx.x == 0) scales[int64_t(plane) * gridDim.x + blockIdx.x] = scale;
#pragma unroll
  for (int r = 0; r < 32; ++r) {
    const int slot = 32 * warp + p_key_slot(r);
    const uint32_t q4 = e4m3x4(x[r][0] * inv, x[r][1] * inv, x[r][2] * inv, x[r][3] * inv);
#pragma unroll
    for (int e = 0; e < 4; ++e) tile[4 * lane + e][slot] = uint8_t(q4 >> (8 * e));
  }
  __syncthreads();
  for (int e = threadIdx.x; e < kD8 * 8; e += 128) {
    const int r = e / 8, c = e % 8;
    *reinterpret_cast<uint4*>(vt8 + (int64_t(plane) * kD8 + r) * rows_padded + blockIdx.x * kRows8 + c * 16) =
        *reinterpret_cast<const uint4*>(&tile[r][c * 16]);
  }
}

// ---- attention ----------------------------------------------------------------------------

struct Fp8Scales {
  const float* q;  // [planes_q][q blocks]
  const float* k;  // [planes_kv][kv blocks]
  const float* v;
  int q_blocks, kv_blocks;
};

// Q tile, kStages K tiles, kStages V^T tiles; barriers q_full, k_full, v_full, k_empty, v_empty.
constexpr int kQ8 = 0, kK8 = kTileBytes8, kV8 = kK8 + kStages * kTileBytes8, kBars8 = kV8 + kStages * kTileBytes8;
constexpr int kSmemBytes8 = kBars8 + 8 * (1 + 4 * kStages) + 1024;

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

/// The e4m3 operations variant 4's schedule (pingpong_schedule in flash3_tile.cuh) runs here.
struct Fp8Ops {
  unsigned char* smem;
  const unsigned char* q_rows;
  uint64_t *k_full, *v_full, *k_empty, *v_empty;
  AttentionShape shape;
  Fp8Scales scales;
  int i0, row0, t, kv_plane;
  float scale_log2;  // softmax scale * log2(e) * this Q block's scale
  float out[kD8 / 2];
  float m[2], l[2];
  float v_scale;  // O is kept in units of the current V block's scale
  uint32_t p[kBlockN / 32][4];

  __device__ static uint32_t phase(int j) { return uint32_t((j / kStages) & 1); }
  __device__ void wait_k(int j) { mbarrier_wait(&k_full[j % kStages], phase(j)); }
  __device__ void wait_v(int j) { mbarrier_wait(&v_full[j % kStages], phase(j)); }
  __device__ void release_k(int j) { mbarrier_arrive(&k_empty[j % kStages]); }
  __device__ void release_v(int j) { mbarrier_arrive(&v_empty[j % kStages]); }
  __device__ void scores(int j, float (&s)[kBlockN / 2]) {
    //! [fp8_scores]
    // S = Q8 K8^T: 4 wgmma of k = 32 bytes; the true scores are S * scale_q * scale_k.
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kD8 / 32; ++ks) {
      const uint64_t a = make_desc_sw128(q_rows + ks * 32, 16, 1024);
      const uint64_t b = make_desc_sw128(smem + kK8 + (j % kStages) * kTileBytes8 + ks * 32, 16, 1024);
      wgmma_m64n128k32_e4m3_ss(s, a, b, ks > 0);
    }
    wgmma_commit();
    //! [fp8_scores]
  }
  __device__ void pv(int j) {
    //! [fp8_pv]
    // O += P8 V8: B = the V^T tile, K-major (keys contiguous in each of the 128 rows of d).
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 32; ++kk) {
      const uint64_t b = make_desc_sw128(smem + kV8 + (j % kStages) * kTileBytes8 + kk * 32, 16, 1024);
      wgmma_m64n128k32_e4m3_rs(out, p[kk], b, true);
    }
    wgmma_commit();
    //! [fp8_pv]
  }
  __device__ void softmax(int j, float (&s)[kBlockN / 2], float (&rescale)[2]) {
    if (tile_needs_mask(shape, i0, kBlockM8, j * kBlockN)) mask_scores(s, shape, row0, j * kBlockN, t);
    // P comes out times 2^8 (kPScale), ready for e4m3; l carries the same factor.
    online_softmax(s, m, l, rescale, scale_log2 * scales.k[int64_t(kv_plane) * scales.kv_blocks + j], 8.0f);
    // O also changes units, from the old V block's scale to V_j's.
    const float v_scale_j = scales.v[int64_t(kv_plane) * scales.kv_blocks + j], units = v_scale / v_scale_j;
    rescale[0] *= units;
    rescale[1] *= units;
    v_scale = v_scale_j;
  }
  __device__ void rescale_out(const float (&rescale)[2]) { rescale_output<kD8>(out, rescale); }
  __device__ void pack(const float (&s)[kBlockN / 2]) { pack_p_e4m3(s, p); }
  __device__ void fence_out() { fence_operands(out); }
};

__global__ void __launch_bounds__(kThreads, 1)
    flash3_fp8_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                      const __grid_constant__ CUtensorMap tm_vt, AttentionShape shape, Fp8Scales scales,
                      __nv_bfloat16* o, float* lse) {
  constexpr int kBlockM = kBlockM8;
  extern __shared__ unsigned char shared_raw[];
  unsigned char* smem = aligned_smem(shared_raw);
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + kBars8);
  uint64_t* k_full = q_full + 1;
  uint64_t* v_full = k_full + kStages;
  uint64_t* k_empty = v_full + kStages;
  uint64_t* v_empty = k_empty + kStages;

  const int tid = threadIdx.x, wg = tid / 128, bh = blockIdx.y;
  const int q_block = gridDim.x - 1 - blockIdx.x, i0 = q_block * kBlockM;
  const int kv_plane = (bh / shape.heads_q) * shape.heads_kv + shape.kv_head(bh % shape.heads_q);
  const int key_end = shape.causal ? shape.visible_keys(min(i0 + kBlockM, shape.seq_q) - 1) : shape.seq_kv;
  const int n_tiles = key_end > 0 ? (key_end + kBlockN - 1) / kBlockN : 0;

  if (tid == 0) {
    mbarrier_init(q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&k_full[s], 1);
      mbarrier_init(&v_full[s], 1);
      mbarrier_init(&k_empty[s], 128 * kConsumers);
      mbarrier_init(&v_empty[s], 128 * kConsumers);
    }
    fence_barrier_init();
  }
  __syncthreads();

  if (wg == 0) {  // the producer, as in variant 3; V^T tiles are (keys, d rows) boxes
    setmaxnreg_dec<24>();
    if (tid == 0) {
      mbarrier_arrive_expect_tx(q_full, kTileBytes8);
      tma_load_3d(smem + kQ8, &tm_q, 0, i0, bh, q_full);
      for (int j = 0; j < n_tiles; ++j) {
        const int stage = j % kStages;
        const uint32_t previous_use = ((j / kStages) & 1) ^ 1;
        if (j >= kStages) mbarrier_wait(&k_empty[stage], previous_use);
        mbarrier_arrive_expect_tx(&k_full[stage], kTileBytes8);
        tma_load_3d(smem + kK8 + stage * kTileBytes8, &tm_k, 0, j * kBlockN, kv_plane, &k_full[stage]);
        if (j >= kStages) mbarrier_wait(&v_empty[stage], previous_use);
        mbarrier_arrive_expect_tx(&v_full[stage], kTileBytes8);
        tma_load_3d(smem + kV8 + stage * kTileBytes8, &tm_vt, j * kBlockN, 0, kv_plane, &v_full[stage]);
      }
    }
    return;
  }

  setmaxnreg_inc<240>();
  const int consumer = wg - 1, warp = (tid % 128) / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int row0 = i0 + 64 * consumer + 16 * warp + g;
  const float scale_q = scales.q[int64_t(bh) * scales.q_blocks + q_block];
  Fp8Ops ops{smem, smem + kQ8 + consumer * 64 * 128, k_full, v_full, k_empty, v_empty, shape, scales, i0, row0, t, kv_plane,
             float(shape.softmax_scale()) * 1.4426950408889634f * scale_q, {}, {-INFINITY, -INFINITY}, {0.0f, 0.0f}, 1.0f, {}};
  mbarrier_wait(q_full, 0);
  pingpong_schedule(ops, n_tiles, consumer);
  // O_true = out * v_scale / 2^8 / l, with l itself 2^8 too large: take the 2^8 out of l (for the
  // LSE), and put it into the factor.
  static_assert(kPScale == 256.0f, "the exponent offset passed to online_softmax is log2(kPScale)");
  const float factor[2] = {ops.v_scale / kPScale, ops.v_scale / kPScale};
  ops.l[0] /= kPScale;
  ops.l[1] /= kPScale;
  rescale_output<kD8>(ops.out, factor);
  write_output<kD8>(ops.out, ops.m, ops.l, shape, bh, row0, t, o, lse);
}

// ---- host ---------------------------------------------------------------------------------

struct Fp8Workspace {
  uint8_t *q8, *k8, *vt8;
  float *q_scales, *k_scales, *v_scales;
  int q_blocks, kv_blocks, kv_padded;
  std::size_t bytes;  // all of it, each part 256-byte aligned
};

Fp8Workspace carve_workspace(const AttentionShape& s, void* base) {
  auto align = [](std::size_t x) { return (x + 255) / 256 * 256; };
  Fp8Workspace w{};
  w.q_blocks = (s.seq_q + kRows8 - 1) / kRows8;
  w.kv_blocks = (s.seq_kv + kRows8 - 1) / kRows8;
  w.kv_padded = w.kv_blocks * kRows8;
  const int64_t planes_q = int64_t(s.batch) * s.heads_q, planes_kv = int64_t(s.batch) * s.heads_kv;
  auto* p = static_cast<unsigned char*>(base);
  std::size_t at = 0;
  auto take = [&](std::size_t bytes) {
    unsigned char* r = p ? p + at : nullptr;
    at += align(bytes);
    return r;
  };
  w.q8 = take(std::size_t(planes_q) * s.seq_q * kD8);
  w.k8 = take(std::size_t(planes_kv) * s.seq_kv * kD8);
  w.vt8 = take(std::size_t(planes_kv) * kD8 * w.kv_padded);
  w.q_scales = reinterpret_cast<float*>(take(std::size_t(planes_q) * w.q_blocks * sizeof(float)));
  w.k_scales = reinterpret_cast<float*>(take(std::size_t(planes_kv) * w.kv_blocks * sizeof(float)));
  w.v_scales = reinterpret_cast<float*>(take(std::size_t(planes_kv) * w.kv_blocks * sizeof(float)));
  w.bytes = at;
  return w;
}

/// Sizes only (base = nullptr) or lays the parts out in `base`.
std::size_t fp8_workspace_bytes(const AttentionShape& s) { return carve_workspace(s, nullptr).bytes; }

template <bool kRotate>
void launch_fp8(const ForwardParams& p) {
  const AttentionShape& s = p.shape;
  const Fp8Workspace w = carve_workspace(s, p.workspace);
  const int planes_q = s.batch * s.heads_q, planes_kv = s.batch * s.heads_kv;
  quantize_rotated_kernel<kRotate><<<dim3(w.q_blocks, planes_q), 128, 0, p.stream>>>(static_cast<const __nv_bfloat16*>(p.q), s.seq_q,
                                                                             w.q8, w.q_scales);
  CUDA_CHECK_LAUNCH();
  quantize_rotated_kernel<kRotate><<<dim3(w.kv_blocks, planes_kv), 128, 0, p.stream>>>(static_cast<const __nv_bfloat16*>(p.k),
                                                                               s.seq_kv, w.k8, w.k_scales);
  CUDA_CHECK_LAUNCH();
  quantize_v_kernel<<<dim3(w.kv_blocks, planes_kv), 128, 0, p.stream>>>(static_cast<const __nv_bfloat16*>(p.v), s.seq_kv,
                                                                         w.kv_padded, w.vt8, w.v_scales);
  CUDA_CHECK_LAUNCH();
  mark_phase(p.stream, "quantize");

  const CUtensorMap tm_q = make_tensor_map_sw128(w.q8, 1, kD8, s.seq_q, planes_q, kRows8);
  const CUtensorMap tm_k = make_tensor_map_sw128(w.k8, 1, kD8, s.seq_kv, planes_kv, kRows8);
  const CUtensorMap tm_vt = make_tensor_map_sw128(w.vt8, 1, w.kv_padded, kD8, planes_kv, kD8);
  const Fp8Scales scales{w.q_scales, w.k_scales, w.v_scales, w.q_blocks, w.kv_blocks};
  CUDA_CHECK(cudaFuncSetAttribute(flash3_fp8_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes8));
  dim3 grid(unsigned(w.q_blocks), unsigned(planes_q));
  flash3_fp8_kernel<<<grid, kThreads, kSmemBytes8, p.stream>>>(tm_q, tm_k, tm_vt, s, scales,
                                                               static_cast<__nv_bfloat16*>(p.o), p.lse);
  CUDA_CHECK_LAUNCH();
  mark_phase(p.stream, "attention");
}

std::string fp8_support(const AttentionShape& s) {
  if (s.head_dim != 128) return "the FP8 variant takes head_dim 128 only (one 128-byte e4m3 row), got " + std::to_string(s.head_dim);
  return hopper_support(s);
}

ForwardKernel fp8_kernel(const char* name, int number, const char* variant, const char* summary,
                         void (*launch)(const ForwardParams&)) {
  ForwardKernel k{name, 6, number, variant, DType::BF16, summary, launch};
  k.supports = fp8_support;
  k.workspace_bytes = fp8_workspace_bytes;
  k.tolerance = fp8_tolerance();
  return k;
}

}  // namespace

FA_REGISTER_FORWARD_KERNEL(fp8_kernel("ch06_fp8", 5, "fp8",
                                      "variant 4 on e4m3: Hadamard-rotated, block-scaled Q/K/V (quantized on the GPU), P in e4m3, bf16 out",
                                      launch_fp8<true>));
FA_REGISTER_FORWARD_KERNEL(fp8_kernel("ch06_fp8_plain", 6, "fp8_plain",
                                      "control for variant 5: the same kernel without the Hadamard rotation (block scales only)",
                                      launch_fp8<false>));

}  // namespace fa::flash3
