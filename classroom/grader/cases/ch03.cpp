// The checker's cases for chapter 03's exercises: the online update of (m, l) one score at a time,
// and the merge of two partial states.
#include <cmath>
#include <string>
#include <vector>

#include "../cases.h"

namespace fa::grader {
namespace {

std::vector<Case> online_update_cases(Rng& rng) { return softmax_row_cases(rng, "online_update"); }

std::vector<Case> merge_cases(Rng& rng) {
  std::vector<Case> cases;
  for (int round = 0; round < 4; ++round) {
    Case c;
    const int pairs = round == 0 ? 1 : 64;
    c.name = "online_merge pairs=" + std::to_string(pairs);
    c.weight = round == 0 ? 0 : 1;
    c.header.task = "online_merge";
    c.header.args = {{"pairs", std::to_string(pairs)}};
    std::vector<double> want;
    for (int i = 0; i < pairs; ++i) {
      const int n = uniform(rng, 2, 300), split = uniform(rng, 0, n);
      std::vector<float> row = softmax_rows(rng, 4, n);
      const float* x = row.data() + std::size_t(n) * (round == 0 ? 0 : i % 4);
      double ma, la, mb, lb, m, l;
      exact_state(x, split, ma, la);
      exact_state(x + split, n - split, mb, lb);
      exact_state(x, n, m, l);
      const bool swap = uniform(rng, 0, 1) == 1;
      const float sa[2] = {float(ma), float(la)}, sb[2] = {float(mb), float(lb)};
      for (float v :
           swap ? std::vector<float>{sb[0], sb[1], sa[0], sa[1]} : std::vector<float>{sa[0], sa[1], sb[0], sb[1]})
        c.input.push_back(v);
      want.push_back(m);
      want.push_back(l);
    }
    c.expect_values = std::size_t(pairs) * 2;
    c.judge = [=](const std::vector<float>& out) -> std::string {
      for (int i = 0; i < pairs; ++i) {
        const std::string why =
            judge_state(out[2 * i], out[2 * i + 1], want[2 * i], want[2 * i + 1], "pair " + std::to_string(i));
        if (!why.empty()) return why;
      }
      return "";
    };
    cases.push_back(c);
  }
  return cases;
}

}  // namespace

FA_EXERCISE_CASES("ch03_online_update", online_update_cases);
FA_EXERCISE_CASES("ch03_online_merge", merge_cases);

}  // namespace fa::grader
