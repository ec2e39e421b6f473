// Chapter 03 -- online softmax, fp32.
//
// Chapter 02 reads each row of S three times: max, sum, normalize. The online softmax
// (Milakov & Gimelshein, 2018) finds the max and the sum in one pass: keep a running max m and
// a running sum l of exp(s - m); when a larger score arrives, rescale l by exp(m_old - m_new).
// Two partial (m, l) pairs merge the same way, so threads can each scan part of a row and then
// combine -- the same merge that chapter 08's split-KV decode uses.
//
// Variants:
//   1 online  S still in memory; one block per row; pass 1 computes (m, l) online, pass 2
//             writes P. Two passes over S instead of three.
//   2 fused   no S at all: one warp per query row walks the keys 32 at a time, keeps m, l and
//             the output row in registers, rescaling the output with the same factor as l and
//             dividing by l once at the end. This is the loop chapter 04 tiles.
// Run:    build/bin/ch03_online_softmax --variant fused   (or --variant online)
#include "../01_naive_attention/naive_kernels.cuh"
#include "algorithm.h"
#include "device_utils.cuh"

namespace fa::online {

// ---------------------------------------------------------------------------------------------
// Variant 1: online (m, l) over a materialized row.

// MaxSum, online_update and online_merge: algorithm.h (the same functions on the CPU).

//! [warp_merge]
__device__ MaxSum warp_merge(MaxSum state) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    MaxSum other{__shfl_xor_sync(0xFFFFFFFFu, state.m, offset), __shfl_xor_sync(0xFFFFFFFFu, state.l, offset)};
    state = online_merge(state, other);
  }
  return state;
}
//! [warp_merge]

constexpr int kBlockThreads = 256;

__global__ void __launch_bounds__(kBlockThreads)
    online_softmax_block_kernel(AttentionShape shape, float* scores, float* lse) {
  __shared__ MaxSum partial[32];
  const int64_t row = blockIdx.x;
  float* s = scores + row * shape.seq_kv;
  //! [online_block_pass1]
  // Pass 1: each thread folds its columns into its own (m, l) ...
  MaxSum state{-INFINITY, 0.0f};
  for (int j = threadIdx.x; j < shape.seq_kv; j += blockDim.x) state = online_update(state, s[j]);
  // ... then the block merges the 256 states: within each warp by shuffles, then across warps.
  state = warp_merge(state);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) partial[warp] = state;
  __syncthreads();
  if (warp == 0) {
    state = lane < kBlockThreads / 32 ? partial[lane] : MaxSum{-INFINITY, 0.0f};
    state = warp_merge(state);
    if (lane == 0) partial[0] = state;
  }
  __syncthreads();
  const MaxSum total = partial[0];
  //! [online_block_pass1]
  // Pass 2: normalize. A row that sees no key keeps l = 0: P = 0, LSE = -inf.
  const bool empty = total.l == 0.0f;
  const float inv_sum = empty ? 0.0f : 1.0f / total.l;
  for (int j = threadIdx.x; j < shape.seq_kv; j += blockDim.x) s[j] = empty ? 0.0f : expf(s[j] - total.m) * inv_sum;
  if (threadIdx.x == 0) lse[row] = empty ? -INFINITY : total.m + logf(total.l);
}

void launch_online_softmax(const ForwardParams& p) {
  // BEGIN SOLUTION ch03_online_update: write online_update in algorithm.h, then delete this line
  // END SOLUTION
  // BEGIN SOLUTION ch03_online_merge: write online_merge in algorithm.h, then delete this line
  // END SOLUTION
  naive::launch_materialized_attention<float>(p, naive::Products::Tiled, [&](float* scores) {
    online_softmax_block_kernel<<<unsigned(p.shape.lse_elems()), kBlockThreads, 0, p.stream>>>(p.shape, scores, p.lse);
    CUDA_CHECK_LAUNCH();
  });
}

// ---------------------------------------------------------------------------------------------
// Variant 2: fused -- scores, online softmax and P*V in one kernel, nothing N x N in memory.

constexpr int kFusedWarps = 4;      // query rows per block, one per warp
constexpr int kMaxColsPerLane = 8;  // the output row lives in registers: head_dim <= 256
constexpr int kMaxHeadDim = 32 * kMaxColsPerLane;

