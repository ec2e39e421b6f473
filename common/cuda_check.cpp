#include "cuda_check.h"

#include <sstream>

namespace fa {

void throw_cuda_error(cudaError_t status, const char* what, const char* file, int line) {
  std::ostringstream msg;
  msg << "CUDA error " << cudaGetErrorName(status) << " (" << cudaGetErrorString(status) << ") in " << what << " at "
      << file << ":" << line;
  throw CudaError(msg.str());
}

namespace {

GpuInfo probe_gpu() {
  GpuInfo info;
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    // cudaErrorInsufficientDriver ("driver insufficient") is what a machine with the toolkit
    // but no GPU driver reports; cudaErrorNoDevice what a machine with a driver but no GPU does.
    info.reason = std::string(cudaGetErrorString(status)) + " (" + cudaGetErrorName(status) + ")";
    cudaGetLastError();  // clear the sticky error so later queries start clean
    return info;
  }
  if (count == 0) {
    info.reason = "no CUDA device found";
    return info;
  }
  cudaDeviceProp prop{};
  status = cudaGetDeviceProperties(&prop, 0);
  if (status != cudaSuccess) {
    info.reason = std::string("cannot query device 0: ") + cudaGetErrorString(status);
    cudaGetLastError();
    return info;
  }
  info.available = true;
  info.name = prop.name;
  info.sm_major = prop.major;
  info.sm_minor = prop.minor;
  info.multiprocessors = prop.multiProcessorCount;
  info.memory_bytes = prop.totalGlobalMem;
  info.shared_memory_per_block_optin = prop.sharedMemPerBlockOptin;
  cudaDriverGetVersion(&info.driver_version);
  cudaRuntimeGetVersion(&info.runtime_version);
  return info;
}

}  // namespace

const GpuInfo& detect_gpu() {
  static const GpuInfo info = probe_gpu();
  return info;
}

std::string describe_gpu(const GpuInfo& gpu) {
  if (!gpu.available) return "no GPU: " + gpu.reason;
  std::ostringstream s;
  s << gpu.name << " (sm_" << gpu.sm_major << gpu.sm_minor << ", " << gpu.multiprocessors << " SMs, "
    << (gpu.memory_bytes >> 30) << " GiB, driver " << gpu.driver_version / 1000 << "."
    << (gpu.driver_version % 1000) / 10 << ", runtime " << gpu.runtime_version / 1000 << "."
    << (gpu.runtime_version % 1000) / 10 << ")";
  return s.str();
}

}  // namespace fa
