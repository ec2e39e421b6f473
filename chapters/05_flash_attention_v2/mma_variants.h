// Chapter 05's host-side pieces shared by its tensor-core variants (2 to 5): which shapes they
// take, and the shared-memory traffic note that compares the two ways of splitting a tile
// between warps. The device-side wrappers they use (mma.sync, ldmatrix, cp.async) are in
// common/ampere.cuh.
#pragma once

#include <initializer_list>
#include <string>

#include "problem.h"

namespace fa::flash2 {

/// "" if chapter 05's tensor-core kernels take this shape, else why not (head_dim in `head_dims`,
/// an sm_80+ GPU, batch * heads_q within the grid's y limit).
std::string mma_support(const AttentionShape& s, std::initializer_list<int> head_dims = {64, 128});

/// How a block's 4 warps share a 64-row Q tile and a 64-key K/V tile: variant 3 splits the rows
/// (Queries), variant 2 the keys (Keys, FlashAttention-1's arrangement).
enum class WarpSplit { Queries, Keys };
/// One line: the shared-memory bytes a block moves per K/V tile under `split`, by cause, and the
/// total over the launch (counted from the code, not measured).
std::string warp_split_traffic_note(const AttentionShape& s, WarpSplit split);

}  // namespace fa::flash2
