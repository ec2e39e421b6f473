// Chapter 02's tasks for the CPU runner (runner_cpu.cpp, built with
// -DFA_RUNNER_TASKS="tasks/cpu_ch02.h"): the safe softmax of rows and their LSEs. It includes that
// chapter's code and nothing else.
#pragma once

#include <vector>

#include "../../../chapters/02_safe_softmax/algorithm.h"
#include "../protocol.h"

namespace fa::grader {

constexpr int kRunnerChapter = 2;

/// Computes the answer to `h` into `out`; false when this chapter has no such task.
inline bool run_chapter_task(const Header& h, const std::vector<float>& in, std::vector<float>& out) {
  if (h.task == "safe_row") {  // rows x n scores -> rows x n probabilities, then rows LSEs
    const int rows = int(h.num("rows")), n = int(h.num("n"));
    pieces(in, {std::size_t(rows) * n});
    out.assign(in.begin(), in.begin() + std::size_t(rows) * n);
    std::vector<float> lse(rows);
    for (int r = 0; r < rows; ++r) lse[r] = safe::safe_softmax_row(out.data() + std::size_t(r) * n, n);
    out.insert(out.end(), lse.begin(), lse.end());
    return true;
  }
  return false;
}

}  // namespace fa::grader
