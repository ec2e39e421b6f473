// Chapter 09's tasks for the CPU runner (runner_cpu.cpp, built with
// -DFA_RUNNER_TASKS="tasks/cpu_ch09.h"): the K/V tiles a window leaves a tile of query rows
// (tile_keys) and the query rows that see a K/V tile (rows_for_keys). It includes that chapter's
// code and nothing else.
#pragma once

#include <vector>

#include "../../../chapters/09_real_model_features/algorithm.h"
#include "../protocol.h"

namespace fa::grader {

constexpr int kRunnerChapter = 9;

/// Computes the answer to `h` into `out`; false when this chapter has no such task.
inline bool run_chapter_task(const Header& h, const std::vector<float>& in, std::vector<float>& out) {
  if (h.task == "window_tiles") {
    // Per query: seq_q, seq_kv, causal, window_left, window_right, first_row, last_row, tile,
    // j0, j1 in; tile_keys' begin and end, then rows_for_keys' begin and end out.
    const int n = int(h.num("n"));
    pieces(in, {std::size_t(n) * 10});
    for (int i = 0; i < n; ++i) {
      const float* x = in.data() + std::size_t(i) * 10;
      AttentionShape s;
      s.seq_q = int(x[0]);
      s.seq_kv = int(x[1]);
      s.causal = x[2] != 0.0f;
      AttentionFeatures f;
      f.window_left = int(x[3]);
      f.window_right = int(x[4]);
      const WindowMask mask(s, f);
      const features::KeySpan keys = features::tile_keys(mask, int(x[5]), int(x[6]), int(x[7]));
      const features::KeySpan rows = features::rows_for_keys(mask, int(x[8]), int(x[9]));
      out.push_back(float(keys.begin));
      out.push_back(float(keys.end));
      out.push_back(float(rows.begin));
      out.push_back(float(rows.end));
    }
    return true;
  }
  return false;
}

}  // namespace fa::grader
