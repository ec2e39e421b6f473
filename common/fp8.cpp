// e4m3 conversion, block quantization and the Hadamard rotation; see fp8.h.
#include "fp8.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "random.h"

namespace fa {

uint8_t float_to_e4m3(float value) {
  if (std::isnan(value)) return 0x7F;
  const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  const double a = std::fabs(double(value));
  if (a >= kE4m3Max) return sign | 0x7E;  // saturate (0x7E = 1.110 * 2^8 = 448)
  // Below 2^-6 the spacing is 2^-9 (subnormals); the code of m * 2^-9 is m itself, and m = 8
  // is exactly the smallest normal's code, so rounding up into the normals needs no special case.
  if (a < 0.015625) return sign | uint8_t(std::nearbyint(a * 512.0));  // nearbyint: ties to even
  int e = 0;
  const double f = std::frexp(a, &e);                // a = f * 2^e, f in [0.5, 1)
  double m = std::nearbyint((2.0 * f - 1.0) * 8.0);  // 3 mantissa bits of 1.xxx, ties to even
  int exponent = e - 1;
  if (m == 8.0) {  // rounded up to the next power of two
    m = 0.0;
    ++exponent;
  }
  // a < 448 and the rounding above can reach at most 448 itself: the code stays below NaN.
  return sign | uint8_t(((exponent + 7) << 3) | int(m));
}

float e4m3_to_float(uint8_t code) {
  const bool negative = code & 0x80;
  const int exponent = (code >> 3) & 0xF, mantissa = code & 0x7;
  if (exponent == 0xF && mantissa == 0x7) return std::nanf("");
  const double magnitude =
      exponent == 0 ? std::ldexp(double(mantissa), -9) : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
  return float(negative ? -magnitude : magnitude);
}

Fp8Blocks quantize_e4m3(const float* x, int rows, int cols, int block_rows) {
  if (block_rows < 1)
    throw std::invalid_argument("quantize_e4m3: block_rows must be at least 1, got " + std::to_string(block_rows));
  Fp8Blocks q;
  q.rows = rows;
  q.cols = cols;
  q.block_rows = block_rows;
  q.codes.resize(std::size_t(rows) * cols);
  for (int r0 = 0; r0 < rows; r0 += block_rows) {
    const int r1 = std::min(rows, r0 + block_rows);
    float amax = 0.0f;
    for (std::size_t i = std::size_t(r0) * cols; i < std::size_t(r1) * cols; ++i)
      amax = std::max(amax, std::fabs(x[i]));
    const float scale = amax > 0.0f ? amax / kE4m3Max : 1.0f;
    q.scales.push_back(scale);
    for (std::size_t i = std::size_t(r0) * cols; i < std::size_t(r1) * cols; ++i)
      q.codes[i] = float_to_e4m3(x[i] / scale);
  }
  return q;
}

void hadamard_row(float* row, int n) {
  // Butterflies: log2(n) stages of (a, b) -> (a + b, a - b); the product is the Sylvester
  // Hadamard matrix, and 1/sqrt(n) makes it orthogonal.
  for (int half = 1; half < n; half *= 2)
    for (int i = 0; i < n; i += 2 * half)
      for (int j = i; j < i + half; ++j) {
        const float a = row[j], b = row[j + half];
        row[j] = a + b;
        row[j + half] = a - b;
      }
  const float norm = 1.0f / std::sqrt(float(n));
  for (int i = 0; i < n; ++i) row[i] *= norm;
}

void rotate_rows(float* x, int rows, int n, const std::vector<float>& signs) {
  if (n < 1 || (n & (n - 1)) != 0)
    throw std::invalid_argument("rotate_rows: n must be a power of two, got " + std::to_string(n));
  if (int(signs.size()) != n)
    throw std::invalid_argument("rotate_rows: expected " + std::to_string(n) + " signs, got " +
                                std::to_string(signs.size()));
  for (float s : signs)
    if (s != 1.0f && s != -1.0f)
      throw std::invalid_argument("rotate_rows: signs must be +1 or -1, got " + std::to_string(s));
  for (int r = 0; r < rows; ++r) {
    float* row = x + std::size_t(r) * n;
    for (int i = 0; i < n; ++i) row[i] *= signs[i];
    hadamard_row(row, n);
  }
}

std::vector<float> random_signs(int n, uint64_t seed) {
  std::vector<float> signs(n);
  for (int i = 0; i < n; ++i) signs[i] = (splitmix64(seed + uint64_t(i)) >> 63) ? -1.0f : 1.0f;
  return signs;
}

}  // namespace fa
