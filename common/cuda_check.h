// Checks for every CUDA call and launch, and GPU detection that treats "no driver" as "no GPU".
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace fa {

/// Thrown for any failed CUDA call; the message names the call, the file and the line.
struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* what, const char* file, int line);

}  // namespace fa

#define CUDA_CHECK(call)                                             \
  do {                                                               \
    cudaError_t fa_status_ = (call);                                 \
    if (fa_status_ != cudaSuccess) {                                 \
      ::fa::throw_cuda_error(fa_status_, #call, __FILE__, __LINE__); \
    }                                                                \
  } while (0)

/// After a <<<...>>> launch: catches bad launch configurations at once. Errors inside the
/// kernel surface at the next synchronizing call, which is itself checked.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

namespace fa {

struct GpuInfo {
  bool available = false;
  /// Why not, when !available (e.g. "CUDA driver is insufficient or missing").
  std::string reason;
  std::string name;
  int sm_major = 0;
  int sm_minor = 0;
  int multiprocessors = 0;
  std::size_t memory_bytes = 0;
  std::size_t shared_memory_per_block_optin = 0;
  int driver_version = 0;
  int runtime_version = 0;
};

/// Looks for device 0. Never throws: no driver, no device or a broken driver all mean
/// "no GPU" with the reason filled in. The result is computed once and cached.
const GpuInfo& detect_gpu();

/// "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, driver 13.0)" or "no GPU: <reason>".
std::string describe_gpu(const GpuInfo& gpu);

}  // namespace fa
