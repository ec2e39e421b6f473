// Chapter 07's preprocessing and postprocessing, shared by its variants: D_i = dO_i . O_i, summed
// in fp32; the rounding of an fp32 dQ that atomics added into (variants 2 and 5); and the side
// stream the two-kernel variants (3 and 4) run their dQ kernel on.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_check.h"
#include "device_utils.cuh"
#include "registry.h"
#include "strides.h"

namespace fa::backward {

//! [delta_kernel]
/// One warp per query row (row = plane * seq_q + i); T is float, __half or __nv_bfloat16.
template <class T>
__global__ void delta_kernel(StridedRows<const T> o, StridedRows<const T> d_o, float* delta, int seq_q, int64_t rows,
                             int d) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int plane = int(row / seq_q), i = int(row % seq_q);
  const T* o_row = o.head_start(plane) + int64_t(i) * o.strides.row;
  const T* d_o_row = d_o.head_start(plane) + int64_t(i) * d_o.strides.row;
  float sum = 0.0f;
  for (int x = lane; x < d; x += 32) sum += float(o_row[x]) * float(d_o_row[x]);
  sum = warp_all_reduce(sum, SumOp());
  if (lane == 0) delta[row] = sum;
}
//! [delta_kernel]

/// D for every row of the problem ([batch, heads_q, seq_q] floats) on p.stream; O and dO with
/// p.strides when given (strides.h), else packed.
template <class T>
void launch_delta(const BackwardParams& p, float* delta) {
  const AttentionShape& s = p.shape;
  const BackwardStrides st = p.strides ? *p.strides : BackwardStrides::packed(s);
  const StridedRows<const T> o{static_cast<const T*>(p.o), st.o, s.heads_q};
  const StridedRows<const T> d_o{static_cast<const T*>(p.d_o), st.d_o, s.heads_q};
  const int64_t rows = s.lse_elems();
  delta_kernel<T><<<unsigned((rows * 32 + 255) / 256), 256, 0, p.stream>>>(o, d_o, delta, s.seq_q, rows, s.head_dim);
  CUDA_CHECK_LAUNCH();
}

/// dQ = dq32 rounded to T: the last step of the variants that add dQ into a packed fp32 array
/// with atomics. dq's rows may have any strides (StridedRows).
template <class T>
__global__ void round_dq_kernel(const float* dq32, StridedRows<T> dq, int seq_q, int64_t rows, int d) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;  // one warp per row, as in D
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  T* out = dq.head_start(int(row / seq_q)) + (row % seq_q) * dq.strides.row;
  for (int x = lane; x < d; x += 32) out[x] = T(dq32[row * d + x]);
}
/// On p.stream, into p.dq with p.strides (packed when null).
template <class T>
void launch_round_dq(const float* dq32, const BackwardParams& p) {
  const AttentionShape& s = p.shape;
  const TensorStrides st = p.strides ? p.strides->dq : TensorStrides::packed(s.heads_q, s.seq_q, s.head_dim);
  const int64_t rows = s.lse_elems();
  round_dq_kernel<T><<<unsigned((rows * 32 + 255) / 256), 256, 0, p.stream>>>(
      dq32, StridedRows<T>{static_cast<T*>(p.dq), st, s.heads_q}, s.seq_q, rows, s.head_dim);
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
