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

#include "cuda_check.h"
#include "phase_timer.h"
#include "problem.h"
#include "registry.h"

namespace fa::naive {

/// One thread per score S[i][j]: a dot product of length head_dim read straight from device
/// memory. threadIdx.x walks keys so the 32 threads of a warp write 32 consecutive scores.
constexpr int kScoreKeysPerBlock = 32;
constexpr int kScoreRowsPerBlock = 8;

template <class T>
__global__ void attention_scores_kernel(AttentionShape shape, const T* q, const T* k, float* scores) {
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
}

/// One thread per output O[i][c]: the row of P times column c of V. threadIdx.x walks the head
/// dimension so a warp reads one row of V in a single coalesced access and P[i][j] is the same
/// value for the whole warp (a broadcast).
constexpr int kValueColsPerBlock = 32;
constexpr int kValueRowsPerBlock = 8;

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

/// Bytes of the [batch, heads, Nq, Nk] float score buffer (P is written over S in place).
inline std::size_t score_buffer_bytes(const AttentionShape& shape) { return std::size_t(shape.score_elems()) * sizeof(float); }

/// "S/P buffer 2.00 GiB; 5 passes over it = 10.0 GiB, vs 0.13 GiB for Q, K, V, O"
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
void launch_materialized_attention(const ForwardParams& p, Softmax softmax) {
  const AttentionShape& s = p.shape;
  float* scores = static_cast<float*>(p.workspace);
  dim3 score_block(kScoreKeysPerBlock, kScoreRowsPerBlock);
  dim3 score_grid((s.seq_kv + kScoreKeysPerBlock - 1) / kScoreKeysPerBlock,
                  (s.seq_q + kScoreRowsPerBlock - 1) / kScoreRowsPerBlock, s.batch * s.heads_q);
  attention_scores_kernel<T><<<score_grid, score_block, 0, p.stream>>>(s, static_cast<const T*>(p.q),
                                                                       static_cast<const T*>(p.k), scores);
  CUDA_CHECK_LAUNCH();
  mark_phase(p.stream, "scores");
  softmax(scores);
  mark_phase(p.stream, "softmax");
  dim3 value_block(kValueColsPerBlock, kValueRowsPerBlock);
  dim3 value_grid((s.head_dim + kValueColsPerBlock - 1) / kValueColsPerBlock,
                  (s.seq_q + kValueRowsPerBlock - 1) / kValueRowsPerBlock, s.batch * s.heads_q);
  apply_values_kernel<T><<<value_grid, value_block, 0, p.stream>>>(s, scores, static_cast<const T*>(p.v),
                                                                   static_cast<T*>(p.o));
  CUDA_CHECK_LAUNCH();
  mark_phase(p.stream, "P*V");
}

}  // namespace fa::naive
