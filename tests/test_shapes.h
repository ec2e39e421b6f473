// Helpers the test files share.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda_check.h"
#include "problem.h"
#include "random.h"
#include "registry.h"
#include "runner.h"
#include "tensor.h"

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

/// A problem of chapter 09's list: the shape every chapter solves and the features beside it.
struct FeatureProblem {
  AttentionShape shape;
  AttentionFeatures features;
  std::string to_string() const { return describe(shape, features); }
  std::string to_identifier() const { return shape.to_identifier() + features.to_identifier(); }
};

/// `s` with chapter 09's features: window (left, right), softcap, ALiBi, bias, packed batch.
struct FeatureSet {
  int window_left = -1, window_right = -1;
  double softcap = 0.0;
  bool alibi = false, bias = false, varlen = false;
  double logit_scale = 1.0;  // multiplies 1/sqrt(head_dim), for large logits
};
/// A packed batch (varlen) lays the shape's `batch` sequences end to end in a batch of one.
inline FeatureProblem with_features(AttentionShape s, const FeatureSet& f) {
  AttentionFeatures features;
  features.window_left = f.window_left;
  features.window_right = f.window_right;
  features.softcap = f.softcap;
  features.alibi = f.alibi;
  features.bias = f.bias;
  if (f.varlen) {
    features.sequences = s.batch;
    s.batch = 1;
  }
  if (f.logit_scale != 1.0) s.scale = f.logit_scale / std::sqrt(double(s.head_dim));
  return {s, features};
}

/// Chapter 09's shape list: each feature alone and in combination, windows that leave a row no
/// key or cross many tiles, softcap on logits of about +-100, ALiBi with a head count that is
/// not a power of two, packed batches with an empty and a length-1 sequence (random_packing),
/// softcaps low enough against the logits that ignoring one fails (FeatureShape tests that),
/// GQA and MQA. The CPU algorithms and every kernel that takes features run on all of them.
inline std::vector<FeatureProblem> feature_shapes() {
  FeatureSet sliding{37, 0}, left_only{100, -1}, both_sides{16, 16}, local{128, 0}, narrow{10, 5};
  FeatureSet capped{-1, -1, 20.0, false, false, false, 10.0}, alibi{-1, -1, 0.0, true};
  FeatureSet biased{-1, -1, 0.0, false, true}, packed{-1, -1, 0.0, false, false, true};
  FeatureSet packed_all{16, 0, 10.0, true, false, true, 8.0}, dense_all{64, 32, 5.0, true, true, false, 4.0};
  FeatureSet shifted_all{48, 16, 0.0, true, true};
  return {
      with_features(shape_of(2, 4, 2, 300, 300, 64, false), sliding),
      with_features(shape_of(1, 2, 2, 257, 513, 128, true), left_only),
      with_features(shape_of(1, 4, 1, 200, 200, 64, false), both_sides),
      with_features(shape_of(1, 2, 2, 1000, 1000, 64, true), local),
      with_features(shape_of(2, 2, 2, 130, 70, 128, false), narrow),
      with_features(shape_of(1, 2, 2, 200, 200, 64, true), capped),
      with_features(shape_of(1, 2, 2, 200, 200, 128, false), capped),
      with_features(shape_of(2, 8, 2, 300, 300, 64, true), alibi),
      with_features(shape_of(1, 12, 4, 130, 170, 128, false), alibi),
      with_features(shape_of(2, 2, 1, 129, 257, 64, false), biased),
      with_features(shape_of(1, 2, 2, 190, 190, 128, true), biased),
      // seq_kv a multiple of 4: chapter 09's Hopper kernel stages the bias in shared memory.
      with_features(shape_of(1, 4, 2, 200, 256, 128, true), biased),
      // ... with ALiBi and a window, two batches, and a last key block past seq_kv (TMA's zeros).
      with_features(shape_of(2, 4, 2, 130, 260, 128, false), shifted_all),
      with_features(shape_of(2, 2, 2, 300, 300, 64, false), biased),
      with_features(shape_of(6, 4, 2, 700, 900, 64, true), packed),
      with_features(shape_of(3, 2, 2, 5, 7, 128, false), packed),
      with_features(shape_of(5, 4, 2, 600, 600, 128, true), packed_all),
      with_features(shape_of(1, 4, 2, 333, 333, 64, false), dense_all),
  };
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

/// Relative Frobenius error of float results against the oracle's (absolute when the oracle's are
/// all zero).
inline double rel_error(const std::vector<float>& got, const std::vector<double>& want) {
  double err = 0, norm = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    err += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return norm > 0 ? std::sqrt(err / norm) : std::sqrt(err);
}

/// Relative Frobenius error of a kernel's gradient (raw `dtype` elements) against the oracle's;
/// infinite when an element is not finite (a poisoned one left unwritten, say).
inline double gradient_error(DType dtype, const std::vector<unsigned char>& raw, const std::vector<double>& want) {
  std::vector<float> got(want.size());
  decode_in_parallel(dtype, raw.data(), got.data(), got.size());
  double err = 0, norm = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double diff = double(got[i]) - want[i];
    err += diff * diff;
    norm += want[i] * want[i];
  }
  return std::isfinite(err) ? std::sqrt(err / std::max(norm, 1e-30)) : std::numeric_limits<double>::infinity();
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
