// FP8 on the host: the e4m3 format, block quantization, and the Hadamard rotation behind
// FlashAttention-3's "incoherent processing". Plain C++ so the FP8 accuracy story is checked in
// CI without a GPU (tests/cpu/test_fp8.cpp); chapter 06's kernels consume what these produce.
//
// e4m3 here is the OCP "E4M3FN" format Hopper's tensor cores take (`__nv_fp8_e4m3`):
// 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits, no infinities. The largest finite value
// is 448 = 1.75 * 2^8; S.1111.111 is NaN; the smallest subnormal is 2^-9. 256 codes, 254 of
// them numbers (two of them zeros).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fa {

constexpr float kE4m3Max = 448.0f;

/// Rounds to the nearest e4m3 value (ties to even), saturating at +-448 like the hardware's
/// `cvt.rn.satfinite.e4m3x2.f32`; infinities saturate too, NaN becomes 0x7F.
uint8_t float_to_e4m3(float value);
/// The exact value of an e4m3 code (NaN for 0x7F and 0xFF).
float e4m3_to_float(uint8_t code);
/// value rounded to e4m3 and back.
inline float round_to_e4m3(float value) { return e4m3_to_float(float_to_e4m3(value)); }

/// A [rows, cols] matrix in e4m3 with one float scale per block of `block_rows` consecutive rows
/// (the last block may be shorter): element (r, c) = e4m3_to_float(codes[r * cols + c]) * scales[r / block_rows].
struct Fp8Blocks {
  int rows = 0, cols = 0, block_rows = 0;
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  float at(int r, int c) const { return e4m3_to_float(codes[std::size_t(r) * cols + c]) * scales[r / block_rows]; }
};

/// Block quantization: each block's scale is its largest |value| / 448, so the block's largest
/// element lands on the top of the e4m3 range and nothing saturates. block_rows = rows gives one
/// scale for the whole matrix (per-tensor scaling, the "baseline FP8" of the FlashAttention-3
/// paper). A block of zeros gets scale 1. Throws std::invalid_argument on block_rows < 1.
Fp8Blocks quantize_e4m3(const float* x, int rows, int cols, int block_rows);

/// Fast Walsh-Hadamard transform of one row of length n (a power of two), in place, scaled by
/// 1/sqrt(n) so that it is orthogonal: the row's length is unchanged.
void hadamard_row(float* row, int n);

/// Incoherent processing: x <- x * diag(signs) * H / sqrt(n) for every row of a [rows, n]
/// matrix. With the same signs applied to Q and K, (Q M)(K M)^T = Q K^T because M is orthogonal,
/// while an outlier in one column of a row is spread over all n columns. Throws
/// std::invalid_argument unless n is a power of two and signs has n entries of +1 or -1.
void rotate_rows(float* x, int rows, int n, const std::vector<float>& signs);

/// n random signs (+1 or -1) from a seed.
std::vector<float> random_signs(int n, uint64_t seed);

}  // namespace fa
