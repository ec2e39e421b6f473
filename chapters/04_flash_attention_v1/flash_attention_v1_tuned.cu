// Chapter 04, variant 4 -- `tuned`: variant 3's algorithm (one block per 64-row Q tile walking
// 64-key K/V tiles, FlashAttention-1's update after every tile, fp32 throughout) with the work
// arranged the way a tuned SGEMM arranges it. Four changes, each a step of its own: kStep = 1
// makes only the first, 2 the first two, 3 the first three, 4 (`tuned`) all four. Steps 1-3 are
// registered as ch04_tuned_step1..3, so that make bench times one change at a time:
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
// Run: build/bin/ch04_flash_attention_v1 --variant tuned        (and tuned_step1 .. tuned_step3)
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
/// measurement: the other choice is slower at each d (performance_notes.md, "Variant 4: threads
/// per row").
constexpr int lanes_per_row(int d) { return d == 64 ? 8 : 16; }

/// Steps 2-4 store Q, K and P unpadded, rows swizzled for float4 loads; step 1 reads single
/// floats and pads each row by one float instead, so the 16 rows a load touches sit in 16 banks.
__host__ __device__ constexpr int row_floats(int n, int step) { return step >= 2 ? n : n + 1; }

/// Shared memory: Q, K, V tiles (kRows or kKeys rows of d floats), P (kRows x kKeys), and before
/// step 3 the row factors alpha (kRows) that the threads walking a row hand to the others.
constexpr std::size_t tuned_shared_bytes(int d, int step = 4) {
  return std::size_t(2 * kRows * row_floats(d, step) + kKeys * d + kRows * row_floats(kKeys, step) +
                     (step >= 3 ? 0 : kRows)) *
         sizeof(float);
}

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

/// Steps 1-3: rows [first, first + 64) copied with plain loads and stores, padded (step 1) or
/// swizzled like start_tile; the caller waits for them with a barrier.
template <int kD, int kStep, bool kSwizzle>
__device__ void load_tile(float* tile, const float* src, int first, int n_rows) {
  constexpr int kChunks = kD / 4;
  for (int e = threadIdx.x; e < kRows * kChunks; e += kThreads) {
    const int r = e / kChunks, c = e % kChunks;
    const float4 x =
        first + r < n_rows ? *reinterpret_cast<const float4*>(src + int64_t(first + r) * kD + 4 * c) : float4{};
    if constexpr (kStep >= 2) {
      *reinterpret_cast<float4*>(tile + (kSwizzle ? swizzled(r, c, kD) : r * kD + 4 * c)) = x;
    } else {
      float* row = tile + r * (kSwizzle ? row_floats(kD, kStep) : kD) + 4 * c;
      row[0] = x.x;
      row[1] = x.y;
      row[2] = x.z;
      row[3] = x.w;
    }
  }
}

__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float lane(const float4& v, int t) {
  return t == 0 ? v.x : t == 1 ? v.y : t == 2 ? v.z : v.w;
}

/// Step 1's score product: the same 8 x 4 patch, one float of Q and one of K per load, from
/// rows padded to kD + 1 floats (threads that share tx read the same K row; 16 different rows hit
/// 16 different banks).
template <int kD, int kLanes, int kRowsPerThread, int kKeysPerThread>
__device__ __forceinline__ void scores_by_floats(float (&s)[kRowsPerThread][kKeysPerThread], const float* q_s,
                                                 const float* k_s, int tx, int ty) {
  constexpr int kGroups = kThreads / kLanes, kLd = row_floats(kD, 1);
#pragma unroll 4
  for (int x = 0; x < kD; ++x) {
    float qa[kRowsPerThread], kb[kKeysPerThread];
#pragma unroll
    for (int a = 0; a < kRowsPerThread; ++a) qa[a] = q_s[(ty + kGroups * a) * kLd + x];
#pragma unroll
    for (int b = 0; b < kKeysPerThread; ++b) kb[b] = k_s[(tx + kLanes * b) * kLd + x];
#pragma unroll
    for (int a = 0; a < kRowsPerThread; ++a)
#pragma unroll
      for (int b = 0; b < kKeysPerThread; ++b) s[a][b] += qa[a] * kb[b];
  }
}

