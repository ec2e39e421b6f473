// Chapter 06's tasks for the CPU runner (runner_cpu.cpp, built with
// -DFA_RUNNER_TASKS="tasks/cpu_ch06.h"): tail_pieces over (blocks, slots, tiles) triples. It
// includes that chapter's code and nothing else.
#pragma once

#include <vector>

#include "../../../chapters/06_flash_attention_v3/algorithm.h"
#include "../protocol.h"

namespace fa::grader {

constexpr int kRunnerChapter = 6;

/// Computes the answer to `h` into `out`; false when this chapter has no such task.
inline bool run_chapter_task(const Header& h, const std::vector<float>& in, std::vector<float>& out) {
  if (h.task == "tail_pieces") {  // (blocks, slots, tiles) triples -> pieces
    const int n = int(h.num("n"));
    pieces(in, {std::size_t(n) * 3});
    for (int i = 0; i < n; ++i)
      out.push_back(float(flash3::tail_pieces(int(in[3 * i]), int(in[3 * i + 1]), int(in[3 * i + 2]))));
    return true;
  }
  return false;
}

}  // namespace fa::grader
