// Chapter 01 building blocks: attention as three separate kernels with the score matrix in
// device memory. Chapters 02 and 03 reuse the score and P*V kernels unchanged and replace only
// the softmax, so each chapter's change stands alone.
//
//   1. attention_scores_kernel:  S = scale * Q K^T   (masked entries = -inf), [Nq x Nk] per head
//   2. a softmax kernel:         P = softmax(S) row by row, written over S; LSE per row
//   3. apply_values_kernel:      O = P V
//
// Run: build/bin/ch01_naive_attention --help
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <sstream>
#include <string>

#include "algorithm.h"
#include "cuda_check.h"
#include "not_implemented.h"
#include "phase_timer.h"
#include "problem.h"
#include "registry.h"

namespace fa::naive {

/// One thread per score S[i][j]: a dot product of length head_dim read straight from device
/// memory. threadIdx.x walks keys so the 32 threads of a warp write 32 consecutive scores.
constexpr int kScoreKeysPerBlock = 32;
constexpr int kScoreRowsPerBlock = 8;

//! [scores_per_thread]
template <class T>
__global__ void attention_scores_kernel(AttentionShape shape, const T* q, const T* k, float* scores) {
  // BEGIN SOLUTION ch01_scores (device): thread (threadIdx.x, threadIdx.y) of block (x, y, bh) owns S[i][j] with j = blockIdx.x * kScoreKeysPerBlock + threadIdx.x, i = blockIdx.y * kScoreRowsPerBlock + threadIdx.y (nothing past the ends): the dot product of row i of Q and row j of K read from device memory, times shape.softmax_scale(), -inf where !shape.visible(i, j), stored at scores[(bh * seq_q + i) * seq_kv + j]
  const int bh = blockIdx.z;
  const int i = blockIdx.y * kScoreRowsPerBlock + threadIdx.y;
  const int j = blockIdx.x * kScoreKeysPerBlock + threadIdx.x;
  if (i >= shape.seq_q || j >= shape.seq_kv) return;
  const T* q_row = q + shape.q_head_offset(bh) + int64_t(i) * shape.head_dim;
  const T* k_row = k + shape.kv_head_offset(bh) + int64_t(j) * shape.head_dim;
  float dot = 0.0f;
  for (int c = 0; c < shape.head_dim; ++c) dot += float(q_row[c]) * float(k_row[c]);
  float s = shape.visible(i, j) ? dot * float(shape.softmax_scale()) : -INFINITY;
  scores[(int64_t(bh) * shape.seq_q + i) * shape.seq_kv + j] = s;
  // END SOLUTION
}
//! [scores_per_thread]

/// One thread per output O[i][c]: the row of P times column c of V. threadIdx.x walks the head
/// dimension so a warp reads one row of V in a single coalesced access and P[i][j] is the same
/// value for the whole warp (a broadcast).
constexpr int kValueColsPerBlock = 32;
constexpr int kValueRowsPerBlock = 8;

//! [values_per_thread]
template <class T>
__global__ void apply_values_kernel(AttentionShape shape, const float* probs, const T* v, T* o) {
  const int bh = blockIdx.z;
  const int i = blockIdx.y * kValueRowsPerBlock + threadIdx.y;
  const int c = blockIdx.x * kValueColsPerBlock + threadIdx.x;
  if (i >= shape.seq_q || c >= shape.head_dim) return;
  const float* p_row = probs + (int64_t(bh) * shape.seq_q + i) * shape.seq_kv;
  const T* v_head = v + shape.kv_head_offset(bh);
  float acc = 0.0f;
  for (int j = 0; j < shape.seq_kv; ++j) acc += p_row[j] * float(v_head[int64_t(j) * shape.head_dim + c]);
  o[shape.q_head_offset(bh) + int64_t(i) * shape.head_dim + c] = T(acc);
}
//! [values_per_thread]

// ---------------------------------------------------------------------------------------------
// Variant 2's score and P*V kernels: the same two matrix products, tiled through shared memory.
//
// A block computes a 64 x 64 tile of its output. It walks the inner dimension 16 at a time:
// the block's 256 threads copy a 64 x 16 slice of each operand into shared memory (each value
// read from device memory once per block instead of once per thread that needs it), wait, and
// then every thread multiplies what it needs from shared memory into a 4 x 4 patch of outputs
// held in registers. Thread (tx, ty) owns rows ty + 16r and columns tx + 16c, r, c in 0..3:
// a warp then reads 16 consecutive floats of one tile row (no bank conflicts) and 2 of the
// other (broadcasts).
constexpr int kTile = 64;       // output rows and columns per block
constexpr int kTileDepth = 16;  // inner-dimension step
constexpr int kTileThreads = 256;
constexpr int kPerThread = kTile / 16;  // 4 x 4 outputs per thread

/// One inner step of a tiled product: acc[r][n] += sum over the 16-deep slice of a[., ty + 16r] *
/// b[., tx + 16n]. Both slices sit in shared memory with the inner dimension first.
//! [accumulate_tile_step]
__device__ inline void accumulate_tile_step(const float (&a_tile)[kTileDepth][kTile],
                                            const float (&b_tile)[kTileDepth][kTile], int tx, int ty,
                                            float (&acc)[kPerThread][kPerThread]) {
#pragma unroll
  for (int c = 0; c < kTileDepth; ++c) {
    float a[kPerThread], b[kPerThread];
#pragma unroll
    for (int t = 0; t < kPerThread; ++t) {
      a[t] = a_tile[c][ty + 16 * t];
      b[t] = b_tile[c][tx + 16 * t];
    }
#pragma unroll
    for (int r = 0; r < kPerThread; ++r) {
#pragma unroll
      for (int n = 0; n < kPerThread; ++n) acc[r][n] += a[r] * b[n];
    }
  }
}
//! [accumulate_tile_step]

/// S tile = scale * Q_tile K_tile^T: both operands are row-major [rows, head_dim], so both
/// slices are 64 rows x 16 dims, stored transposed in shared memory ([dim][row]).
template <class T>
__global__ void __launch_bounds__(kTileThreads)
    attention_scores_tiled_kernel(AttentionShape shape, const T* q, const T* k, float* scores) {
  //! [scores_tiled_setup]
  __shared__ float q_tile[kTileDepth][kTile];
  __shared__ float k_tile[kTileDepth][kTile];
  const int bh = blockIdx.z, row0 = blockIdx.y * kTile, key0 = blockIdx.x * kTile;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const T* q_head = q + shape.q_head_offset(bh);
  const T* k_head = k + shape.kv_head_offset(bh);
  const int d = shape.head_dim;
  float acc[kPerThread][kPerThread] = {};
  //! [scores_tiled_setup]
  //! [scores_tiled_main_loop]
  for (int c0 = 0; c0 < d; c0 += kTileDepth) {
    // 64 x 16 = 1024 values per operand, 4 per thread; out-of-range rows/dims load as 0.
    for (int e = threadIdx.x; e < kTile * kTileDepth; e += kTileThreads) {
      const int r = e / kTileDepth, c = e % kTileDepth;
      const bool in_dim = c0 + c < d;
      q_tile[c][r] = (row0 + r < shape.seq_q && in_dim) ? float(q_head[int64_t(row0 + r) * d + c0 + c]) : 0.0f;
      k_tile[c][r] = (key0 + r < shape.seq_kv && in_dim) ? float(k_head[int64_t(key0 + r) * d + c0 + c]) : 0.0f;
    }
    __syncthreads();
    accumulate_tile_step(q_tile, k_tile, tx, ty, acc);
    __syncthreads();  // the tiles are overwritten next step
  }
  //! [scores_tiled_main_loop]
  //! [scores_tiled_store]
  const float scale = float(shape.softmax_scale());
#pragma unroll
  for (int r = 0; r < kPerThread; ++r) {
    const int i = row0 + ty + 16 * r;
    if (i >= shape.seq_q) continue;
#pragma unroll
    for (int n = 0; n < kPerThread; ++n) {
      const int j = key0 + tx + 16 * n;
      if (j < shape.seq_kv) {
        scores[(int64_t(bh) * shape.seq_q + i) * shape.seq_kv + j] =
            shape.visible(i, j) ? acc[r][n] * scale : -INFINITY;
      }
    }
  }
  //! [scores_tiled_store]
}

/// O tile = P_tile V: P is [seq_q, seq_kv] (a 64 x 16 slice, stored transposed), V is
/// [seq_kv, head_dim] (a 16 x 64 slice, stored as is). One block column covers 64 dims.
template <class T>
__global__ void __launch_bounds__(kTileThreads)
    apply_values_tiled_kernel(AttentionShape shape, const float* probs, const T* v, T* o) {
  __shared__ float p_tile[kTileDepth][kTile];
  __shared__ float v_tile[kTileDepth][kTile];
  const int bh = blockIdx.z, row0 = blockIdx.y * kTile, col0 = blockIdx.x * kTile;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const float* p_head = probs + int64_t(bh) * shape.seq_q * shape.seq_kv;
  const T* v_head = v + shape.kv_head_offset(bh);
  const int d = shape.head_dim, n_keys = shape.seq_kv;
  float acc[kPerThread][kPerThread] = {};
  for (int j0 = 0; j0 < n_keys; j0 += kTileDepth) {
    for (int e = threadIdx.x; e < kTile * kTileDepth; e += kTileThreads) {
      const int r = e / kTileDepth, j = e % kTileDepth;  // P: 16 consecutive keys of row r
      p_tile[j][r] = (row0 + r < shape.seq_q && j0 + j < n_keys) ? p_head[int64_t(row0 + r) * n_keys + j0 + j] : 0.0f;
      const int vj = e / kTile, vc = e % kTile;  // V: 64 consecutive dims of key vj
      v_tile[vj][vc] = (j0 + vj < n_keys && col0 + vc < d) ? float(v_head[int64_t(j0 + vj) * d + col0 + vc]) : 0.0f;
    }
    __syncthreads();
    accumulate_tile_step(p_tile, v_tile, tx, ty, acc);
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < kPerThread; ++r) {
    const int i = row0 + ty + 16 * r;
    if (i >= shape.seq_q) continue;
#pragma unroll
    for (int n = 0; n < kPerThread; ++n) {
      const int c = col0 + tx + 16 * n;
      if (c < d) o[shape.q_head_offset(bh) + int64_t(i) * d + c] = T(acc[r][n]);
    }
  }
}

/// Launch grids put batch*heads in z and query rows in y, both capped at 65535 blocks.
inline std::string grid_limit_reason(const AttentionShape& shape, int rows_per_block) {
  int64_t heads = int64_t(shape.batch) * shape.heads_q;
  int64_t row_blocks = (int64_t(shape.seq_q) + rows_per_block - 1) / rows_per_block;
  if (heads > 65535) return "batch*heads_q must be at most 65535, got " + std::to_string(heads);
  if (row_blocks > 65535) {
    return "seq_q must be at most " + std::to_string(65535LL * rows_per_block) + ", got " + std::to_string(shape.seq_q);
  }
  return "";
}

inline std::string materialized_support(const AttentionShape& shape) {
  std::string why = grid_limit_reason(shape, kScoreRowsPerBlock);
  return why.empty() ? grid_limit_reason(shape, kValueRowsPerBlock) : why;
}

inline std::string tiled_support(const AttentionShape& shape) { return grid_limit_reason(shape, kTile); }

/// Bytes of the [batch, heads, Nq, Nk] float score buffer (P is written over S in place).
inline std::size_t score_buffer_bytes(const AttentionShape& shape) {
  return std::size_t(shape.score_elems()) * sizeof(float);
}

/// "S/P buffer 2.00 GiB (2048 x 2048 floats per head); 5 passes over it (...) = 10.00 GiB, vs 0.50 GiB
/// for Q, K, V, O, LSE" at the default shape.
inline std::string score_traffic_note(const AttentionShape& shape, int passes, const char* passes_what) {
  const double gib = double(1ull << 30);
  double buffer = double(score_buffer_bytes(shape));
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(2);
  s << "S/P buffer " << buffer / gib << " GiB (" << shape.seq_q << " x " << shape.seq_kv << " floats per head); "
    << passes << " passes over it (" << passes_what << ") = " << passes * buffer / gib << " GiB, vs "
    << shape.forward_min_bytes(4) / gib << " GiB for Q, K, V, O, LSE";
  return s.str();
}

/// Launches the score kernel and P*V around a softmax launcher `softmax(scores)`.
template <class T, class Softmax>
void launch_materialized_attention(const ForwardParams& p, Products products, Softmax softmax) {
  const AttentionShape& s = p.shape;
  float* scores = static_cast<float*>(p.workspace);
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  T* o = static_cast<T*>(p.o);
  const unsigned heads = unsigned(s.batch * s.heads_q);
  auto blocks = [](int n, int per_block) { return unsigned((n + per_block - 1) / per_block); };
  if (products == Products::PerThread) {
    // BEGIN SOLUTION ch01_scores: write attention_scores_kernel (one thread per score) in naive_kernels.cuh, then delete this line
    // END SOLUTION
    dim3 grid(blocks(s.seq_kv, kScoreKeysPerBlock), blocks(s.seq_q, kScoreRowsPerBlock), heads);
    attention_scores_kernel<T><<<grid, dim3(kScoreKeysPerBlock, kScoreRowsPerBlock), 0, p.stream>>>(s, q, k, scores);
  } else {
    dim3 grid(blocks(s.seq_kv, kTile), blocks(s.seq_q, kTile), heads);
    attention_scores_tiled_kernel<T><<<grid, kTileThreads, 0, p.stream>>>(s, q, k, scores);
  }
  CUDA_CHECK_LAUNCH();
  mark_phase(p.stream, "scores");
  softmax(scores);
  mark_phase(p.stream, "softmax");
  if (products == Products::PerThread) {
    dim3 grid(blocks(s.head_dim, kValueColsPerBlock), blocks(s.seq_q, kValueRowsPerBlock), heads);
    apply_values_kernel<T><<<grid, dim3(kValueColsPerBlock, kValueRowsPerBlock), 0, p.stream>>>(s, scores, v, o);
  } else {
    dim3 grid(blocks(s.head_dim, kTile), blocks(s.seq_q, kTile), heads);
    apply_values_tiled_kernel<T><<<grid, kTileThreads, 0, p.stream>>>(s, scores, v, o);
  }
  CUDA_CHECK_LAUNCH();
  mark_phase(p.stream, "P*V");
}

}  // namespace fa::naive
