// The forward chapter 07 runs for O and LSE when the oracle does not give them (shapes too big
// for an fp64 oracle over every head), as a training step would run its forward before the
// backward. Chapter 04's fp32 `registers` kernel: in fp32 the error O and LSE bring in stays
// far below every backward kernel's tolerance, so the gradients' error is the backward's own.
// Chapter 07's program, fa_bench --backward and the fuzz tests all take it from here.
#pragma once

#include "../04_flash_attention_v1/registers_kernel.h"

namespace fa::backward {

inline ForwardKernel forward_for_backward() { return flash1::registers_kernel(); }

}  // namespace fa::backward
