// The row-step task that chapters 04 and 05's CPU runners share (tasks/cpu_ch04.h, cpu_ch05.h).
// One call of the chapter's row step per row, each from a state the checker chose: per row
// (m, l, o[d]), `cols` scores, the number of keys, and the tile's cols x d values of V in;
// (m, l, o[d]) after the step out. Each call gets fresh copies, so a step can only compute its
// answer from what it is given.
#pragma once

#include <cmath>
#include <vector>

#include "../protocol.h"

namespace fa::grader {

/// `step(row, cols, tile_max, m, l, o, v, keys, d)`: the chapter's row step on one row.
template <class Step>
void row_step_task(const Header& h, const std::vector<float>& in, std::vector<float>& out, Step step) {
  const int rows = int(h.num("rows")), cols = int(h.num("cols")), d = int(h.num("d"));
  const auto p = pieces(
      in, {std::size_t(rows) * (2 + d), std::size_t(rows) * cols, std::size_t(rows), std::size_t(rows) * cols * d});
  for (int r = 0; r < rows; ++r) {
    const float* state = p[0] + std::size_t(r) * (2 + d);
    float m = state[0], l = state[1];
    std::vector<float> o(state + 2, state + 2 + d), row(p[1] + std::size_t(r) * cols, p[1] + std::size_t(r + 1) * cols);
    const std::vector<float> v(p[3] + std::size_t(r) * cols * d, p[3] + std::size_t(r + 1) * cols * d);
    float tile_max = -INFINITY;
    for (float x : row) tile_max = std::fmax(tile_max, x);
    const int keys = int(p[2][r]);
    step(row.data(), cols, tile_max, m, l, o.data(), v.data(), keys, d);
    out.push_back(m);
    out.push_back(l);
    out.insert(out.end(), o.begin(), o.end());
  }
}

}  // namespace fa::grader
