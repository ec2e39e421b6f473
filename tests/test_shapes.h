// Helpers the test files share.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "cuda_check.h"
#include "problem.h"
#include "random.h"
#include "registry.h"
#include "runner.h"

namespace fa {

inline AttentionShape shape_of(int batch, int heads_q, int heads_kv, int seq_q, int seq_kv, int dim, bool causal) {
  AttentionShape s;
  s.batch = batch;
  s.heads_q = heads_q;
  s.heads_kv = heads_kv;
  s.seq_q = seq_q;
  s.seq_kv = seq_kv;
  s.head_dim = dim;
  s.causal = causal;
  return s;
}

/// In a GPU test: without a GPU, report the test as skipped with the reason.
#define SKIP_WITHOUT_GPU()                                        \
  do {                                                            \
    const ::fa::GpuInfo& gpu = ::fa::detect_gpu();                \
    if (!gpu.available) GTEST_SKIP() << "no GPU: " << gpu.reason; \
  } while (0)

/// Every registered forward kernel, as the parameter list of a per-kernel test.
inline std::vector<const ForwardKernel*> forward_kernel_pointers() {
  std::vector<const ForwardKernel*> out;
  for (const ForwardKernel& k : forward_kernels()) out.push_back(&k);
  return out;
}

/// O and then LSE, as bytes, from one launch of `kernel` on the problem's inputs (outputs poisoned
/// first): what run-to-run determinism tests compare.
inline std::vector<unsigned char> output_bytes(const ForwardKernel& kernel, Problem& problem) {
  ForwardLaunch launch = prepare_forward(kernel, problem);
  kernel.launch(launch.params);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<unsigned char> bytes = launch.o.download();
  const std::vector<unsigned char> lse_bytes = launch.lse.download();
  bytes.insert(bytes.end(), lse_bytes.begin(), lse_bytes.end());
  return bytes;
}

/// A fresh seed per test: inputs differ from run to run. Tests print it on failure.
inline uint64_t fresh_seed() { return std::random_device{}(); }

/// The FlashAttention-3 paper's FP8 experiment inputs: entries N(0, 1), plus N(0, 10^2) on 0.1%
/// of them (which ones depends on seed and stream).
inline std::vector<float> with_outliers(int64_t n, uint64_t seed, int stream) {
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) {
    const bool outlier = (splitmix64(seed * 31 + uint64_t(stream) * 1000003 + uint64_t(i)) % 1000) == 0;
    x[i] = random_normal(seed, stream, uint64_t(i)) +
           (outlier ? 10.0f * random_normal(seed, stream + 10, uint64_t(i)) : 0.0f);
  }
  return x;
}

}  // namespace fa
