// Chapter 04, variant 4 -- `tuned`: variant 3's algorithm (one block per 64-row Q tile walking
// 64-key K/V tiles, FlashAttention-1's update after every tile, fp32 throughout) with the work
// arranged the way a tuned SGEMM arranges it. Four changes, each measured in the chapter doc:
//   * register blocking: each of the 128 threads owns an 8 x 4 patch of S (4 x 8 at d = 64) and
//     8 columns of the same rows of O, so one step of the inner dimension loads 8 + 4 values for
//     32 multiply-adds (variant 3: 4 + 4 for 16);
//   * vectorized shared-memory loads: every operand is read as a float4 (Q, K, P along the inner
//     dimension of their product, V along its row), from rows stored with their 16-byte chunks XOR-swizzled by (row % 8) so the
//     8 threads of a quarter-warp that read 8 different rows hit 8 different groups of banks;
//   * the softmax in registers: the 16 (8) threads that share a row reduce its max and sum with
//     shuffles (variant 3 hands each row to one thread walking 64 values in shared memory);
//   * copies that overlap the math: K_{j+1} is fetched (cp.async) while the block works on
//     P_j V_j, and V_{j+1} while it computes S_{j+1}: double buffering without a second buffer.
// The update stays FlashAttention-1's, O <- alpha O + beta P~ V_j, written as: O <- alpha O,
// then O += (beta P~) V_j, so no second accumulator of O is needed.
// head_dim 64 or 128: a thread's 8 columns of O are two float4 chunks, 64 (d = 128) or 32 apart.
// Run: build/bin/ch04_flash_attention_v1 --variant tuned
#include <cuda_runtime.h>

#include <string>

#include "algorithm.h"
#include "ampere.cuh"
#include "block_limits.h"
#include "cuda_check.h"
#include "device_utils.cuh"
#include "registry.h"
#include "row_update.cuh"
#include "tiles.h"

