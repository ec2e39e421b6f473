// Chapter 01's tasks for the CPU runner (runner_cpu.cpp, built with
// -DFA_RUNNER_TASKS="tasks/cpu_ch01.h"): the scores of every head, in the loop order the request
// names. It includes that chapter's code and nothing else.
#pragma once

#include <vector>

#include "../../../chapters/01_naive_attention/algorithm.h"
#include "../protocol.h"

namespace fa::grader {

constexpr int kRunnerChapter = 1;

/// Computes the answer to `h` into `out`; false when this chapter has no such task.
inline bool run_chapter_task(const Header& h, const std::vector<float>& in, std::vector<float>& out) {
  if (h.task == "scores") {  // S of every head: [B * Hq][Nq][Nk]
    const AttentionShape s = shape_of(h);
    const auto p = pieces(in, {std::size_t(s.q_elems()), std::size_t(s.kv_elems())});
    const auto products = h.str("products") == "tiled" ? naive::Products::Tiled : naive::Products::PerThread;
    std::vector<float> scores;
    for (int bh = 0; bh < s.batch * s.heads_q; ++bh) {
      naive::scores_cpu(s, p[0] + s.q_head_offset(bh), p[1] + s.kv_head_offset(bh), scores, products);
      out.insert(out.end(), scores.begin(), scores.end());
    }
    return true;
  }
  return false;
}

}  // namespace fa::grader
