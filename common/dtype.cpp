#include "dtype.h"

#include <cmath>
#include <cstring>
#include <stdexcept>

namespace fa {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "fp32";
    case DType::F16: return "fp16";
    case DType::BF16: return "bf16";
  }
  return "?";
}

std::size_t dtype_size(DType dtype) { return dtype == DType::F32 ? 4 : 2; }

DType parse_dtype(const std::string& text) {
  if (text == "fp32" || text == "f32" || text == "float") return DType::F32;
  if (text == "fp16" || text == "f16" || text == "half") return DType::F16;
  if (text == "bf16") return DType::BF16;
  throw std::invalid_argument("unknown dtype '" + text + "'; allowed: fp32, fp16, bf16");
}

namespace {

uint32_t float_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

float bits_float(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// Drops the low `shift` bits of `mantissa`, rounding to nearest with ties to even.
uint32_t shift_round_even(uint32_t mantissa, int shift) {
  uint32_t kept = mantissa >> shift;
  uint32_t dropped = mantissa & ((1u << shift) - 1);
  uint32_t half = 1u << (shift - 1);
  if (dropped > half || (dropped == half && (kept & 1u))) ++kept;
  return kept;
}

}  // namespace

uint16_t float_to_half_bits(float value) {
  uint32_t x = float_bits(value);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mantissa = x & 0x7FFFFFu;
  int exponent = int((x >> 23) & 0xFFu);
  if (exponent == 0xFF) {  // inf stays inf; NaN stays a quiet NaN
    return uint16_t(sign | 0x7C00u | (mantissa ? 0x200u | (mantissa >> 13) : 0u));
  }
  int half_exponent = exponent - 127 + 15;
  if (half_exponent >= 0x1F) return uint16_t(sign | 0x7C00u);  // too large: inf
  if (half_exponent <= 0) {
    // Subnormal half: value = m * 2^-24. A carry out of the 10 bits lands in the exponent
    // field, which is exactly the smallest normal -- the bit layout makes that correct.
    if (half_exponent < -10) return uint16_t(sign);
    return uint16_t(sign | shift_round_even(mantissa | 0x800000u, 14 - half_exponent));
  }
  // Normal half; a rounding carry may ripple into the exponent, up to inf, which is right.
  return uint16_t(sign | ((uint32_t(half_exponent) << 10) + shift_round_even(mantissa, 13)));
}

float half_bits_to_float(uint16_t bits) {
  uint32_t sign = uint32_t(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1Fu;
  uint32_t mantissa = bits & 0x3FFu;
  if (exponent == 0) {
    float magnitude = std::ldexp(float(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1F) return bits_float(sign | 0x7F800000u | (mantissa << 13));
  return bits_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

uint16_t float_to_bf16_bits(float value) {
  uint32_t x = float_bits(value);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((x >> 16) | 0x40u);  // quiet NaN
  uint32_t rounding = 0x7FFFu + ((x >> 16) & 1u);
  return uint16_t((x + rounding) >> 16);
}

float bf16_bits_to_float(uint16_t bits) { return bits_float(uint32_t(bits) << 16); }

float round_to_dtype(float value, DType dtype) {
  switch (dtype) {
    case DType::F32: return value;
    case DType::F16: return half_bits_to_float(float_to_half_bits(value));
    case DType::BF16: return bf16_bits_to_float(float_to_bf16_bits(value));
  }
  return value;
}

void encode_elements(DType dtype, const float* src, void* dst, std::size_t n) {
  if (dtype == DType::F32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  auto* out = static_cast<uint16_t*>(dst);
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = dtype == DType::F16 ? float_to_half_bits(src[i]) : float_to_bf16_bits(src[i]);
  }
}

void decode_elements(DType dtype, const void* src, float* dst, std::size_t n) {
  if (dtype == DType::F32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  const auto* in = static_cast<const uint16_t*>(src);
  for (std::size_t i = 0; i < n; ++i) {
    dst[i] = dtype == DType::F16 ? half_bits_to_float(in[i]) : bf16_bits_to_float(in[i]);
  }
}

bool is_poison(DType dtype, const void* base, std::size_t index) {
  const auto* bytes = static_cast<const unsigned char*>(base) + index * dtype_size(dtype);
  for (std::size_t b = 0; b < dtype_size(dtype); ++b) {
    if (bytes[b] != kPoisonByte) return false;
  }
  return true;
}

}  // namespace fa
