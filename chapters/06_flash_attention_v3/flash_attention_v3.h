// Chapter 06's host-side pieces shared by its kernel files.
#pragma once

#include <initializer_list>
#include <string>

#include "problem.h"

namespace fa::flash3 {

/// "" if chapter 06's kernels can run this shape here, else the reason: they need an sm_90 GPU
/// (Hopper: TMA, wgmma), a head_dim in `head_dims`, and batch * heads_q within the grid's y limit.
std::string hopper_support(const AttentionShape& s, std::initializer_list<int> head_dims = {64, 128});

/// Variant 5's grid at this shape on the current GPU: its blocks (Q blocks x planes), the block
/// slots the GPU runs at once (SMs x blocks per SM), and the last wave's `tail` blocks, each run
/// as `pieces` blocks over its share of the K/V tiles (tail_pieces in algorithm.h). Causal
/// shapes, and runs without a GPU, are not split (pieces 1).
struct Fp8TailSplit {
  int blocks = 0, slots = 0, tail = 0, pieces = 1;
};
Fp8TailSplit fp8_tail_split(const AttentionShape& s);

}  // namespace fa::flash3