/// Steps 2-4's score product: the same patch, float4 loads from swizzled rows.
//! [flash1_tuned_scores]
template <int kD, int kLanes, int kRowsPerThread, int kKeysPerThread>
__device__ __forceinline__ void scores_by_float4(float (&s)[kRowsPerThread][kKeysPerThread], const float* q_s,
                                                 const float* k_s, int tx, int ty) {
  constexpr int kGroups = kThreads / kLanes;
  // S patch (rows ty + kGroups a, keys tx + kLanes b) = Q_i K_j^T, four steps of the inner
  // dimension at a time: 8 + 4 float4 loads (4 + 8 at d = 64) feed 32 x 4 = 128 multiply-adds.
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
}
//! [flash1_tuned_scores]

/// Steps 2-4's P V product: O patch += (beta P~) V_j, float4 loads.
//! [flash1_tuned_output]
template <int kD, int kLanes, int kRowsPerThread, int kOut>
__device__ __forceinline__ void output_by_float4(float (&out)[kRowsPerThread][kOut][4], const float* p_s,
                                                 const float* v_s, int tx, int ty) {
  constexpr int kGroups = kThreads / kLanes;
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
}
//! [flash1_tuned_output]

/// Where P~ (row r, key) sits in p_s: swizzled float4 chunks from step 2 on, padded rows in step 1.
template <int kStep>
__device__ __forceinline__ int p_index(int r, int key) {
  return kStep >= 2 ? swizzled(r, key / 4, kKeys) + key % 4 : r * row_floats(kKeys, kStep) + key;
}

