// Chapter 01 -- naive attention, fp32.
//
// Computes O = softmax(scale * Q K^T) V with three kernels and the full score matrix S (then P)
// in device memory. The softmax is the textbook one, exp(s_j) / sum_k exp(s_k), with no max
// subtracted: correct for small logits, inf/NaN once a logit passes ~88 (expf overflows).
// Chapter 02 fixes the overflow; chapter 03 removes passes over S; chapter 04 removes S.
//
// Variants:
//   1 naive  one thread per score, one thread per softmax row, one thread per output. Each
//            thread of the score kernel reads its own row of K: 32 rows per warp load.
//   2 tiled  the same three steps; the two matrix products tiled through shared memory
//            (64 x 64 outputs per block, 4 x 4 per thread), so each value of Q, K, P and V is
//            read from device memory once per tile instead of once per thread.
// Run:    build/bin/ch01_naive_attention --variant naive   (or tiled; raise --logit-scale to watch
//         it overflow: exercise 1)
#include "algorithm.h"
#include "naive_kernels.cuh"

namespace fa::naive {

/// One thread per row of S. Pass 1 sums exp(s_j); pass 2 writes P = exp(s_j) / sum over S.
/// A thread walks its own row, so the 32 threads of a warp read 32 different rows: each load
/// instruction touches 32 separate cache lines. Chapter 02's second variant fixes that.
//! [naive_softmax]
__global__ void naive_softmax_kernel(AttentionShape shape, float* scores, float* lse) {
  const int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= int64_t(shape.batch) * shape.heads_q * shape.seq_q) return;
  float* s = scores + row * shape.seq_kv;
  float sum = 0.0f;
  for (int j = 0; j < shape.seq_kv; ++j) sum += expf(s[j]);  // exp(-inf) = 0 for masked keys
  // A row that sees no key has sum 0: write P = 0 and LSE = -inf (log 0), never 0/0.
  float inv_sum = sum > 0.0f ? 1.0f / sum : 0.0f;
  for (int j = 0; j < shape.seq_kv; ++j) s[j] = expf(s[j]) * inv_sum;
  lse[row] = logf(sum);
}
//! [naive_softmax]

void launch_naive_softmax(const ForwardParams& p, float* scores) {
  const int64_t rows = p.shape.lse_elems();
  const int threads = 128;
  naive_softmax_kernel<<<unsigned((rows + threads - 1) / threads), threads, 0, p.stream>>>(p.shape, scores, p.lse);
  CUDA_CHECK_LAUNCH();
}

void launch_naive_attention(const ForwardParams& p) {
  launch_materialized_attention<float>(p, Products::PerThread, [&](float* scores) { launch_naive_softmax(p, scores); });
}

void launch_naive_tiled_attention(const ForwardParams& p) {
  launch_materialized_attention<float>(p, Products::Tiled, [&](float* scores) { launch_naive_softmax(p, scores); });
}

ForwardKernel naive_kernel(int number, const char* variant, const char* summary, void (*launch)(const ForwardParams&),
                           ShapeCheck supports) {
  ForwardKernel k{std::string("ch01_") + variant, 1, number, variant, DType::F32, summary, launch};
  k.supports = std::move(supports);
  k.workspace_bytes = score_buffer_bytes;
  k.memory_note = [](const AttentionShape& s) {
    return score_traffic_note(s, 5, "S written; read twice and P written by the softmax; P read by P*V");
  };
  return k;
}
FA_REGISTER_FORWARD_KERNEL(naive_kernel(1, "naive",
                                        "S = QK^T in device memory, softmax without max subtraction, then P*V",
                                        launch_naive_attention, materialized_support));
FA_REGISTER_FORWARD_KERNEL(naive_kernel(2, "tiled",
                                        "same steps; QK^T and P*V tiled through shared memory (64x64 per block)",
                                        launch_naive_tiled_attention, tiled_support));

FA_REGISTER_CPU_ALGORITHM(CpuAlgorithm{
    "ch01_naive_cpu", 1, 1, "naive", "algorithm.h: the same three steps in plain C++ (float)",
    [](const AttentionShape& s, const float* q, const float* k, const float* v, float* o, float* lse) {
      naive_attention_cpu(s, q, k, v, o, lse, Products::PerThread);
    }});
FA_REGISTER_CPU_ALGORITHM(CpuAlgorithm{
    "ch01_tiled_cpu", 1, 2, "tiled", "algorithm.h: the products as 64 x 64 x 16 blocked loops (float)",
    [](const AttentionShape& s, const float* q, const float* k, const float* v, float* o, float* lse) {
      naive_attention_cpu(s, q, k, v, o, lse, Products::Tiled);
    }});

}  // namespace fa::naive
