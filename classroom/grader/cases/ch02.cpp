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
  return forward_cases(rng, {Variant{{"kernel", "ch02_block"}}}, DType::F32, 65, 700, {32, 64, 128});
}

}  // namespace

FA_EXERCISE_CASES("ch02_safe_row_cpu", safe_row_cases);
FA_EXERCISE_CASES("ch02_block_softmax", block_softmax_cases);

}  // namespace fa::grader
