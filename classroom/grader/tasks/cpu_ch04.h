// Chapter 04's tasks for the CPU runner (runner_cpu.cpp, built with
// -DFA_RUNNER_TASKS="tasks/cpu_ch04.h"): FlashAttention-1's row step from given states, and the
// whole loop in either order. It includes that chapter's code and nothing else.
#pragma once

#include <vector>

#include "../../../chapters/04_flash_attention_v1/algorithm.h"
#include "../protocol.h"
#include "row_step.h"

namespace fa::grader {

constexpr int kRunnerChapter = 4;

/// Computes the answer to `h` into `out`; false when this chapter has no such task.
inline bool run_chapter_task(const Header& h, const std::vector<float>& in, std::vector<float>& out) {
  if (h.task == "row_step") {
    row_step_task(h, in, out,
                  [](float* row, int cols, float tile_max, float& m, float& l, float* o, const float* v, int keys,
                     int d) { flash1::flash1_row_step(row, cols, tile_max, m, l, o, v, keys, d); });
    return true;
  }
  if (h.task == "forward") {  // O [B,Hq,Nq,d] then LSE [B,Hq,Nq]
    const AttentionShape s = shape_of(h);
    const auto p = pieces(in, {std::size_t(s.q_elems()), std::size_t(s.kv_elems()), std::size_t(s.kv_elems())});
    std::vector<float> o(s.q_elems()), lse(s.lse_elems());
    const auto order = h.str("order") == "q_outer" ? flash1::LoopOrder::QOuter : flash1::LoopOrder::KvOuter;
    flash1::flash_attention_v1_cpu(s, p[0], p[1], p[2], o.data(), lse.data(), order, flash1::choose_tiles(s.head_dim));
    out = o;
    out.insert(out.end(), lse.begin(), lse.end());
    return true;
  }
  return false;
}

}  // namespace fa::grader
