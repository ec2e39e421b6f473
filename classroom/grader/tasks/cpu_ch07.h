// Chapter 07's tasks for the CPU runner (runner_cpu.cpp, built with
// -DFA_RUNNER_TASKS="tasks/cpu_ch07.h"): the backward pass (dQ, dK, dV). It includes that chapter's
// code and nothing else.
#pragma once

#include <vector>

#include "../../../chapters/07_backward/algorithm.h"
#include "../protocol.h"

namespace fa::grader {

constexpr int kRunnerChapter = 7;

/// Computes the answer to `h` into `out`; false when this chapter has no such task.
inline bool run_chapter_task(const Header& h, const std::vector<float>& in, std::vector<float>& out) {
  if (h.task == "backward") {  // q, k, v, o, lse, dO in; dQ, dK, dV out
    const AttentionShape s = shape_of(h);
    const std::size_t nq = s.q_elems(), nk = s.kv_elems();
    const auto p = pieces(in, {nq, nk, nk, nq, std::size_t(s.lse_elems()), nq});
    std::vector<float> dq(nq), dk(nk), dv(nk);
    backward::flash_backward_cpu(s, p[0], p[1], p[2], p[3], p[4], p[5], dq.data(), dk.data(), dv.data());
    out = dq;
    out.insert(out.end(), dk.begin(), dk.end());
    out.insert(out.end(), dv.begin(), dv.end());
    return true;
  }
  return false;
}

}  // namespace fa::grader
