// Chapter 07's preprocessing and postprocessing, shared by its variants: D_i = dO_i . O_i, summed
// in fp32; the rounding of an fp32 dQ that atomics added into (variants 2 and 5); and the side
// stream the two-kernel variants (3 and 4) run their dQ kernel on.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_check.h"
#include "device_utils.cuh"

namespace fa::backward {

//! [delta_kernel]
/// One warp per query row; T is float, __half or __nv_bfloat16.
template <class T>
__global__ void delta_kernel(const T* o, const T* d_o, float* delta, int64_t rows, int d) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  float sum = 0.0f;
  for (int x = lane; x < d; x += 32) sum += float(o[row * d + x]) * float(d_o[row * d + x]);
  sum = warp_all_reduce(sum, SumOp());
  if (lane == 0) delta[row] = sum;
}
//! [delta_kernel]

/// D for every row of the problem ([batch, heads_q, seq_q] floats) on `stream`.
template <class T>
void launch_delta(const void* o, const void* d_o, float* delta, int64_t rows, int d, cudaStream_t stream) {
  delta_kernel<T><<<unsigned((rows * 32 + 255) / 256), 256, 0, stream>>>(static_cast<const T*>(o),
                                                                         static_cast<const T*>(d_o), delta, rows, d);
  CUDA_CHECK_LAUNCH();
}

/// dQ = dq32 rounded to T, n elements, on `stream`: the last step of the variants that add dQ
/// into an fp32 array with atomics.
template <class T>
__global__ void round_dq_kernel(const float* dq32, T* dq, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dq[i] = T(dq32[i]);
}
template <class T>
void launch_round_dq(const float* dq32, void* dq, int64_t n, cudaStream_t stream) {
  round_dq_kernel<T><<<unsigned((n + 255) / 256), 256, 0, stream>>>(dq32, static_cast<T*>(dq), n);
  CUDA_CHECK_LAUNCH();
}

/// A second stream for a kernel that is independent of the one on the caller's stream (the dQ
/// kernel of variants 3 and 4 needs only D, like the dK/dV kernel), so the two may share the GPU
/// instead of running one after the other. Made once, on the device current at the first launch.
struct SideStream {
  cudaStream_t stream;
  cudaEvent_t fork, join;
  SideStream() {
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  }
};
inline SideStream& side_stream() {
  static SideStream side;
  return side;
}
/// The side stream, made to wait for everything queued on `stream` so far.
inline cudaStream_t fork_side_stream(cudaStream_t stream) {
  SideStream& side = side_stream();
  CUDA_CHECK(cudaEventRecord(side.fork, stream));
  CUDA_CHECK(cudaStreamWaitEvent(side.stream, side.fork, 0));
  return side.stream;
}
/// `stream` made to wait for everything queued on the side stream so far.
inline void join_side_stream(cudaStream_t stream) {
  SideStream& side = side_stream();
  CUDA_CHECK(cudaEventRecord(side.join, side.stream));
  CUDA_CHECK(cudaStreamWaitEvent(stream, side.join, 0));
}

}  // namespace fa::backward
