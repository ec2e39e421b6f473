// Chapter 10's own small kernels: what the ring does between two attention launches. The
// attention itself is chapter 06's (chapter 05's off Hopper) forward and chapter 07's backward,
// found in the registry; these kernels merge and add what those launches return.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "dtype.h"

namespace fa::context_parallel {

/// Chapter 03's merge, one warp per query row: the running state (o_acc, lse_acc), float, absorbs
/// a block's partial (o_part in `dtype`, lse_part) over keys it had not seen. `rows` rows of
/// `head_dim` values each; a row whose partial LSE is -inf is left as it is.
void merge_partial_rows(DType dtype, float* o_acc, float* lse_acc, const void* o_part, const float* lse_part,
                        int64_t rows, int head_dim, cudaStream_t stream);

/// acc[i] += part[i] (part in `dtype`): one block's term of dQ, dK or dV.
void add_into(DType dtype, float* acc, const void* part, int64_t count, cudaStream_t stream);

/// out[i] = acc[i] rounded to `dtype`.
void round_to(DType dtype, void* out, const float* acc, int64_t count, cudaStream_t stream);

/// Every element `value` (float buffers: the merge's starting state).
void fill_floats(float* out, float value, int64_t count, cudaStream_t stream);

/// Values in [-2, 2) from a hash of (seed, index), in `dtype`: the benchmark's inputs, made on
/// the GPU that uses them (a long sequence does not fit through the host quickly).
void fill_uniform(DType dtype, void* out, int64_t count, uint64_t seed, cudaStream_t stream);

}  // namespace fa::context_parallel
