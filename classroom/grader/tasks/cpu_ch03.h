// Chapter 03's tasks for the CPU runner (runner_cpu.cpp, built with
// -DFA_RUNNER_TASKS="tasks/cpu_ch03.h"): the online update of (m, l) over rows, and the merge of
// state pairs. It includes that chapter's code and nothing else.
#pragma once

#include <cmath>
#include <vector>

#include "../../../chapters/03_online_softmax/algorithm.h"
#include "../protocol.h"

namespace fa::grader {

constexpr int kRunnerChapter = 3;

/// Computes the answer to `h` into `out`; false when this chapter has no such task.
inline bool run_chapter_task(const Header& h, const std::vector<float>& in, std::vector<float>& out) {
  if (h.task == "online_update") {  // each row folded in one score at a time -> (m, l) per row
    const int rows = int(h.num("rows")), n = int(h.num("n"));
    pieces(in, {std::size_t(rows) * n});
    for (int r = 0; r < rows; ++r) {
      online::MaxSum state{-INFINITY, 0.0f};
      for (int j = 0; j < n; ++j) state = online::online_update(state, in[std::size_t(r) * n + j]);
      out.push_back(state.m);
      out.push_back(state.l);
    }
    return true;
  }
  if (h.task == "online_update_from") {  // (m, l, score) per row -> (m, l) after one update
    const int rows = int(h.num("rows"));
    pieces(in, {std::size_t(rows) * 3});
    for (int r = 0; r < rows; ++r) {
      const float* x = in.data() + std::size_t(r) * 3;
      const online::MaxSum state = online::online_update({x[0], x[1]}, x[2]);
      out.push_back(state.m);
      out.push_back(state.l);
    }
    return true;
  }
  if (h.task == "online_merge") {  // (m_a, l_a, m_b, l_b) per pair -> (m, l)
    const int pairs = int(h.num("pairs"));
    pieces(in, {std::size_t(pairs) * 4});
    for (int i = 0; i < pairs; ++i) {
      const float* x = in.data() + std::size_t(i) * 4;
      const online::MaxSum merged = online::online_merge({x[0], x[1]}, {x[2], x[3]});
      out.push_back(merged.m);
      out.push_back(merged.l);
    }
    return true;
  }
  return false;
}

}  // namespace fa::grader