/// The kernel's body; kStep: how many of the four changes it makes (4: `tuned`).
template <int kD, int kLanes, int kStep>
__device__ __forceinline__ void tuned_body(const AttentionShape& shape, const float* q, const float* k, const float* v,
                                           float* o, float* lse) {
  constexpr int kGroups = kThreads / kLanes;       // row groups: ty = thread / kLanes
  constexpr int kRowsPerThread = kRows / kGroups;  // rows ty + kGroups a
  constexpr int kKeysPerThread = kKeys / kLanes;   // keys tx + kLanes b (tx = thread % kLanes)
  constexpr int kOut = kD / (4 * kLanes);          // float4 chunks of O: columns 4 tx + 4 kLanes c
  constexpr bool kFloat4 = kStep >= 2, kShuffles = kStep >= 3, kAsync = kStep >= 4;
  constexpr int kLdQK = row_floats(kD, kStep), kLdP = row_floats(kKeys, kStep);
  extern __shared__ __align__(16) float shared[];
  float* q_s = shared;                  // [64][kD] swizzled (step 1: [64][kD + 1])
  float* k_s = q_s + kRows * kLdQK;     // [64][kD] swizzled (step 1: [64][kD + 1])
  float* v_s = k_s + kKeys * kLdQK;     // [64][kD] plain: a warp reads one row at a time
  float* p_s = v_s + kKeys * kD;        // [64][64] swizzled (step 1: [64][65]): beta P~ of the current tile
  float* alpha_s = p_s + kRows * kLdP;  // steps 1-2: [64] the rows' alpha

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

  if constexpr (kAsync) {
    start_tile<kD, true>(q_s, q_head, i0, n_q);
    start_tile<kD, true>(k_s, k_head, 0, n_k);
    copies_commit();  // group: Q and K_0
    start_tile<kD, false>(v_s, v_head, 0, n_k);
    copies_commit();  // group: V_0
  } else {
    load_tile<kD, kStep, true>(q_s, q_head, i0, n_q);
  }

  // m and l: per row of the patch (steps 3-4); before step 3 thread r < 64 keeps row r's in row_m, row_l.
  float m[kRowsPerThread], l[kRowsPerThread], out[kRowsPerThread][kOut][4] = {};
  float row_m = -INFINITY, row_l = 0.0f;
#pragma unroll
  for (int a = 0; a < kRowsPerThread; ++a) {
    m[a] = -INFINITY;
    l[a] = 0.0f;
  }

  for (int j0 = 0; j0 < key_end; j0 += kKeys) {
    const bool more = j0 + kKeys < key_end;
    if constexpr (kAsync) {
      copies_wait<1>();  // this thread's copies of Q and K_j have landed (V_j may still be in flight)
      __syncthreads();   // ... and everyone else's
    } else {
      __syncthreads();  // every warp is done with K_{j-1}, V_{j-1} and P
      load_tile<kD, kStep, true>(k_s, k_head, j0, n_k);
      load_tile<kD, kStep, false>(v_s, v_head, j0, n_k);
      __syncthreads();
    }

    float s[kRowsPerThread][kKeysPerThread] = {};
    if constexpr (kFloat4) {
      scores_by_float4<kD, kLanes>(s, q_s, k_s, tx, ty);
    } else {
      scores_by_floats<kD, kLanes>(s, q_s, k_s, tx, ty);  // step 1
    }
    if constexpr (kAsync) {
      __syncthreads();  // every warp is done with K_j: start K_{j+1} (it lands during P V)
      if (more) start_tile<kD, true>(k_s, k_head, j0 + kKeys, n_k);
      copies_commit();
    }

    if constexpr (kShuffles) {
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
        for (int bit = 1; bit < kLanes; bit *= 2)
          tile_max = fmaxf(tile_max, __shfl_xor_sync(0xFFFFFFFFu, tile_max, bit));
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
    } else {
      // Steps 1-2: variant 3's row update. The scores go to shared memory, thread r < 64 walks
      // row r, writes beta P~ over it and hands alpha to the threads that hold the row's O.
      const bool edge = j0 + kKeys > n_k || (shape.causal && j0 + kKeys - 1 > i0 + shape.causal_offset());
#pragma unroll
      for (int a = 0; a < kRowsPerThread; ++a)
#pragma unroll
        for (int b = 0; b < kKeysPerThread; ++b) {
          const int r = ty + kGroups * a, key = tx + kLanes * b, i = i0 + r, j = j0 + key;
          p_s[p_index<kStep>(r, key)] = (!edge || (j < n_k && (!shape.causal || j <= i + shape.causal_offset())))
                                            ? s[a][b] * scale_log2
                                            : -INFINITY;
        }
      __syncthreads();
      if (threadIdx.x < kRows) {
        const int r = threadIdx.x;
        float tile_max = -INFINITY, tile_sum = 0.0f;
        for (int key = 0; key < kKeys; ++key) tile_max = fmaxf(tile_max, p_s[p_index<kStep>(r, key)]);
        for (int key = 0; key < kKeys; ++key) {
          const float p = tile_max == -INFINITY ? 0.0f : fast_exp2(p_s[p_index<kStep>(r, key)] - tile_max);
          p_s[p_index<kStep>(r, key)] = p;
          tile_sum += p;
        }
        const auto [alpha, beta] =
            flash1_row_update(row_m, row_l, tile_max, tile_sum, [](float x) { return fast_exp2(x); });
        for (int key = 0; key < kKeys; ++key) p_s[p_index<kStep>(r, key)] *= beta;
        alpha_s[r] = alpha;
      }
      __syncthreads();
#pragma unroll
      for (int a = 0; a < kRowsPerThread; ++a) {
        const float alpha = alpha_s[ty + kGroups * a];
#pragma unroll
        for (int c = 0; c < kOut; ++c)
#pragma unroll
          for (int e = 0; e < 4; ++e) out[a][c][e] *= alpha;
      }
    }
    if constexpr (kAsync) copies_wait<1>();  // V_j has landed (K_{j+1} may still be in flight)
    __syncthreads();                         // ... everyone's, and all of beta P~ is written

    if constexpr (kFloat4) {
      output_by_float4<kD, kLanes>(out, p_s, v_s, tx, ty);
    } else {
      // Step 1: the same patch of O, one float of P and one of V per load.
#pragma unroll 4
      for (int key = 0; key < kKeys; ++key) {
        float pa[kRowsPerThread];
#pragma unroll
        for (int a = 0; a < kRowsPerThread; ++a) pa[a] = p_s[p_index<kStep>(ty + kGroups * a, key)];
#pragma unroll
        for (int c = 0; c < kOut; ++c)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float x = v_s[key * kD + 4 * tx + 4 * kLanes * c + e];
#pragma unroll
            for (int a = 0; a < kRowsPerThread; ++a) out[a][c][e] += pa[a] * x;
          }
      }
    }
    if constexpr (kAsync) {
      __syncthreads();  // every warp is done with V_j and P: start V_{j+1} (it lands during S)
      if (more) start_tile<kD, false>(v_s, v_head, j0 + kKeys, n_k);
      copies_commit();
    }
  }
  if constexpr (kAsync) copies_wait<0>();

  float* o_head = o + shape.q_head_offset(bh);
