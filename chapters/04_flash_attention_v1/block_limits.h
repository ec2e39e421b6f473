// The launch limits every chapter 04 kernel checks in its `supports`: the block's shared memory
// against what the GPU gives one block, and batch * heads_q against gridDim.y (at most 65535)
// for the kernels that put one block per (Q tile, head) on the grid.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cuda_check.h"
#include "problem.h"

namespace fa::flash1 {

/// "" when a block of `shared_bytes` fits this GPU (48 KB when there is none to ask) and, with
/// `heads_on_grid_y`, batch * heads_q fits gridDim.y; otherwise the one-line reason.
inline std::string block_limits(const AttentionShape& s, std::size_t shared_bytes, bool heads_on_grid_y) {
  const GpuInfo& gpu = detect_gpu();
  const std::size_t limit = gpu.available ? gpu.shared_memory_per_block_optin : 48 * 1024;
  if (shared_bytes > limit) {
    return "needs " + std::to_string(shared_bytes) + " bytes of shared memory per block, the GPU allows " +
           std::to_string(limit);
  }
  const int64_t heads = int64_t(s.batch) * s.heads_q;
  if (heads_on_grid_y && heads > 65535) return "batch*heads_q must be at most 65535, got " + std::to_string(heads);
  return "";
}

}  // namespace fa::flash1
