// Chapter 06's host-side pieces shared by its kernel files.
#pragma once

#include <string>

#include "problem.h"

namespace fa::flash3 {

/// "" if chapter 06's kernels can run this shape here, else the reason: they need an sm_90 GPU
/// (Hopper: TMA, wgmma), head_dim 64 or 128, and batch * heads_q within the grid's y limit.
std::string hopper_support(const AttentionShape& s);

}  // namespace fa::flash3
