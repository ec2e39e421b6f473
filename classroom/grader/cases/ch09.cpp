// The checker's cases for chapter 09's exercise: the K/V tiles a window leaves a tile of query
// rows, and the query rows that see a K/V tile, against the mask's rule row by row.
#include <string>
#include <vector>

#include "../answers.h"
#include "../cases.h"
#include "attention_features.h"

namespace fa::grader {
namespace {

/// Shapes with and without the causal mask, windows on one side, both or none (-1), seq_q above
/// and below seq_kv (bottom-right aligned), query tiles anywhere, tiles of 64 and 128 keys and
/// odd ones. The answers come from the mask's own rule, row by row: the first row's first key
/// rounded down to the tile, the last row's end; the first row whose run ends after j0 and the
/// first row from there whose run starts at or after j1.
std::vector<Case> window_tile_cases(Rng& rng) {
  std::vector<Case> cases;
  for (int round = 0; round < 4; ++round) {
    const int n = round == 0 ? 1 : 200;
    Case c;
    c.name = "window tiles, " + std::to_string(n) + " queries";
    c.from_answers = true;
    c.weight = round == 0 ? 0 : 1;
    c.header.task = "window_tiles";
    c.header.args = {{"n", std::to_string(n)}};
    std::vector<int> want;
    for (int i = 0; i < n; ++i) {
      AttentionShape s;
      s.seq_q = round == 0 ? 1 : uniform(rng, 1, 3000);
      s.seq_kv = round == 0 ? 1 : uniform(rng, 1, 3000);
      s.causal = uniform(rng, 0, 1) == 1;
      AttentionFeatures f;
      const int kind = uniform(rng, 0, 3);
      f.window_left = kind == 0 ? -1 : uniform(rng, 0, 700);
      f.window_right = kind == 1 || s.causal ? (s.causal ? 0 : -1) : uniform(rng, -1, 300);
      const WindowMask mask(s, f);
      const int tile = std::vector<int>{64, 128, 176, 16}[uniform(rng, 0, 3)];
      const int first = uniform(rng, 0, s.seq_q - 1), last = std::min(s.seq_q - 1, first + uniform(rng, 0, 127));
      const int j0 = uniform(rng, 0, (s.seq_kv - 1) / 64) * 64, j1 = std::min(s.seq_kv, j0 + 64 * uniform(rng, 1, 2));
      for (int v : {s.seq_q, s.seq_kv, int(s.causal), f.window_left, f.window_right, first, last, tile, j0, j1})
        c.input.push_back(float(v));
      int answer[4];
      tile_answer(mask, first, last, tile, j0, j1, answer);
      want.insert(want.end(), answer, answer + 4);
    }
    c.expect_values = want.size();
    c.judge = [want, n, input = c.input](const std::vector<float>& out) -> std::string {
      static const char* what[] = {"tile_keys' begin", "tile_keys' end", "rows_for_keys' begin", "rows_for_keys' end"};
      for (int i = 0; i < n; ++i)
        for (int k = 0; k < 4; ++k)
          if (out[4 * i + k] != float(want[4 * i + k])) {
            const float* x = input.data() + std::size_t(i) * 10;
            return "query " + std::to_string(i) + " (seq_q " + fmt(x[0]) + ", seq_kv " + fmt(x[1]) + ", causal " +
                   fmt(x[2]) + ", window (" + fmt(x[3]) + ", " + fmt(x[4]) + "), rows " + fmt(x[5]) + ".." + fmt(x[6]) +
                   ", tile " + fmt(x[7]) + ", keys " + fmt(x[8]) + ".." + fmt(x[9]) + "): " + what[k] + " is " +
                   fmt(out[4 * i + k]) + ", expected " + std::to_string(want[4 * i + k]);
          }
      return "";
    };
    cases.push_back(c);
  }
  return cases;
}

}  // namespace

FA_EXERCISE_CASES("ch09_window_tiles_cpu", window_tile_cases);

}  // namespace fa::grader
