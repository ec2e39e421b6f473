// Chapter 07's preprocessing, shared by its variants: D_i = dO_i . O_i, summed in fp32.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_check.h"

namespace fa::backward {

/// One warp per query row; T is float, __half or __nv_bfloat16.
template <class T>
__global__ void delta_kernel(const T* o, const T* d_o, float* delta, int64_t rows, int d) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  float sum = 0.0f;
  for (int x = lane; x < d; x += 32) sum += float(o[row * d + x]) * float(d_o[row * d + x]);
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, off);
  if (lane == 0) delta[row] = sum;
}

/// D for every row of the problem ([batch, heads_q, seq_q] floats) on `stream`.
template <class T>
void launch_delta(const void* o, const void* d_o, float* delta, int64_t rows, int d, cudaStream_t stream) {
  delta_kernel<T><<<unsigned((rows * 32 + 255) / 256), 256, 0, stream>>>(static_cast<const T*>(o),
                                                                           static_cast<const T*>(d_o), delta, rows, d);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fa::backward
