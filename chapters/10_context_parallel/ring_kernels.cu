// Chapter 10's merge, add and fill kernels (ring_kernels.h). All are memory-bound and small next
// to an attention launch over a block: a merge reads and writes each output row once per block.
#include "ring_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "cuda_check.h"
#include "random.h"

namespace fa::context_parallel {
namespace {

__device__ inline float to_float(float x) { return x; }
__device__ inline float to_float(__half x) { return __half2float(x); }
__device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T>
__device__ inline T from_float(float x);
template <>
__device__ inline float from_float<float>(float x) {
  return x;
}
template <>
__device__ inline __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

//! [merge_kernel]
template <class T>
__global__ void merge_rows_kernel(float* o_acc, float* lse_acc, const T* o_part, const float* lse_part, int64_t rows,
                                  int head_dim) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float lse_b = lse_part[row];
  if (lse_b == -INFINITY) return;  // the block showed this row no key
  const float lse_a = lse_acc[row];
  // e^(-inf - x) = 0 weighs a row's empty starting state out (the CPU leaves it out of chapter 08's
  // merge instead); the return above keeps out the case where both sides are empty.
  const float top = fmaxf(lse_a, lse_b);
  const float merged = top + logf(expf(lse_a - top) + expf(lse_b - top));
  const float w_a = expf(lse_a - merged), w_b = expf(lse_b - merged);
  float* o = o_acc + row * head_dim;
  const T* o_b = o_part + row * head_dim;
  for (int x = lane; x < head_dim; x += 32) o[x] = (lse_a == -INFINITY ? 0.0f : w_a * o[x]) + w_b * to_float(o_b[x]);
  if (lane == 0) lse_acc[row] = merged;
}
//! [merge_kernel]

template <class T>
__global__ void add_kernel(float* acc, const T* part, int64_t count) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    acc[i] += to_float(part[i]);
}

template <class T>
__global__ void round_kernel(T* out, const float* acc, int64_t count) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_float<T>(acc[i]);
}

__global__ void fill_kernel(float* out, float value, int64_t count) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = value;
}

template <class T>
__global__ void uniform_kernel(T* out, int64_t count, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t r = splitmix64(seed + splitmix64(uint64_t(i)));
    out[i] = from_float<T>(float(r >> 40) * (4.0f / 16777216.0f) - 2.0f);
  }
}

unsigned grid_for(int64_t count) {
  const int64_t blocks = (count + 255) / 256;
  return unsigned(blocks < 8192 ? (blocks > 0 ? blocks : 1) : 8192);
}

/// Calls f(T{}) with T the element type of `dtype`.
template <class F>
void with_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::BF16: f(__nv_bfloat16{}); return;
    case DType::F16: f(__half{}); return;
    case DType::F32: f(float{}); return;
  }
  throw std::invalid_argument(std::string("chapter 10's kernels take fp32, fp16 or bf16, not ") + dtype_name(dtype));
}

}  // namespace

void merge_partial_rows(DType dtype, float* o_acc, float* lse_acc, const void* o_part, const float* lse_part,
                        int64_t rows, int head_dim, cudaStream_t stream) {
  if (rows == 0) return;
  with_type(dtype, [&](auto t) {
    using T = decltype(t);
    constexpr int kRowsPerBlock = 8;
    merge_rows_kernel<T><<<unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock), 32 * kRowsPerBlock, 0, stream>>>(
        o_acc, lse_acc, static_cast<const T*>(o_part), lse_part, rows, head_dim);
  });
  CUDA_CHECK_LAUNCH();
}

void add_into(DType dtype, float* acc, const void* part, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  with_type(dtype, [&](auto t) {
    using T = decltype(t);
    add_kernel<T><<<grid_for(count), 256, 0, stream>>>(acc, static_cast<const T*>(part), count);
  });
  CUDA_CHECK_LAUNCH();
}

void round_to(DType dtype, void* out, const float* acc, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  with_type(dtype, [&](auto t) {
    using T = decltype(t);
    round_kernel<T><<<grid_for(count), 256, 0, stream>>>(static_cast<T*>(out), acc, count);
  });
  CUDA_CHECK_LAUNCH();
}

void fill_floats(float* out, float value, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  fill_kernel<<<grid_for(count), 256, 0, stream>>>(out, value, count);
  CUDA_CHECK_LAUNCH();
}

void fill_uniform(DType dtype, void* out, int64_t count, uint64_t seed, cudaStream_t stream) {
  if (count == 0) return;
  with_type(dtype, [&](auto t) {
    using T = decltype(t);
    uniform_kernel<T><<<grid_for(count), 256, 0, stream>>>(static_cast<T*>(out), count, seed);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace fa::context_parallel
