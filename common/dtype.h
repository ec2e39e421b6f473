// Element types the kernels read and write, and exact host-side conversion to and from float.
//
// The conversions are written in plain C++ (round to nearest, ties to even, like the hardware's
// cvt.rn) so the CPU side -- the oracle, the algorithm.h files, the tests -- needs no GPU headers.
// Inputs are rounded to a kernel's dtype *before* the oracle sees them, so the error we report is
// the kernel's arithmetic, not the input rounding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace fa {

enum class DType { F32, F16, BF16 };

const char* dtype_name(DType dtype);
std::size_t dtype_size(DType dtype);
/// Parses "fp32" / "fp16" / "bf16"; throws std::invalid_argument otherwise.
DType parse_dtype(const std::string& text);

uint16_t float_to_half_bits(float value);
float half_bits_to_float(uint16_t bits);
uint16_t float_to_bf16_bits(float value);
float bf16_bits_to_float(uint16_t bits);

/// value rounded to the nearest number representable in dtype, returned as float.
float round_to_dtype(float value, DType dtype);

/// Writes n floats as dtype elements into dst (dst holds n * dtype_size(dtype) bytes).
void encode_elements(DType dtype, const float* src, void* dst, std::size_t n);
/// Reads n dtype elements from src into floats.
void decode_elements(DType dtype, const void* src, float* dst, std::size_t n);

/// Every output buffer is filled with 0xFF bytes before a kernel runs. All-ones is a NaN in
/// fp32, fp16 and bf16, and no arithmetic produces that exact pattern (the GPU's canonical NaN
/// is 0x7FFFFFFF / 0x7FFF), so an element still all-ones afterwards was never written.
constexpr unsigned char kPoisonByte = 0xFF;
bool is_poison(DType dtype, const void* base, std::size_t index);

}  // namespace fa
