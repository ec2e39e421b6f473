// The checker's cases for chapter 03's exercises: the online update of (m, l) one score at a time,
// and the merge of two partial states.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "../answers.h"
#include "../cases.h"

namespace fa::grader {
namespace {

/// One update from states the checker draws: a running (m, l) that no score it saw produced, so
/// only the update rule itself gives the answer (an answer that keeps the scores and recomputes
/// the row cannot). Fresh states, scores under, over and equal to m, masked (-inf) scores, and
/// shifts up to +-1e4. The whole rows' cases count only when these pass.
std::vector<Case> update_from_states_cases(Rng& rng) {
  std::vector<Case> cases;
  for (int round = 0; round < 2; ++round) {
    const int rows = 256;
    Case c;
    c.name = "online_update from drawn states, " + std::to_string(rows) + " rows";
    c.is_step = true;
    c.from_answers = true;
    c.header.task = "online_update_from";
    c.header.args = {{"rows", std::to_string(rows)}};
    std::vector<double> want;
    for (int r = 0; r < rows; ++r) {
      const int kind = r % 6;
      const double shift = kind == 5 ? double(uniform(rng, -10000, 10000)) : 0.0;
      float m = float(shift + normal(rng, 1, 3.0f)[0]), l = float(1.0 + uniform(rng, 0, 500) / 10.0);
      float score = float(shift + normal(rng, 1, 3.0f)[0]);
      if (kind == 0) {  // fresh
        m = -INFINITY;
        l = 0.0f;
      } else if (kind == 1) {
        score = m - float(uniform(rng, 1, 20));  // under the max
      } else if (kind == 2) {
        score = m + float(uniform(rng, 1, 20));  // a new max
      } else if (kind == 3) {
        score = -INFINITY;  // masked
      } else if (kind == 4) {
        score = m;  // equal to the max
      }
      c.input.insert(c.input.end(), {m, l, score});
      double m_new = 0, l_new = 0;
      online_update_answer(m, l, score, m_new, l_new);
      want.push_back(m_new);
      want.push_back(l_new);
    }
    c.expect_values = want.size();
    c.judge = [want, rows](const std::vector<float>& out) -> std::string {
      for (int r = 0; r < rows; ++r) {
        const std::string why =
            judge_state(out[2 * r], out[2 * r + 1], want[2 * r], want[2 * r + 1], "drawn state " + std::to_string(r));
        if (!why.empty()) return why;
      }
      return "";
    };
    cases.push_back(c);
  }
  return cases;
}

std::vector<Case> online_update_cases(Rng& rng) {
  return gated(update_from_states_cases(rng), softmax_row_cases(rng, "online_update"));
}

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
