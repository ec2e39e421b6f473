// Counter-based random numbers: element i of stream s under seed is a pure function of
// (seed, s, i), so inputs can be generated in parallel, in any order, and reproduced exactly.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define FA_RANDOM_HD __host__ __device__
#else
#define FA_RANDOM_HD
#endif

namespace fa {

/// SplitMix64's finalizer: a good 64-bit mix; callable from kernels too.
FA_RANDOM_HD inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// A standard normal sample (Box-Muller on two 24-bit uniforms in (0, 1)).
inline float random_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  uint64_t r = splitmix64(splitmix64(seed ^ (stream * 0xD1B54A32D192ED03ull)) + index);
  float u1 = (float(r >> 40) + 0.5f) * (1.0f / 16777216.0f);
  float u2 = (float(r & 0xFFFFFFu) + 0.5f) * (1.0f / 16777216.0f);
  return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.28318530717958647f * u2);
}

}  // namespace fa
