// Small device-side pieces more than one chapter uses: quad, warp and block reductions, and a
// bare exp2.
#pragma once

#include <cuda_runtime.h>

namespace fa {

/// 2^x as one MUFU.EX2 instruction. `exp2f` compiles to the non-flushing `ex2.approx.f32`, which
/// ptxas wraps in a range check and two conditional multiplies so that results below 2^-126
/// come out as denormals; softmax loses nothing when they are 0 instead, and the kernels that
/// take an exponential per score (chapters 06 and 07) save those extra instructions per score.
/// exp2(-inf) is still +0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

/// Every lane of a quad (4 consecutive lanes) gets op over the quad's 4 values. An mma.sync or
/// wgmma accumulator row is spread over the 4 lanes of a quad (thread t of the quad holds
/// columns 2t and 2t + 1 of every 8), so two xor-shuffles finish a row's max or sum.
//! [quad_all_reduce]
template <class T, class Op>
__device__ __forceinline__ T quad_all_reduce(T value, Op op) {
  value = op(value, __shfl_xor_sync(0xFFFFFFFFu, value, 1));
  return op(value, __shfl_xor_sync(0xFFFFFFFFu, value, 2));
}
//! [quad_all_reduce]
__device__ __forceinline__ float quad_max(float value) { return quad_all_reduce(value, MaxOp()); }
__device__ __forceinline__ float quad_sum(float value) { return quad_all_reduce(value, SumOp()); }

/// Every lane of the warp gets op over the 32 lanes' values. Butterfly (xor) shuffles: five
/// steps, no shared memory, and no lane has to broadcast the result afterwards.
//! [warp_all_reduce]
template <class T, class Op>
__device__ T warp_all_reduce(T value, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) value = op(value, __shfl_xor_sync(0xFFFFFFFFu, value, offset));
  return value;
}
//! [warp_all_reduce]

/// Every thread of the block gets op over all the block's values. Warps reduce with shuffles,
/// then warp 0 reduces the per-warp results from shared memory. blockDim.x must be a multiple
/// of 32; `identity` is op's neutral element (-inf for max, 0 for sum); `scratch` holds 32
/// elements of shared memory. Ends with a barrier, so scratch can be reused by the next call.
template <class T, class Op>
__device__ T block_all_reduce(T value, Op op, T identity, T* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  value = warp_all_reduce(value, op);
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  if (warp == 0) {
    T partial = lane < warps ? scratch[lane] : identity;
    partial = warp_all_reduce(partial, op);
    if (lane == 0) scratch[0] = partial;
  }
  __syncthreads();
  T result = scratch[0];
  __syncthreads();
  return result;
}

}  // namespace fa
