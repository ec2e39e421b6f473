// Host side of the Hopper kernels (chapters 06 and 07): the tensor maps they copy tiles with, and
// which GPUs and shapes they take.
#pragma once

#include <cuda.h>  // CUtensorMap; the encoder is fetched from the driver at run time, nothing is linked

#include <cstdint>
#include <initializer_list>
#include <string>

#include "problem.h"
#include "strides.h"

namespace fa {

/// "" if a Hopper kernel (TMA, wgmma: sm_90a code) can run this shape here, else the reason,
/// starting with `who` ("chapter 06", "variant 4"): it needs an sm_90 GPU, a head_dim in `head_dims`,
/// and batch * heads_q within the grid's y limit.
std::string hopper_support(const AttentionShape& s, const std::string& who,
                           std::initializer_list<int> head_dims = {64, 128});

/// A tensor map over an array laid out [planes][rows][cols] (cols contiguous; a plane is one
/// (batch, head) of Q, K, V or a bias), cut into boxes of box_rows x 128 bytes stored in shared
/// memory with the 128-byte swizzle. Rows past `rows` (and columns past `cols`) read as zeros, so
/// a tile hanging over the end of a sequence never sees the next head. element_bytes: 2 (bf16,
/// boxes of 64 columns), 1 (fp8, 128 columns) or 4 (fp32, 32 columns). The base and each row must
/// start on a 16-byte boundary. Throws std::runtime_error with the driver's message on failure.
CUtensorMap make_tensor_map_sw128(const void* base, int element_bytes, int cols, int rows, int planes, int box_rows);
/// The same with box rows of `row_bytes` (64 or 128) and the matching swizzle (64- or 128-byte).
CUtensorMap make_tensor_map_swizzled(const void* base, int element_bytes, int cols, int rows, int planes, int box_rows,
                                     int row_bytes);
/// A 4-D tensor map over a bf16 [batch][heads][rows][cols] tensor with any strides (cols
/// contiguous; TensorStrides in elements, multiples of 8), in boxes of box_rows x 64 columns with
/// the 128-byte swizzle: the same boxes as make_tensor_map_sw128 for a packed tensor, addressed
/// by (column, row, head, batch) (hopper::tma_load_head). Rows past `rows` read as zeros.
CUtensorMap make_tensor_map_heads(const void* base, int cols, int rows, int heads, int batch,
                                  const TensorStrides& strides, int box_rows);

}  // namespace fa
