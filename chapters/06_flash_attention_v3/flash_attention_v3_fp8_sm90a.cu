// Chapter 06, variant 5 -- `fp8`: variant 3's warp-specialized kernel on e4m3 operands, with
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
// The attention kernel (variant 3's producer/consumer structure):
//   S = Q8 K8^T with wgmma.m64n128k32.e4m3, times scale_q * scale_k folded into the exponent;
//   P * 2^8 rounded to e4m3 in registers (2^8 keeps small probabilities above e4m3's floor);
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
constexpr int kConsumers = 2, kThreads = 128 * (1 + kConsumers), kStages = 2;
constexpr int kTileBytes8 = kRows8 * 128;    // one 128 x 128-byte tile of Q, K or V^T

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

/// Q or K: thread r of block (b, plane) takes row 128b + r; signs, Hadamard, block scale, e4m3.
__global__ void __launch_bounds__(128) quantize_rotated_kernel(const __nv_bfloat16* x, int rows, uint8_t* x8,
                                                               float* scales) {
  __shared__ float scratch[4];
  const int plane = blockIdx.y, row = blockIdx.x * kRows8 + threadIdx.x;
  const bool valid = row < rows;
  float v[kD8];
  const __nv_bfloat16* src = x + (int64_t(plane) * rows + row) * kD8;
#pragma unroll
  for (int c = 0; c < kD8; ++c) {
    const float sign = (splitmix64(kSignSeed + uint64_t(c)) >> 63) ? -1.0f : 1.0f;
    v[c] = valid ? sign * __bfloat162float(src[c]) : 0.0f;
  }
  //! [device_hadamard]
  // The fast Walsh-Hadamard transform: 7 stages of butterflies, all in this thread's registers.
#pragma unroll
  for (int half = 1; half < kD8; half *= 2)
#pragma unroll
    for (int i = 0; i < kD8; i += 2 * half)
#pragma unroll
      for (int j = i; j < i + half; ++j) {
        const float a = v[j], b = v[j + half];
        v[j] = a + b;
        v[j + half] = a - b;
      }
  //! [device_hadamard]
  float amax = 0.0f;
#pragma unroll
  for (int c = 0; c < kD8; ++c) amax = fmaxf(amax, fabsf(v[c]));
  amax = block_amax(amax * 0.08838834764831845f, scratch);  // 1 / sqrt(128): the orthogonal H
  const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
  if (threadIdx.x == 0) scales[int64_t(plane) * gridDim.x + blockIdx.x] = scale;
  if (!valid) return;
  const float inv = 0.08838834764831845f / scale;
  uint4* dst = reinterpret_cast<uint4*>(x8 + (int64_t(plane) * rows + row) * kD8);
#pragma unroll
  for (int c = 0; c < kD8; c += 16) {
    dst[c / 16] = make_uint4(e4m3x4(v[c] * inv, v[c + 1] * inv, v[c + 2] * inv, v[c + 3] * inv),
                             e4m3x4(v[c + 4] * inv, v[c + 5] * inv, v[c + 6] * inv, v[c + 7] * inv),
                             e4m3x4(v[c + 8] * inv, v[c + 9] * inv, v[c + 10] * inv, v[c + 11] * inv),
                             e4m3x4(v[c + 12] * inv, v[c + 13] * inv, v[c + 14] * inv, v[c + 15] * inv));
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
__global__ void __launch_bounds__(128) quantize_v_kernel(const __nv_bfloat16* v, int rows, int rows_padded, uint8_t* vt8,
                                                         float* scales) {
  __shared__ float scratch[4];
  __shared__ uint8_t tile[kD8][kRows8 + 16];  // [x][slot], rows padded against bank conflicts
  const int plane = blockIdx.y, key = blockIdx.x * kRows8 + threadIdx.x;
  const bool valid = key < rows;
  float x[kD8];
  const __nv_bfloat16* src = v + (int64_t(plane) * rows + key) * kD8;
#pragma unroll
  for (int c = 0; c < kD8; ++c) x[c] = valid ? __bfloat162float(src[c]) : 0.0f;
  float amax = 0.0f;
#pragma unroll
  for (int c = 0; c < kD8; ++c) amax = fmaxf(amax, fabsf(x[c]));
  amax = block_amax(amax, scratch);
  const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
  if (threadIdx.x == 0) scales[int64_t(plane) * gridDim.x + blockIdx.x] = scale;
  const int slot = (threadIdx.x / 32) * 32 + p_key_slot(threadIdx.x % 32);
#pragma unroll
  for (int c = 0; c < kD8; c += 2) {
    const uint32_t pair = __nv_cvt_float2_to_fp8x2(make_float2(x[c] / scale, x[c + 1] / scale), __NV_SATFINITE, __NV_E4M3);
    tile[c][slot] = uint8_t(pair & 0xFF);
    tile[c + 1][slot] = uint8_t(pair >> 8);
  }
  __syncthreads();
  // 128 rows of 128 bytes, 16 bytes per thread per step.
  for (int e = threadIdx.x; e < kD8 * 8; e += 128) {
    const int r = e / 8, c = e % 8;
    uint4 chunk;
    memcpy(&chunk, &tile[r][c * 16], 16);
    *reinterpret_cast<uint4*>(vt8 + (int64_t(plane) * kD8 + r) * rows_padded + blockIdx.x * kRows8 + c * 16) = chunk;
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

__global__ void __launch_bounds__(kThreads, 1)
    flash3_fp8_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                      const __grid_constant__ CUtensorMap tm_vt, AttentionShape shape, Fp8Scales scales,
                      __nv_bfloat16* o, float* lse) {
  constexpr int kBlockM = 64 * kConsumers;
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
  const unsigned char* q_rows = smem + kQ8 + consumer * 64 * 128;
  const float scale_q = scales.q[int64_t(bh) * scales.q_blocks + q_block];
  const float scale_log2 = float(shape.softmax_scale()) * 1.4426950408889634f * scale_q;
  float out[kD8 / 2] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float v_scale = 1.0f;  // O is kept in units of the current V block's scale
  mbarrier_wait(q_full, 0);

  for (int j = 0; j < n_tiles; ++j) {
    const int stage = j % kStages;
    const uint32_t phase = (j / kStages) & 1;
    const float k_scale = scales.k[int64_t(kv_plane) * scales.kv_blocks + j];
    const float v_scale_j = scales.v[int64_t(kv_plane) * scales.kv_blocks + j];
    mbarrier_wait(&k_full[stage], phase);
    //! [fp8_scores]
    // S = Q8 K8^T: 4 wgmma of k = 32 bytes; then the true scores are S * scale_q * scale_k.
    float s[kBlockN / 2];
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kD8 / 32; ++ks) {
      const uint64_t a = make_desc_sw128(q_rows + ks * 32, 16, 1024);
      const uint64_t b = make_desc_sw128(smem + kK8 + stage * kTileBytes8 + ks * 32, 16, 1024);
      wgmma_m64n128k32_e4m3_ss(s, a, b, ks > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(s);
    //! [fp8_scores]
    mbarrier_arrive(&k_empty[stage]);

    if (tile_needs_mask(shape, i0, kBlockM, j * kBlockN)) mask_scores(s, shape, row0, j * kBlockN, t);
    float rescale[2];
    online_softmax(s, m, l, rescale, scale_log2 * k_scale);
    // O holds the old tile's units (v_scale); bring it to the new max and to V_j's units.
    const float units = v_scale / v_scale_j;
    rescale[0] *= units;
    rescale[1] *= units;
    v_scale = v_scale_j;
    rescale_output<kD8>(out, rescale);
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) s[i] *= kPScale;
    uint32_t p[kBlockN / 32][4];
    pack_p_e4m3(s, p);

    mbarrier_wait(&v_full[stage], phase);
    //! [fp8_pv]
    // O += P8 V8: B = V^T tile, K-major (keys contiguous in each of the 128 rows of d).
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 32; ++kk) {
      const uint64_t b = make_desc_sw128(smem + kV8 + stage * kTileBytes8 + kk * 32, 16, 1024);
      wgmma_m64n128k32_e4m3_rs(out, p[kk], b, true);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(out);
    //! [fp8_pv]
    mbarrier_arrive(&v_empty[stage]);
  }
  // O_true = out * v_scale / 2^8, then / l.
  float factor[2] = {v_scale / kPScale, v_scale / kPScale};
  rescale_output<kD8>(out, factor);
  write_output<kD8>(out, m, l, shape, bh, row0, t, o, lse);
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

void launch_fp8(const ForwardParams& p) {
  const AttentionShape& s = p.shape;
  const Fp8Workspace w = carve_workspace(s, p.workspace);
  const int planes_q = s.batch * s.heads_q, planes_kv = s.batch * s.heads_kv;
  quantize_rotated_kernel<<<dim3(w.q_blocks, planes_q), 128, 0, p.stream>>>(static_cast<const __nv_bfloat16*>(p.q), s.seq_q,
                                                                             w.q8, w.q_scales);
  CUDA_CHECK_LAUNCH();
  quantize_rotated_kernel<<<dim3(w.kv_blocks, planes_kv), 128, 0, p.stream>>>(static_cast<const __nv_bfloat16*>(p.k),
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

ForwardKernel fp8_kernel() {
  ForwardKernel k{"ch06_fp8", 6, 5, "fp8", DType::BF16,
                  "variant 3 on e4m3: Hadamard-rotated, block-scaled Q/K/V (quantized on the GPU), P in e4m3, bf16 out",
                  launch_fp8};
  k.supports = fp8_support;
  k.workspace_bytes = fp8_workspace_bytes;
  k.tolerance = fp8_tolerance();
  return k;
}

}  // namespace

FA_REGISTER_FORWARD_KERNEL(fp8_kernel());

}  // namespace fa::flash3
