// Host inputs, RAII device buffers, random and poison fills.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "cuda_check.h"
#include "dtype.h"
#include "problem.h"

namespace fa {

/// Q, K, V as floats in [batch, heads, seq, head_dim] order.
struct HostInputs {
  std::vector<float> q, k, v;
};

/// Fresh standard-normal inputs for `shape`, reproducible from `seed`, generated in parallel.
/// Never zeros: zeros hide unwritten outputs and wrong indexing.
HostInputs make_random_inputs(const AttentionShape& shape, uint64_t seed);
/// Fills `out` with standard-normal values of stream `stream` under `seed` (in parallel).
void fill_random_normal(std::vector<float>& out, uint64_t seed, uint64_t stream);
/// Every value rounded to `dtype` in place (in parallel).
void round_all(std::vector<float>& values, DType dtype);
/// Each input rounded to `dtype` (so the oracle sees exactly what the kernel sees).
HostInputs round_inputs(const HostInputs& inputs, DType dtype);
/// dtype.h's encode_elements and decode_elements, split over threads (parallel.h).
void encode_in_parallel(DType dtype, const float* src, void* dst, std::size_t n);
void decode_in_parallel(DType dtype, const void* src, float* dst, std::size_t n);
/// How many of the elements begin..end-1 are still poison (dtype.h's is_poison), in parallel.
std::size_t count_poison(DType dtype, const void* base, std::size_t begin, std::size_t end);

/// Owns one cudaMalloc'ed allocation. Move-only; frees in the destructor. All of them together
/// keep a count of the bytes they hold and of the most they held since reset_peak(): a run's
/// peak device memory (RunResult::device_mib), as PyTorch's max_memory_allocated counts its own.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes_ > 0) {
      CUDA_CHECK(cudaMalloc(&ptr_, bytes_));
      count(bytes_);
    }
  }
  ~DeviceBuffer() {
    if (ptr_) {
      cudaFree(ptr_);
      live_.fetch_sub(bytes_);
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(ptr_, other.ptr_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }

  void* get() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  std::size_t bytes() const { return bytes_; }

  /// Bytes held by all DeviceBuffers now, and the most they held since the last reset_peak().
  static std::size_t live_bytes() { return live_.load(); }
  static std::size_t peak_bytes() { return peak_.load(); }
  /// Starts a new peak from what is held now.
  static void reset_peak() { peak_.store(live_.load()); }

  /// Sets every byte to kPoisonByte, so unwritten outputs can be counted afterwards.
  void poison() {
    if (bytes_ > 0) CUDA_CHECK(cudaMemset(ptr_, kPoisonByte, bytes_));
  }
  void upload(const void* src, std::size_t bytes) { CUDA_CHECK(cudaMemcpy(ptr_, src, bytes, cudaMemcpyHostToDevice)); }
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> out(bytes_);
    if (bytes_ > 0) CUDA_CHECK(cudaMemcpy(out.data(), ptr_, bytes_, cudaMemcpyDeviceToHost));
    return out;
  }

 private:
  static void count(std::size_t bytes) {
    const std::size_t now = live_.fetch_add(bytes) + bytes;
    std::size_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
  }
  static inline std::atomic<std::size_t> live_{0}, peak_{0};
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

/// Floats stored on the device as `dtype` elements.
DeviceBuffer upload_as(DType dtype, const std::vector<float>& values);

}  // namespace fa
