// The two constants of softmax in base 2. Kernels compute exp(x) as exp2(x * log2(e)) (one
// MUFU.EX2 instruction) and keep the running max and the log-sum-exp in log2 units; the LSE
// they store is in natural-log units, ln(sum e^s) = log2(sum 2^(s log2 e)) * ln 2.
#pragma once

namespace fa {

constexpr float kLog2e = 1.4426950408889634f;  // log2(e) = 1 / ln 2
constexpr float kLn2 = 0.6931471805599453f;    // ln 2 = 1 / log2(e)

}  // namespace fa
