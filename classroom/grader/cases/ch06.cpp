// The checker's cases for chapter 06's exercises: how many pieces the last wave's blocks are split
// into (against the instructor's tail_pieces), and the producer's loop in the warp-specialized and
// ping-pong kernels, with the speed part on the ping-pong one.
#include <cmath>
#include <string>
#include <vector>

#include "../../../chapters/06_flash_attention_v3/algorithm.h"
#include "../cases.h"

namespace fa::grader {
namespace {

std::vector<Case> tail_pieces_cases(Rng& rng) {
  std::vector<Case> cases;
  for (int round = 0; round < 3; ++round) {
    Case c;
    const int n = round == 0 ? 1 : 500;
    c.name = "tail_pieces n=" + std::to_string(n);
    c.weight = round == 0 ? 0 : 1;
    c.header.task = "tail_pieces";
    c.header.args = {{"n", std::to_string(n)}};
    std::vector<int> want;
    for (int i = 0; i < n; ++i) {
      const int slots = round == 0 ? 132 : uniform(rng, 1, 300);
      const int blocks = round == 0 ? 132 : uniform(rng, 0, 4 * slots + 7);
      const int tiles = uniform(rng, 1, 200);
      c.input.insert(c.input.end(), {float(blocks), float(slots), float(tiles)});
      want.push_back(flash3::tail_pieces(blocks, slots, tiles));  // the instructor's
    }
    c.expect_values = std::size_t(n);
    const std::vector<float> in = c.input;
    c.judge = [=](const std::vector<float>& out) -> std::string {
      for (int i = 0; i < n; ++i)
        if (out[i] != float(want[i]))
          // The expected answer is the solution's own: not shown, or the grader would answer questions.
          return "tail_pieces(" + fmt(in[3 * i]) + ", " + fmt(in[3 * i + 1]) + ", " + fmt(in[3 * i + 2]) +
                 ") = " + fmt(out[i]) + " is not the right number of pieces";
      return "";
    };
    cases.push_back(c);
  }
  return cases;
}

// At least 400 keys, so the producer refills stages (more tiles than the ring's 2).
std::vector<Case> producer_cases(Rng& rng) {
  std::vector<Case> cases =
      forward_cases(rng, {Variant{{"kernel", "ch06_specialized_bf16"}}, Variant{{"kernel", "ch06_pingpong_bf16"}}},
                    DType::BF16, 400, 2500, {64, 128}, 3);
  return with_speed(rng, cases, "ch06_pingpong_bf16", DType::BF16, big_shape(16, 4096, 128));
}

}  // namespace

// tail_pieces' expected answers are the instructor's own function's.
FA_EXERCISE_CASES("ch06_tail_pieces", tail_pieces_cases, Answers::FromSolution);
FA_EXERCISE_CASES("ch06_producer", producer_cases);

}  // namespace fa::grader
