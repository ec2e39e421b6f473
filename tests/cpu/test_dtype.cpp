#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "dtype.h"
#include "parallel.h"
#include "random.h"
#include "tensor.h"

namespace fa {
namespace {

TEST(DType, HalfRoundTripsEveryBitPattern) {
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    float value = half_bits_to_float(uint16_t(bits));
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(half_bits_to_float(float_to_half_bits(value))));
      continue;
    }
    ASSERT_EQ(float_to_half_bits(value), bits) << "half bits 0x" << std::hex << bits;
  }
}

TEST(DType, HalfKnownValues) {
  EXPECT_EQ(float_to_half_bits(1.0f), 0x3C00);
  EXPECT_EQ(float_to_half_bits(-2.0f), 0xC000);
  EXPECT_EQ(float_to_half_bits(65504.0f), 0x7BFF);                      // largest finite
  EXPECT_EQ(float_to_half_bits(65520.0f), 0x7C00);                      // rounds up to inf
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.0f, -24)), 0x0001);         // smallest subnormal
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.0f, -25)), 0x0000);         // tie -> even (zero)
  EXPECT_EQ(float_to_half_bits(std::ldexp(3.0f, -25)), 0x0002);         // tie -> even (2)
  EXPECT_EQ(float_to_half_bits(1.0f + std::ldexp(1.0f, -11)), 0x3C00);  // tie -> even
  EXPECT_EQ(float_to_half_bits(1.0f + std::ldexp(3.0f, -11)), 0x3C02);  // tie -> even (up)
  EXPECT_EQ(float_to_half_bits(std::numeric_limits<float>::infinity()), 0x7C00);
}

TEST(DType, HalfRoundsToNearest) {
  // Every float between two adjacent halves rounds to the closer one.
  for (uint32_t bits = 0x3C00; bits < 0x3C40; ++bits) {
    float lo = half_bits_to_float(uint16_t(bits)), hi = half_bits_to_float(uint16_t(bits + 1));
    EXPECT_EQ(float_to_half_bits(lo + (hi - lo) * 0.3f), bits);
    EXPECT_EQ(float_to_half_bits(lo + (hi - lo) * 0.7f), bits + 1);
  }
}

TEST(DType, Bf16KnownValuesAndRounding) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3F80);
  EXPECT_EQ(bf16_bits_to_float(0x3F80), 1.0f);
  EXPECT_EQ(float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)), 0x3F80);      // tie -> even
  EXPECT_EQ(float_to_bf16_bits(1.0f + std::ldexp(3.0f, -8)), 0x3F82);      // tie -> even (up)
  EXPECT_EQ(float_to_bf16_bits(1.0f + std::ldexp(1.0f, -9) * 3), 0x3F81);  // above the tie
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(std::nanf("")))));
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    float value = bf16_bits_to_float(uint16_t(bits));
    if (!std::isnan(value)) {
      ASSERT_EQ(float_to_bf16_bits(value), bits);
    }
  }
}

TEST(DType, PoisonIsRecognisedAndNotProducedByArithmetic) {
  unsigned char buffer[8];
  std::memset(buffer, kPoisonByte, sizeof buffer);
  EXPECT_TRUE(is_poison(DType::F32, buffer, 0));
  EXPECT_TRUE(is_poison(DType::F16, buffer, 3));
  float nan = std::nanf("");
  float values[2] = {nan, 1.0f};
  EXPECT_FALSE(is_poison(DType::F32, values, 0));
  EXPECT_FALSE(is_poison(DType::F32, values, 1));
}

// The element-wise passes split over threads must give what one pass over every element gives,
// at sizes that use several threads (the split starts at 64k elements).
TEST(DType, ParallelPassesMatchElementByElement) {
  for (const std::size_t n : {std::size_t(5), std::size_t(70001), std::size_t(1) << 20}) {
    std::vector<std::atomic<int>> visits(n);
    parallel_for(n, [&](std::size_t begin, std::size_t end) {
      for (std::size_t i = begin; i < end; ++i) ++visits[i];
    });
    std::size_t once = 0;
    for (const auto& v : visits) once += v == 1;
    EXPECT_EQ(once, n) << "n = " << n << ": some index not visited exactly once";

    std::vector<float> x(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = 3.0f * random_normal(11, 0, i);
    for (const DType t : {DType::F16, DType::BF16}) {
      std::vector<unsigned char> raw(n * 2);
      encode_in_parallel(t, x.data(), raw.data(), n);
      std::vector<float> back(n);
      decode_in_parallel(t, raw.data(), back.data(), n);
      std::size_t same = 0;
      for (std::size_t i = 0; i < n; ++i) same += back[i] == round_to_dtype(x[i], t);
      EXPECT_EQ(same, n) << dtype_name(t) << ", n = " << n;

      // Poison every third element from a third of the way in; count a window that starts off a
      // thread boundary.
      for (std::size_t i = n / 3; i < n; i += 3) std::memset(&raw[i * 2], kPoisonByte, 2);
      const std::size_t begin = n / 4 + 1;
      std::size_t want = 0;
      for (std::size_t i = begin; i < n; ++i) want += is_poison(t, raw.data(), i);
      EXPECT_EQ(count_poison(t, raw.data(), begin, n), want) << dtype_name(t) << ", n = " << n;
    }
  }
  EXPECT_EQ(count_poison(DType::F32, nullptr, 7, 7), 0u);
}

TEST(DType, ParseNamesAndRejectsOthers) {
  EXPECT_EQ(parse_dtype("fp16"), DType::F16);
  EXPECT_EQ(parse_dtype("bf16"), DType::BF16);
  EXPECT_EQ(parse_dtype("fp32"), DType::F32);
  try {
    parse_dtype("int8");
    FAIL() << "int8 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "unknown dtype 'int8'; allowed: fp32, fp16, bf16");
  }
}

}  // namespace
}  // namespace fa
