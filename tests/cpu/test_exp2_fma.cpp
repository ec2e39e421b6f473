// Chapter 06's 2^x on the FMA pipe (exp2_fma.cuh) against 2^x in fp64, on the host: the function
// is FA_HD and uses only float adds, FMAs, a max and an integer shift and add, whose results are
// the same on the host and the device, so this measures what a kernel gets. Over the softmax's range
// (x = s - m in [-125, 0], and up to 8 above with variant 8's lazy max, which moves a row's max
// only when its scores outgrow it by more than 2^8): the
// largest relative error, and how often P rounded to bf16 differs from exact 2^x rounded to bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>

#include "../../chapters/06_flash_attention_v3/exp2_fma.cuh"
#include "dtype.h"

namespace fa {
namespace {

using flash3::bits_float;
using flash3::exp2_fma;
using flash3::float_bits;

/// Every float in [lo, 0] and [0, hi] (lo <= 0 <= hi) whose bit pattern is a multiple of `step`
/// from zero's: a sample spread evenly over the floats, so every binade gets its share.
template <class F>
void for_floats(float lo, float hi, uint32_t step, F&& f) {
  const uint32_t negative_end = uint32_t(float_bits(lo));  // -0 is 0x80000000; lower values count up
  for (uint32_t b = 0x80000000u; b <= negative_end; b += step) f(bits_float(int32_t(b)));
  for (uint32_t b = 0; bits_float(int32_t(b)) <= hi; b += step) f(bits_float(int32_t(b)));
}

TEST(Exp2Fma, RelativeErrorOverTheSoftmaxRange) {
  double worst = 0, worst_x = 0;
  int64_t n = 0, bf16_differs = 0;
  double bf16_worst_ulps = 0;
  for_floats(-125.0f, 8.0f, 97, [&](float x) {
    const double exact = std::exp2(double(x));
    const float got = exp2_fma(x);
    const double rel = std::fabs(double(got) / exact - 1.0);
    if (rel > worst) worst = rel, worst_x = x;
    const float a = round_to_dtype(got, DType::BF16), b = round_to_dtype(float(exact), DType::BF16);
    if (a != b) {
      ++bf16_differs;
      const double ulp = std::ldexp(1.0, std::ilogb(b) - 7);  // bf16 keeps 7 bits after the leading one
      bf16_worst_ulps = std::max(bf16_worst_ulps, std::fabs(double(a) - double(b)) / ulp);
    }
    ++n;
  });
  std::printf(
      "exp2_fma over [-125, 8]: %lld floats, largest relative error %.3g (at x = %.9g); bf16 P differs "
      "from exact 2^x in bf16 for %.3g%% of them, by at most %.2g bf16 ulp\n",
      static_cast<long long>(n), worst, worst_x, 100.0 * double(bf16_differs) / double(n), bf16_worst_ulps);
  EXPECT_GT(n, 1000000);
  EXPECT_LT(worst, 7.6e-5) << "at x = " << worst_x;
  EXPECT_LT(double(bf16_differs) / double(n), 0.05);
  EXPECT_LE(bf16_worst_ulps, 1.0 + 1e-9);
}

TEST(Exp2Fma, Bf16WeightsOfASoftmax) {
  // x spread evenly over [-16, 0], where a row's weights that count lie (2^-16 of its largest and
  // more): how often the bf16 P that the P V product takes differs from exact 2^x in bf16.
  const int n = 1 << 22;
  int bf16_differs = 0;
  double worst = 0;
  for (int i = 0; i <= n; ++i) {
    const float x = -16.0f * float(i) / float(n);
    const double exact = std::exp2(double(x));
    worst = std::max(worst, std::fabs(double(exp2_fma(x)) / exact - 1.0));
    if (round_to_dtype(exp2_fma(x), DType::BF16) != round_to_dtype(float(exact), DType::BF16)) ++bf16_differs;
  }
  std::printf("exp2_fma on [-16, 0] evenly: largest relative error %.3g; bf16 P differs for %.3g%% of x\n", worst,
              100.0 * bf16_differs / (n + 1.0));
  EXPECT_LT(worst, 7.6e-5);
  EXPECT_LT(double(bf16_differs) / (n + 1.0), 0.05);
}

TEST(Exp2Fma, EndsAndSpecialValues) {
  // At or below -125 (a masked score's -inf too): 2^-125 within the error bound, a normal float.
  for (const float x : {-std::numeric_limits<float>::infinity(), -1000.0f, -125.5f, -125.0f}) {
    const double rel = double(exp2_fma(x)) / std::ldexp(1.0, -125) - 1.0;
    EXPECT_LT(std::fabs(rel), 7.6e-5) << "x = " << x;
    EXPECT_GE(exp2_fma(x), std::numeric_limits<float>::min()) << "x = " << x;
  }
  for (int n = -125; n <= 127; ++n) {  // at the integers 2^x is c0 * 2^n: within the error bound
    const double rel = double(exp2_fma(float(n))) / std::ldexp(1.0, n) - 1.0;
    EXPECT_LT(std::fabs(rel), 7.6e-5) << "x = " << n;
  }
  // The top of the range: n = 128 with f < 0 still lands below the largest float.
  for (const float x : {127.4f, 127.6f, 127.99f}) {
    const double rel = double(exp2_fma(x)) / std::exp2(double(x)) - 1.0;
    EXPECT_LT(std::fabs(rel), 7.6e-5) << "x = " << x;
  }
}

// Halfway between two integers x rounds to the even one, and f is -1/2 or 1/2: both ends of the
// fit give the same 2^x within the bound.
TEST(Exp2Fma, HalvesRoundEitherWay) {
  for (int n = -124; n <= 126; ++n) {
    const float x = float(n) + 0.5f;
    const double rel = double(exp2_fma(x)) / std::exp2(double(x)) - 1.0;
    EXPECT_LT(std::fabs(rel), 7.6e-5) << "x = " << x;
  }
}

}  // namespace
}  // namespace fa
