// The checker's cases for chapter 01's exercises: the scores S = scale Q K^T on the CPU, in both
// loop orders, and the score kernel.
#include <cmath>
#include <string>
#include <vector>

#include "../cases.h"

namespace fa::grader {
namespace {

std::vector<Case> scores_cases(Rng& rng) {
  std::vector<Case> cases;
  for (const char* products : {"per_thread", "tiled"}) {
    for (int i = 0; i < 3; ++i) {
      const AttentionShape s = i == 0 ? AttentionShape{} : draw_shape(rng, 65, 230, {16, 40, 64, 72});
      Case c;
      c.header.task = "scores";
      c.header.args = {{"products", products}};
      put_shape(c.header, s);
      c.name = std::string("scores ") + products + " " + s.to_string();
      c.weight = i == 0 ? 0 : 1;
      const std::vector<float> q = normal(rng, s.q_elems()), k = normal(rng, s.kv_elems());
      c.input = q;
      c.input.insert(c.input.end(), k.begin(), k.end());
      c.expect_values = std::size_t(s.batch) * s.heads_q * s.seq_q * s.seq_kv;
      c.judge = [=](const std::vector<float>& out) -> std::string {
        const double scale = s.softmax_scale();
        std::size_t at = 0;
        for (int bh = 0; bh < s.batch * s.heads_q; ++bh)
          for (int i = 0; i < s.seq_q; ++i)
            for (int j = 0; j < s.seq_kv; ++j, ++at) {
              const std::string where =
                  "S[" + std::to_string(bh) + "][" + std::to_string(i) + "][" + std::to_string(j) + "]";
              if (!s.visible(i, j)) {
                if (out[at] != -INFINITY) return where + " is masked and must be -inf, got " + fmt(out[at]);
                continue;
              }
              double dot = 0, mag = 0;
              for (int x = 0; x < s.head_dim; ++x) {
                const double a = q[s.q_head_offset(bh) + int64_t(i) * s.head_dim + x];
                const double b = k[s.kv_head_offset(bh) + int64_t(j) * s.head_dim + x];
                dot += a * b;
                mag += std::fabs(a * b);
              }
              if (!(std::fabs(out[at] - dot * scale) <= 1e-5 * mag * scale + 1e-6))
                return where + " = " + fmt(out[at]) + ", expected " + fmt(dot * scale);
            }
        return "";
      };
      cases.push_back(c);
    }
  }
  return cases;
}

std::vector<Case> score_kernel_cases(Rng& rng) {
  return forward_cases(rng, {Variant{{"kernel", "ch01_naive"}}}, DType::F32, 65, 300, {32, 64, 80});
}

}  // namespace

FA_EXERCISE_CASES("ch01_scores_cpu", scores_cases);
FA_EXERCISE_CASES("ch01_scores", score_kernel_cases);

}  // namespace fa::grader
