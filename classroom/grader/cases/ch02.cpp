// The checker's cases for chapter 02's exercises: the safe softmax of rows on the CPU, and the
// kernel with one thread block per row.
#include <cmath>
#include <string>
#include <vector>

#include "../cases.h"

namespace fa::grader {
namespace {

std::vector<Case> safe_row_cases(Rng& rng) { return softmax_row_cases(rng, "safe_row"); }

std::vector<Case> block_softmax_cases(Rng& rng) {
  // Timed, and gated on the large shape passing at a quarter of the reference's speed: a softmax
  // computed on the host gets the values right but not the speed.
  const std::vector<Variant> block = {Variant{{"kernel", "ch02_block"}}};
  std::vector<Case> cases = forward_cases(rng, block, DType::F32, 65, 700, {32, 64, 128});
  cases = with_large_scores(rng, std::move(cases), block, DType::F32, 65, 700, {32, 64, 128});
  return with_speed(rng, std::move(cases), "ch02_block", DType::F32, big_shape(16, 4096, 64), 0.25);
}

}  // namespace

FA_EXERCISE_CASES("ch02_safe_row_cpu", safe_row_cases);
FA_EXERCISE_CASES("ch02_block_softmax", block_softmax_cases);

}  // namespace fa::grader