namespace fa::flash1 {
namespace {

constexpr int kRows = 64, kKeys = 64, kThreads = 128;

/// How many threads share a row of S (and of O): they split its 64 keys and its d columns.
/// 16 at d = 128: 8 rows x 4 keys per thread. 8 at d = 64: 4 rows x 8 keys. Chosen by
/// measurement (chapter doc: 8 at d = 128 is 0.97x, 16 at d = 64 is 0.93x).
constexpr int lanes_per_row(int d) { return d == 64 ? 8 : 16; }

/// Shared memory: Q, K, V tiles (kRows or kKeys rows of d floats) and P (kRows x kKeys), no padding.
constexpr std::size_t tuned_shared_bytes(int d) { return std::size_t(3 * kRows * d + kRows * kKeys) * sizeof(float); }

/// Where float4 chunk `chunk` of row `row` lives in a tile of `row_floats`-float rows: chunks are
/// permuted within each group of 8 (128 bytes, all 32 banks) by XOR with row % 8.
__device__ __forceinline__ int swizzled(int row, int chunk, int row_floats) {
  return row * row_floats + ((chunk ^ (row & 7)) << 2);
}

/// 16 bytes global -> shared (zeros when !valid). From sm_80 on an asynchronous cp.async that
/// bypasses registers; on older GPUs a plain load and store (the commit and wait are then no-ops).
__device__ __forceinline__ void copy16(float* dst, const float* src, bool valid) {
#if __CUDA_ARCH__ >= 800
  ampere::cp_async_16(dst, src, valid);
#else
  *reinterpret_cast<float4*>(dst) = valid ? *reinterpret_cast<const float4*>(src) : make_float4(0, 0, 0, 0);
#endif
}
__device__ __forceinline__ void copies_commit() {
#if __CUDA_ARCH__ >= 800
  ampere::cp_async_commit();
#endif
}
template <int kPending>
__device__ __forceinline__ void copies_wait() {
#if __CUDA_ARCH__ >= 800
  ampere::cp_async_wait<kPending>();
#endif
}

/// Starts copying rows [first, first + 64) of a [n_rows, kD] matrix into a tile (swizzled when
/// kSwizzle); rows past the end are zero. Consecutive threads copy consecutive chunks of a row.
template <int kD, bool kSwizzle>
__device__ void start_tile(float* tile, const float* src, int first, int n_rows) {
  constexpr int kChunks = kD / 4;
#pragma unroll
  for (int e = threadIdx.x; e < kRows * kChunks; e += kThreads) {
    const int r = e / kChunks, c = e % kChunks;
    const bool valid = first + r < n_rows;
    const float* from = src + (valid ? int64_t(first + r) * kD + 4 * c : 0);
    copy16(tile + (kSwizzle ? swizzled(r, c, kD) : r * kD + 4 * c), from, valid);
  }
}

__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float lane(const float4& v, int t) {
  return t == 0 ? v.x : t == 1 ? v.y : t == 2 ? v.z : v.w;
}

template <int kD, int kLanes>
__global__ void __launch_bounds__(kThreads)
    tuned_kernel(AttentionShape shape, const float* q, const float* k, const float* v, float* o, float* lse) {
  constexpr int kGroups = kThreads / kLanes;       // row groups: ty = thread / kLanes
  constexpr int kRowsPerThread = kRows / kGroups;  // rows ty + kGroups a
  constexpr int kKeysPerThread = kKeys / kLanes;   // keys tx + kLanes b (tx = thread % kLanes)
  constexpr int kOut = kD / (4 * kLanes);          // float4 chunks of O: columns 4 tx + 4 kLanes c
  extern __shared__ __align__(16) float shared[];
  float* q_s = shared;            // [64][kD] swizzled
  float* k_s = q_s + kRows * kD;  // [64][kD] swizzled
  float* v_s = k_s + kKeys * kD;  // [64][kD] plain: a warp reads one row at a time
  float* p_s = v_s + kKeys * kD;  // [64][64] swizzled: beta P~ of the current tile

  const int n_q = shape.seq_q, n_k = shape.seq_kv;
  const int tx = threadIdx.x % kLanes, ty = threadIdx.x / kLanes;
  // Causal: the longest rows first, so the last blocks to start are short ones.
  const int tile = shape.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int i0 = tile * kRows, bh = blockIdx.y;
  const float* q_head = q + shape.q_head_offset(bh);
  const float* k_head = k + shape.kv_head_offset(bh);
  const float* v_head = v + shape.kv_head_offset(bh);
  const float scale_log2 = float(shape.softmax_scale() * 1.4426950408889634);  // scores in log2 units
  const int last_row = min(i0 + kRows, n_q) - 1;
  const int key_end = shape.causal ? shape.visible_keys(last_row) : n_k;

  start_tile<kD, true>(q_s, q_head, i0, n_q);
  start_tile<kD, true>(k_s, k_head, 0, n_k);
  copies_commit();  // group: Q and K_0
  start_tile<kD, false>(v_s, v_head, 0, n_k);
  copies_commit();  // group: V_0

  float m[kRowsPerThread], l[kRowsPerThread], out[kRowsPerThread][kOut][4] = {};
#pragma unroll
  for (int a = 0; a < kRowsPerThread; ++a) {
    m[a] = -INFINITY;
    l[a] = 0.0f;
  }

  for (int j0 = 0; j0 < key_end; j0 += kKeys) {
    const bool more = j0 + kKeys < key_end;
    copies_wait<1>();  // this thread's copies of Q and K_j have landed (V_j may still be in flight)
    __syncthreads();   // ... and everyone else's

    //! [flash1_tuned_scores]
    // S patch (rows ty + kGroups a, keys tx + kLanes b) = Q_i K_j^T, four steps of the inner
    // dimension at a time: 8 + 4 float4 loads (4 + 8 at d = 64) feed 32 x 4 = 128 multiply-adds.
    float s[kRowsPerThread][kKeysPerThread] = {};
#pragma unroll 4
    for (int c = 0; c < kD / 4; ++c) {
      float4 qa[kRowsPerThread], kb[kKeysPerThread];
#pragma unroll
      for (int a = 0; a < kRowsPerThread; ++a) qa[a] = load4(q_s + swizzled(ty + kGroups * a, c, kD));
#pragma unroll
      for (int b = 0; b < kKeysPerThread; ++b) kb[b] = load4(k_s + swizzled(tx + kLanes * b, c, kD));
#pragma unroll
      for (int a = 0; a < kRowsPerThread; ++a)
#pragma unroll
        for (int b = 0; b < kKeysPerThread; ++b) {
          // One fused multiply-add each: written as s += (x + y + z + w), the sum would be
          // computed first (a multiply, three FMAs and an add: C++ keeps the order of + as written).
          s[a][b] += qa[a].x * kb[b].x;
          s[a][b] += qa[a].y * kb[b].y;
          s[a][b] += qa[a].z * kb[b].z;
          s[a][b] += qa[a].w * kb[b].w;
        }
    }
    //! [flash1_tuned_scores]
    __syncthreads();  // every warp is done with K_j: start K_{j+1} (it lands during P V)
    if (more) start_tile<kD, true>(k_s, k_head, j0 + kKeys, n_k);
    copies_commit();

    //! [flash1_tuned_softmax]
    // FlashAttention-1's update per row, in registers. A row's 64 scores sit in the kLanes threads
    // with the same ty (lanes of one warp): xor-shuffles over the low lane bits give each of them
    // the row's max and sum.
    const bool edge = j0 + kKeys > n_k || (shape.causal && j0 + kKeys - 1 > i0 + shape.causal_offset());
#pragma unroll
    for (int a = 0; a < kRowsPerThread; ++a) {
      const int i = i0 + ty + kGroups * a;
      float tile_max = -INFINITY;
#pragma unroll
      for (int b = 0; b < kKeysPerThread; ++b) {
        const int j = j0 + tx + kLanes * b;
        s[a][b] = (!edge || (j < n_k && (!shape.causal || j <= i + shape.causal_offset()))) ? s[a][b] * scale_log2
                                                                                            : -INFINITY;
        tile_max = fmaxf(tile_max, s[a][b]);
      }
#pragma unroll
      for (int bit = 1; bit < kLanes; bit *= 2) tile_max = fmaxf(tile_max, __shfl_xor_sync(0xFFFFFFFFu, tile_max, bit));
      float tile_sum = 0.0f;
#pragma unroll
      for (int b = 0; b < kKeysPerThread; ++b) {
        s[a][b] = tile_max == -INFINITY ? 0.0f : fast_exp2(s[a][b] - tile_max);  // P~
        tile_sum += s[a][b];
      }
#pragma unroll
      for (int bit = 1; bit < kLanes; bit *= 2) tile_sum += __shfl_xor_sync(0xFFFFFFFFu, tile_sum, bit);
      // In log2 units: the same update with 2^x for e^x.
      const auto [alpha, beta] =
          flash1_row_update(m[a], l[a], tile_max, tile_sum, [](float x) { return fast_exp2(x); });
#pragma unroll
      for (int c = 0; c < kOut; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e) out[a][c][e] *= alpha;
      const int r = ty + kGroups * a;
#pragma unroll
      for (int b = 0; b < kKeysPerThread; ++b) {
        const int key = tx + kLanes * b;
        p_s[swizzled(r, key / 4, kKeys) + key % 4] = beta * s[a][b];
      }
    }
    //! [flash1_tuned_softmax]
    copies_wait<1>();  // V_j has landed (K_{j+1} may still be in flight)
    __syncthreads();   // ... everyone's, and all of beta P~ is written

    //! [flash1_tuned_output]
    // O patch (rows ty + kGroups a, columns 4 tx + 4 kLanes c + e) += (beta P~) V_j, four keys at
    // a time: kRowsPerThread + 4 kOut float4 loads feed kRowsPerThread x 8 x 4 multiply-adds.
#pragma unroll 2
    for (int c4 = 0; c4 < kKeys / 4; ++c4) {
      float4 pa[kRowsPerThread], vb[4][kOut];
#pragma unroll
      for (int a = 0; a < kRowsPerThread; ++a) pa[a] = load4(p_s + swizzled(ty + kGroups * a, c4, kKeys));
#pragma unroll
      for (int t = 0; t < 4; ++t)
#pragma unroll
        for (int c = 0; c < kOut; ++c) vb[t][c] = load4(v_s + (4 * c4 + t) * kD + 4 * tx + 4 * kLanes * c);
#pragma unroll
      for (int a = 0; a < kRowsPerThread; ++a)
#pragma unroll
        for (int t = 0; t < 4; ++t)
#pragma unroll
          for (int c = 0; c < kOut; ++c) {
            const float p = lane(pa[a], t);
            out[a][c][0] += p * vb[t][c].x;
            out[a][c][1] += p * vb[t][c].y;
            out[a][c][2] += p * vb[t][c].z;
            out[a][c][3] += p * vb[t][c].w;
          }
    }
    //! [flash1_tuned_output]
    __syncthreads();  // every warp is done with V_j and P: start V_{j+1} (it lands during S)
    if (more) start_tile<kD, false>(v_s, v_head, j0 + kKeys, n_k);
    copies_commit();
  }
  copies_wait<0>();

  float* o_head = o + shape.q_head_offset(bh);
#pragma unroll
  for (int a = 0; a < kRowsPerThread; ++a) {
    const int i = i0 + ty + kGroups * a;
    if (i >= n_q) continue;
#pragma unroll
    for (int c = 0; c < kOut; ++c)
      *reinterpret_cast<float4*>(o_head + int64_t(i) * kD + 4 * tx + 4 * kLanes * c) =
          make_float4(out[a][c][0], out[a][c][1], out[a][c][2], out[a][c][3]);
    if (tx == 0) lse[int64_t(bh) * n_q + i] = m[a] == -INFINITY ? -INFINITY : m[a] * 0.6931471805599453f + logf(l[a]);
  }
}

template <int kD, int kLanes>
void launch_tuned_dim(const ForwardParams& p) {
  const AttentionShape& s = p.shape;
  const std::size_t bytes = tuned_shared_bytes(kD);
  CUDA_CHECK(cudaFuncSetAttribute(tuned_kernel<kD, kLanes>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  dim3 grid(unsigned((s.seq_q + kRows - 1) / kRows), unsigned(s.batch * s.heads_q));
  tuned_kernel<kD, kLanes>
      <<<grid, kThreads, bytes, p.stream>>>(s, static_cast<const float*>(p.q), static_cast<const float*>(p.k),
                                            static_cast<const float*>(p.v), static_cast<float*>(p.o), p.lse);
  CUDA_CHECK_LAUNCH();
}

void launch_tuned(const ForwardParams& p) {
  require_row_update();
  if (p.shape.head_dim == 64) return launch_tuned_dim<64, lanes_per_row(64)>(p);
  launch_tuned_dim<128, lanes_per_row(128)>(p);
}

std::string tuned_support(const AttentionShape& s) {
  if (s.head_dim != 64 && s.head_dim != 128) {
    return "head_dim must be 64 or 128 (a thread's 8 output columns are two float4 chunks d / 2 apart), got " +
           std::to_string(s.head_dim);
  }
  return block_limits(s, tuned_shared_bytes(s.head_dim), true);
}

}  // namespace

ForwardKernel tuned_kernel_entry() {
  ForwardKernel k{"ch04_tuned",
                  4,
                  4,
                  "tuned",
                  DType::F32,
                  "variant 3 tuned like an SGEMM: 8 x 4 register patches, float4 swizzled loads, "
                  "softmax by shuffles, K/V copies overlapping the math",
                  launch_tuned};
  k.supports = tuned_support;
  k.memory_note = [](const AttentionShape& s) {
    return traffic_note(s, LoopOrder::QOuter, kRegisterTiles, tuned_shared_bytes(s.head_dim));
  };
  return k;
}
FA_REGISTER_FORWARD_KERNEL(tuned_kernel_entry());

}  // namespace fa::flash1
