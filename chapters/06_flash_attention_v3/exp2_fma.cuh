// Chapter 06: 2^x on the FMA pipe, for a kernel whose softmax is longer than its two products.
//
// An H100 or H200 SM computes 16 exp2 a clock on its MUFU unit against 4,096 dense bf16 FLOP on
// its tensor cores: at head_dim 64 a tile's exponentials take about as long as its matrix products.
// FlashAttention-4 computes part of them on the FMA pipe instead, which Hopper has too:
//   x = n + f, n = floor(x), f in [0, 1);  2^f ~ c0 + f (c1 + f (c2 + f c3))  (three FMAs);
//   2^x = 2^f with n added to its exponent bits (one integer add).
// The coefficients are a relative-minimax fit of 2^f on [0, 1): the largest relative error is
// 7.5e-5, a fiftieth of a bf16 ulp (2^-8), so P rounded to bf16 for the P V product barely sees
// it (tests/cpu/test_exp2_fma.cpp measures it over the softmax's whole range).
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

/// 2^x by a degree-3 polynomial on the FMA pipe. x below -125 gives 0 (and so does a masked
/// score's -inf): 2^f is 0.99993 at f = 0, which in the lowest binade would land below the normal
/// floats, and no softmax weight that small counts next to its row's largest, 1. x of 128 or more
/// gives inf; NaN stays NaN. A softmax calls it with x = s - m <= 0.
FA_HD inline float exp2_fma(float x) {
  constexpr float kC0 = 0.99992526f, kC1 = 0.6958335f, kC2 = 0.2260672f, kC3 = 0.07802454f;
  if (!(x >= -125.0f)) return x != x ? x : 0.0f;
  if (x >= 128.0f) return INFINITY;
  const float n = floorf(x), f = x - n;
  const float p = fmaf(fmaf(fmaf(kC3, f, kC2), f, kC1), f, kC0);  // 2^f, in [1, 2) within 7.5e-5
  return bits_float(float_bits(p) + int32_t(n) * (1 << 23));      // times 2^n: n added to the exponent
}

}  // namespace fa::flash3
