// The checker's cases for chapter 04's exercises: FlashAttention-1's row step on the CPU (alone
// from drawn states, then the whole loop in both orders), and the four kernels that call the GPU
// row update, with the speed part on the registers kernel.
#include <cmath>
#include <string>
#include <vector>

#include "../cases.h"

namespace fa::grader {
namespace {

std::vector<Case> row_update_cpu_cases(Rng& rng) {
  return steps_and_forward(rng, true,
                           forward_cases(rng, {Variant{{"order", "kv_outer"}}, Variant{{"order", "q_outer"}}},
                                         DType::F32, 65, 260, {16, 32, 64}, 2));
}

std::vector<Case> row_update_cases(Rng& rng) {
  const std::vector<Variant> kernels = {Variant{{"kernel", "ch04_kv_outer"}}, Variant{{"kernel", "ch04_q_outer"}},
                                        Variant{{"kernel", "ch04_registers"}}, Variant{{"kernel", "ch04_tuned"}}};
  std::vector<Case> cases = forward_cases(rng, kernels, DType::F32, 65, 600, {64, 128}, 2);
  cases = with_large_scores(rng, std::move(cases), kernels, DType::F32, 65, 600, {64, 128});
  return with_speed(rng, cases, "ch04_registers", DType::F32, big_shape(8, 2048, 64));
}

}  // namespace

FA_EXERCISE_CASES("ch04_row_update_cpu", row_update_cpu_cases);
FA_EXERCISE_CASES("ch04_row_update", row_update_cases);

}  // namespace fa::grader