#pragma unroll
  for (int a = 0; a < kRowsPerThread; ++a) {
    const int i = i0 + ty + kGroups * a;
    if (i >= n_q) continue;
#pragma unroll
    for (int c = 0; c < kOut; ++c)
      *reinterpret_cast<float4*>(o_head + int64_t(i) * kD + 4 * tx + 4 * kLanes * c) =
          make_float4(out[a][c][0], out[a][c][1], out[a][c][2], out[a][c][3]);
    if (kShuffles && tx == 0)
      lse[int64_t(bh) * n_q + i] = m[a] == -INFINITY ? -INFINITY : m[a] * 0.6931471805599453f + logf(l[a]);
  }
  if (!kShuffles && threadIdx.x < kRows && i0 + int(threadIdx.x) < n_q)
    lse[int64_t(bh) * n_q + i0 + threadIdx.x] =
        row_m == -INFINITY ? -INFINITY : row_m * 0.6931471805599453f + logf(row_l);
}

template <int kD, int kLanes>
__global__ void __launch_bounds__(kThreads)
    tuned_kernel(AttentionShape shape, const float* q, const float* k, const float* v, float* o, float* lse) {
  tuned_body<kD, kLanes, 4>(shape, q, k, v, o, lse);
}

/// Steps 1-3 on the way to `tuned`.
template <int kD, int kLanes, int kStep>
__global__ void __launch_bounds__(kThreads)
    tuned_step_kernel(AttentionShape shape, const float* q, const float* k, const float* v, float* o, float* lse) {
  tuned_body<kD, kLanes, kStep>(shape, q, k, v, o, lse);
}

template <int kD, int kLanes, int kStep>
void launch_tuned_dim(const ForwardParams& p) {
  const AttentionShape& s = p.shape;
  const std::size_t bytes = tuned_shared_bytes(kD, kStep);
  auto kernel = [] {
    if constexpr (kStep == 4) return tuned_kernel<kD, kLanes>;
    else return tuned_step_kernel<kD, kLanes, kStep>;
  }();
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  dim3 grid(unsigned((s.seq_q + kRows - 1) / kRows), unsigned(s.batch * s.heads_q));
  kernel<<<grid, kThreads, bytes, p.stream>>>(s, static_cast<const float*>(p.q), static_cast<const float*>(p.k),
                                              static_cast<const float*>(p.v), static_cast<float*>(p.o), p.lse);
  CUDA_CHECK_LAUNCH();
}

template <int kStep>
void launch_tuned(const ForwardParams& p) {
  require_row_update();
  if (p.shape.head_dim == 64) return launch_tuned_dim<64, lanes_per_row(64), kStep>(p);
  launch_tuned_dim<128, lanes_per_row(128), kStep>(p);
}

template <int kStep>
std::string tuned_support(const AttentionShape& s) {
  if (s.head_dim != 64 && s.head_dim != 128) {
    return "head_dim must be 64 or 128 (a thread's 8 output columns are two float4 chunks d / 2 apart), got " +
           std::to_string(s.head_dim);
  }
  return block_limits(s, tuned_shared_bytes(s.head_dim, kStep), true);
}

template <int kStep>
ForwardKernel tuned_entry(const std::string& name, const std::string& variant, const std::string& summary) {
  ForwardKernel k{name, 4, 4, variant, DType::F32, summary, launch_tuned<kStep>};
  k.supports = tuned_support<kStep>;
  k.memory_note = [](const AttentionShape& s) {
    return traffic_note(s, LoopOrder::QOuter, kRegisterTiles, tuned_shared_bytes(s.head_dim, kStep));
  };
  return k;
}

}  // namespace

FA_REGISTER_FORWARD_KERNEL(tuned_entry<4>("ch04_tuned", "tuned",
                                          "variant 3 tuned like an SGEMM: 8 x 4 register patches, float4 swizzled "
                                          "loads, softmax by shuffles, K/V copies overlapping the math"));
// The steps on the way, one change each (make bench times them like any kernel).
FA_REGISTER_FORWARD_KERNEL(tuned_entry<1>("ch04_tuned_step1", "tuned_step1",
                                          "tuned's step 1: 8 x 4 register patches, one float per shared load"));
FA_REGISTER_FORWARD_KERNEL(tuned_entry<2>("ch04_tuned_step2", "tuned_step2",
                                          "tuned's steps 1-2: + float4 loads from swizzled rows"));
FA_REGISTER_FORWARD_KERNEL(tuned_entry<3>("ch04_tuned_step3", "tuned_step3",
                                          "tuned's steps 1-3: + the row update by shuffles, in registers"));

}  // namespace fa::flash1
