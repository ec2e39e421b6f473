// Chapter 06: 2^x on the FMA pipe, for a kernel whose softmax is longer than its two products.
//
// An H100 or H200 SM computes 16 exp2 a clock on its MUFU unit against 4,096 dense bf16 FLOP on
// its tensor cores: at head_dim 64 a tile's exponentials take about as long as its matrix products.
// FlashAttention-4 computes part of them on the FMA pipe instead, which Hopper has too:
//   x = n + f, n = x rounded to an integer, f in [-1/2, 1/2];
//   2^f ~ c0 + f (c1 + f (c2 + f c3))  (three FMAs);  2^x = 2^f with n added to its exponent bits.
// The rounding is an add: x + 1.5 * 2^23 is a float whose last mantissa bits hold n, and
// subtracting 1.5 * 2^23 again gives n as a float. No floor, no float-to-int conversion: those
// run on the same slow unit as MUFU.EX2, or branch. The coefficients are a relative-minimax fit
// of 2^f on [-1/2, 1/2]: the largest relative error is 7.5e-5, a fiftieth of bf16's rounding error (2^-8),
// so P rounded to bf16 for the P V product barely sees it (tests/cpu/test_exp2_fma.cpp measures
// it over the softmax's whole range).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "problem.h"

namespace fa::flash3 {

/// The bits of a float as an int, and back (the same on the host and the device).
FA_HD inline int32_t float_bits(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_int(x);
#else
  int32_t i;
  std::memcpy(&i, &x, sizeof i);
  return i;
#endif
}
FA_HD inline float bits_float(int32_t i) {
#ifdef __CUDA_ARCH__
  return __int_as_float(i);
#else
  float x;
  std::memcpy(&x, &i, sizeof x);
  return x;
#endif
}

/// 2^x by a degree-3 polynomial on the FMA pipe, for x < 128 (a softmax's x = s - m is at most
/// a few units; with variant 8's lazy max, at most 8). x at or below -125, a masked score's -inf
/// among them, gives about 2^-125 (2.4e-38, a normal float): next to a row's largest weight, 1, it
/// counts as nothing in any sum, and a caller that needs an exact 0 (a row that has seen no key)
/// selects it. No branch: every lane runs the same eight instructions.
FA_HD inline float exp2_fma(float x) {
  constexpr float kC0 = 0.99992806f, kC1 = 0.69326097f, kC2 = 0.24261117f, kC3 = 0.05517168f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: x + kRound keeps x rounded to an integer
  x = fmaxf(x, -125.0f);
  const float t = x + kRound;
  const float f = x - (t - kRound);                                           // in [-1/2, 1/2]
  const float p = fmaf(fmaf(fmaf(kC3, f, kC2), f, kC1), f, kC0);              // 2^f, within 7.5e-5
  return bits_float(float_bits(p) + int32_t(uint32_t(float_bits(t)) << 23));  // times 2^n
}

}  // namespace fa::flash3