__global__ void __launch_bounds__(32 * kFusedWarps)
    fused_online_attention_kernel(AttentionShape shape, const float* q, const float* k, const float* v, float* o,
                                  float* lse) {
  __shared__ float q_rows[kFusedWarps][kMaxHeadDim];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int bh = blockIdx.y;
  const int i = blockIdx.x * kFusedWarps + warp;
  if (i >= shape.seq_q) return;  // whole warps leave; nothing below waits for the block
  const int d = shape.head_dim;

  // The query row, pre-scaled, in shared memory: every lane reads all of it for its own key.
  const float scale = float(shape.softmax_scale());
  const float* q_row = q + shape.q_head_offset(bh) + int64_t(i) * d;
  for (int c = lane; c < d; c += 32) q_rows[warp][c] = q_row[c] * scale;
  __syncwarp();

  const float* k_head = k + shape.kv_head_offset(bh);
  const float* v_head = v + shape.kv_head_offset(bh);
  const int visible = shape.visible_keys(i);  // causal: keys past the diagonal are never read

  float m = -INFINITY, l = 0.0f;
  float acc[kMaxColsPerLane] = {};  // lane owns output columns lane, lane + 32, ...
  //! [fused_key_loop]
  for (int j0 = 0; j0 < visible; j0 += 32) {
    // Lane `lane` scores key j0 + lane.
    const int j = j0 + lane;
    float s = -INFINITY;
    if (j < visible) {
      const float* k_row = k_head + int64_t(j) * d;
      float dot = 0.0f;
      for (int c = 0; c < d; ++c) dot += q_rows[warp][c] * k_row[c];
      s = dot;
    }
    // Online softmax over the 32 new scores: the new max, the factor that rescales the old
    // sum *and the old output*, and this step's probabilities (unnormalized).
    const float m_new = fmaxf(m, warp_all_reduce(s, MaxOp{}));  // finite: key j0 is visible
    const float correction = expf(m - m_new);                   // 0 on the first step
    const float p = expf(s - m_new);                            // 0 for masked keys
    l = l * correction + warp_all_reduce(p, SumOp{});
#pragma unroll
    for (int t = 0; t < kMaxColsPerLane; ++t) acc[t] *= correction;
    // O += p_j * V[j] for the step's keys; p_j is broadcast from the lane that computed it.
    const int keys = min(32, visible - j0);
    for (int jj = 0; jj < keys; ++jj) {
      const float pj = __shfl_sync(0xFFFFFFFFu, p, jj);
      const float* v_row = v_head + int64_t(j0 + jj) * d;
#pragma unroll
      for (int t = 0; t < kMaxColsPerLane; ++t) {
        const int c = lane + 32 * t;
        if (c < d) acc[t] += pj * v_row[c];
      }
    }
    m = m_new;
  }
  //! [fused_key_loop]

  //! [fused_epilogue]
  // The deferred normalization: divide by l once, at the end.
  const float inv_l = visible > 0 ? 1.0f / l : 0.0f;
  float* o_row = o + shape.q_head_offset(bh) + int64_t(i) * d;
#pragma unroll
  for (int t = 0; t < kMaxColsPerLane; ++t) {
    const int c = lane + 32 * t;
    if (c < d) o_row[c] = acc[t] * inv_l;
  }
  if (lane == 0) lse[int64_t(bh) * shape.seq_q + i] = visible > 0 ? m + logf(l) : -INFINITY;
  //! [fused_epilogue]
}

void launch_fused_online_attention(const ForwardParams& p) {
  const AttentionShape& s = p.shape;
  dim3 grid((s.seq_q + kFusedWarps - 1) / kFusedWarps, s.batch * s.heads_q);
  fused_online_attention_kernel<<<grid, 32 * kFusedWarps, 0, p.stream>>>(
      s, static_cast<const float*>(p.q), static_cast<const float*>(p.k), static_cast<const float*>(p.v),
      static_cast<float*>(p.o), p.lse);
  CUDA_CHECK_LAUNCH();
}

std::string fused_support(const AttentionShape& s) {
  if (s.head_dim > kMaxHeadDim) {
    return "head_dim must be at most " + std::to_string(kMaxHeadDim) + " (the output row lives in registers), got " +
           std::to_string(s.head_dim);
  }
  if (int64_t(s.batch) * s.heads_q > 65535)
    return "batch*heads_q must be at most 65535, got " + std::to_string(int64_t(s.batch) * s.heads_q);
  return "";
}

std::string fused_traffic_note(const AttentionShape& s) {
  const double gib = double(1ull << 30);
  // Each query row reads every visible K and V row: ~half of them when causal.
  double kv_reads = 2.0 * double(s.score_elems()) * s.head_dim * 4 * (s.causal ? 0.5 : 1.0);
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(2);
  out << "no S or P in device memory; but every query row reads all its K and V rows: " << kv_reads / gib
      << " GiB through L2/L1 for " << s.forward_min_bytes(4) / gib << " GiB of Q, K, V, O, LSE (chapter 04 tiles this)";
  return out.str();
}

// ---------------------------------------------------------------------------------------------

ForwardKernel online_kernel() {
  const char* summary = "running max and sum in one pass (Milakov & Gimelshein): 2 passes over S instead of 3";
  ForwardKernel k{"ch03_online", 3, 1, "online", DType::F32, summary, launch_online_softmax};
  k.supports = naive::tiled_support;
  k.workspace_bytes = naive::score_buffer_bytes;
  k.memory_note = [](const AttentionShape& s) {
    return naive::score_traffic_note(s, 5, "S written; read once for (m, l), read and P written; P read by P*V");
  };
  return k;
}
FA_REGISTER_FORWARD_KERNEL(online_kernel());

ForwardKernel fused_kernel() {
  const char* summary = "one kernel, one warp per query row: scores, online softmax and P*V fused, no N x N buffer";
  ForwardKernel k{"ch03_fused", 3, 2, "fused", DType::F32, summary, launch_fused_online_attention};
  k.supports = fused_support;
  k.memory_note = fused_traffic_note;
  return k;
}
FA_REGISTER_FORWARD_KERNEL(fused_kernel());

FA_REGISTER_CPU_ALGORITHM(CpuAlgorithm{"ch03_online_cpu", 3, 1, "online",
                                       "algorithm.h: (m, l) in one pass, then normalize (float)",
                                       online_softmax_attention_cpu});
FA_REGISTER_CPU_ALGORITHM(CpuAlgorithm{
    "ch03_fused_cpu", 3, 2, "fused",
    "algorithm.h: one pass per query row, 32 keys a step, output rescaled as it goes (float)",
    fused_online_attention_cpu});

}  // namespace fa::online
