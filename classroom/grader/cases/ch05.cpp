// The checker's cases for chapter 05's exercises: FlashAttention-2's tile step on the CPU (alone
// from drawn states, then the whole loop), and O += P V in the tuned, mma, pipelined and split-KV
// kernels, with the speed part on the tuned one.
#include <cmath>
#include <string>
#include <vector>

#include "../cases.h"

namespace fa::grader {
namespace {

std::vector<Case> tile_cpu_cases(Rng& rng) {
  return steps_and_forward(rng, false, forward_cases(rng, {Variant{}}, DType::F32, 65, 260, {16, 32, 64}));
}

std::vector<Case> pv_cases(Rng& rng) {
  std::vector<Case> cases =
      forward_cases(rng, {Variant{{"kernel", "ch05_tuned_bf16"}}}, DType::BF16, 65, 700, {64, 96, 128, 256}, 2);
  const std::vector<Case> mma =
      forward_cases(rng, {Variant{{"kernel", "ch05_mma_bf16"}}}, DType::BF16, 65, 700, {64, 128}, 2);
  cases.insert(cases.end(), mma.begin(), mma.end());
  const std::vector<Case> fp16 =
      forward_cases(rng, {Variant{{"kernel", "ch05_pipelined_fp16"}}, Variant{{"kernel", "ch05_kv_split_fp16"}}},
                    DType::F16, 65, 700, {64, 128}, 2);
  cases.insert(cases.end(), fp16.begin(), fp16.end());
  return with_speed(rng, cases, "ch05_tuned_bf16", DType::BF16, big_shape(16, 4096, 128));
}

}  // namespace

FA_EXERCISE_CASES("ch05_tile_cpu", tile_cpu_cases);
FA_EXERCISE_CASES("ch05_pv", pv_cases);

}  // namespace fa::grader
