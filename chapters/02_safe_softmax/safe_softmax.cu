// Chapter 02 -- safe softmax, fp32.
//
// Chapter 01's tiled score and P*V kernels (its variant 2); only the softmax changes. Subtracting
// the row maximum m before exponentiating, exp(s_j - m) / sum_k exp(s_k - m), gives the same P
// (the factor exp(-m) cancels) but every exponent is <= 0, so nothing overflows. The price is a
// third pass over S: one for the max, one for the sum, one to write P.
//
// Variants:
//   1 safe   one thread per row (as chapter 01), running algorithm.h's safe_softmax_row:
//            fixes overflow, a little slower (one pass more).
//   2 block  one thread block per row: the 256 threads split the row, so a warp reads 32
//            consecutive scores (coalesced), and the max and the sum are block reductions
//            (warp shuffles, then shared memory).
// Run:    build/bin/ch02_safe_softmax --variant block --logit-scale 20   (or --variant safe;
//         chapter 01 overflows at this logit scale, this chapter does not)
#include "../01_naive_attention/naive_kernels.cuh"
#include "algorithm.h"
#include "device_utils.cuh"
#include "not_implemented.h"

namespace fa::safe {

using naive::launch_materialized_attention;
using naive::score_buffer_bytes;
using naive::score_traffic_note;
using naive::tiled_support;

constexpr const char* kThreePasses = "S written; read 3 times (max, sum, normalize) and P written; P read by P*V";

/// Variant 1: one thread per row, three passes over the row: the CPU algorithm's row function,
/// safe_softmax_row (algorithm.h), which compiles for the GPU as well.
//! [safe_softmax_thread_per_row]
__global__ void safe_softmax_kernel(AttentionShape shape, float* scores, float* lse) {
  const int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= shape.lse_elems()) return;
  lse[row] = safe_softmax_row(scores + row * shape.seq_kv, shape.seq_kv);
}
//! [safe_softmax_thread_per_row]

/// Variant 2: one block per row. Thread t handles columns t, t + 256, t + 512, ...
constexpr int kBlockThreads = 256;

//! [safe_softmax_block]
__global__ void __launch_bounds__(kBlockThreads)
    safe_softmax_block_kernel(AttentionShape shape, float* scores, float* lse) {
  // BEGIN SOLUTION ch02_block_softmax (device): block blockIdx.x owns row blockIdx.x of scores (seq_kv floats); its threads stride the row for the max, then the sum of exp(s - max) (block_all_reduce), then write P = exp(s - max) / sum and lse[row] = max + log(sum); a row with max -inf gets P = 0 and LSE -inf
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  float* s = scores + row * shape.seq_kv;
  float local_max = -INFINITY;
  for (int j = threadIdx.x; j < shape.seq_kv; j += blockDim.x) local_max = fmaxf(local_max, s[j]);
  const float row_max = block_all_reduce(local_max, MaxOp{}, -INFINITY, scratch);
  if (row_max == -INFINITY) {
    for (int j = threadIdx.x; j < shape.seq_kv; j += blockDim.x) s[j] = 0.0f;
    if (threadIdx.x == 0) lse[row] = -INFINITY;
    return;
  }
  float local_sum = 0.0f;
  for (int j = threadIdx.x; j < shape.seq_kv; j += blockDim.x) local_sum += expf(s[j] - row_max);
  const float sum = block_all_reduce(local_sum, SumOp{}, 0.0f, scratch);
  const float inv_sum = 1.0f / sum;
  for (int j = threadIdx.x; j < shape.seq_kv; j += blockDim.x) s[j] = expf(s[j] - row_max) * inv_sum;
  if (threadIdx.x == 0) lse[row] = row_max + logf(sum);
  // END SOLUTION
}
//! [safe_softmax_block]

void launch_safe_softmax(const ForwardParams& p) {
  // A kernel cannot throw: one row on the host first, so that an unwritten safe_softmax_row says
  // "not implemented" here instead of trapping on the GPU.
  float one_score = 0.0f;
  safe_softmax_row(&one_score, 1);
  launch_materialized_attention<float>(p, naive::Products::Tiled, [&](float* scores) {
    const int64_t rows = p.shape.lse_elems();
    const int threads = 128;
    safe_softmax_kernel<<<unsigned((rows + threads - 1) / threads), threads, 0, p.stream>>>(p.shape, scores, p.lse);
    CUDA_CHECK_LAUNCH();
  });
}

//! [block_launch]
/// How safe_softmax_block_kernel is launched for `shape`: its blocks and threads per block.
struct BlockLaunch {
  unsigned blocks = 0, threads = 0;
};
BlockLaunch block_softmax_launch(AttentionShape shape) {
  // BEGIN SOLUTION ch02_block_softmax: write safe_softmax_block_kernel's body above, then delete this line
  // END SOLUTION
  return {unsigned(shape.lse_elems()), unsigned(kBlockThreads)};  // one block of kBlockThreads threads per row
}

void launch_safe_softmax_block(const ForwardParams& p) {
  launch_materialized_attention<float>(p, naive::Products::Tiled, [&](float* scores) {
    const BlockLaunch launch = block_softmax_launch(p.shape);
    safe_softmax_block_kernel<<<launch.blocks, launch.threads, 0, p.stream>>>(p.shape, scores, p.lse);
    CUDA_CHECK_LAUNCH();
  });
}
//! [block_launch]

ForwardKernel safe_kernel(int number, const char* variant, const char* summary, void (*launch)(const ForwardParams&)) {
  ForwardKernel k{std::string("ch02_") + variant, 2, number, variant, DType::F32, summary, launch};
  k.supports = tiled_support;
  k.workspace_bytes = score_buffer_bytes;
  k.memory_note = [](const AttentionShape& s) { return score_traffic_note(s, 6, kThreePasses); };
  return k;
}
FA_REGISTER_FORWARD_KERNEL(safe_kernel(1, "safe", "subtract the row max: no overflow; one thread per row, 3 passes",
                                       launch_safe_softmax));
FA_REGISTER_FORWARD_KERNEL(safe_kernel(2, "block",
                                       "one block per row, coalesced reads, shuffle + shared-memory reductions",
                                       launch_safe_softmax_block));

FA_REGISTER_CPU_ALGORITHM(CpuAlgorithm{"ch02_safe_cpu", 2, 1, "safe",
                                       "algorithm.h: max, sum, normalize -- three passes per row (float)",
                                       safe_softmax_attention_cpu});

}  // namespace fa::safe
