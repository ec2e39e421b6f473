// How far the softmax's two exponentials land from 2^x: MUFU.EX2 (fast_exp2, the one every kernel
// uses) and chapter 06's exp2_fma (the cubic on the FMA pipe that variant 8 can send a share of its
// exponentials to), each computed on the GPU, against 2^x in fp64 rounded to float. A histogram of
// the distance in float ulps over the softmax's range, and how often the bf16 P that the P V
// product takes differs from exact 2^x in bf16.
//
//   build/bin/fa_exp2_accuracy [--csv FILE]
//
// The sample: every 97th float of [-125, 8] (about 23 million; every binade gets its share) and
// 2^22 + 1 values spread evenly over [-16, 0], where a row's weights that count lie. Without a
// GPU it reports exp2_fma computed on the host (the same bits: float adds, FMAs, a max and integer
// operations) and says that MUFU needs the GPU.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "../chapters/06_flash_attention_v3/exp2_fma.cuh"
#include "cuda_check.h"
#include "device_utils.cuh"
#include "dtype.h"

namespace fa {
namespace {

__global__ void exponentials_kernel(const float* x, float* mufu, float* fma, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  mufu[i] = fast_exp2(x[i]);
  fma[i] = flash3::exp2_fma(x[i]);
}

/// The sample: one range of floats by bit pattern, one spread evenly.
std::vector<float> sample(const std::string& range) {
  std::vector<float> xs;
  if (range == "[-125, 8]") {
    const uint32_t negative_end = uint32_t(flash3::float_bits(-125.0f));
    for (uint32_t b = 0x80000000u; b <= negative_end; b += 97) xs.push_back(flash3::bits_float(int32_t(b)));
    for (uint32_t b = 0; flash3::bits_float(int32_t(b)) <= 8.0f; b += 97) xs.push_back(flash3::bits_float(int32_t(b)));
  } else {
    const int n = 1 << 22;
    for (int i = 0; i <= n; ++i) xs.push_back(-16.0f * float(i) / float(n));
  }
  return xs;
}

// MUFU.EX2 is a few ulps off; a cubic with a relative error of 7.5e-5 is up to ~630 ulps off
// in a binade [1, 2) and ~1260 in [1/2, 1), where the float spacing is half: the buckets span both.
constexpr int kBuckets = 10;
const char* const kBucketNames[kBuckets] = {"0",     "1",      "2",        "3-4",       "5-16",
                                            "17-64", "65-256", "257-1024", "1025-2048", ">2048"};
constexpr int64_t kBucketTops[kBuckets - 1] = {0, 1, 2, 4, 16, 64, 256, 1024, 2048};

int bucket_of(int64_t ulps) {
  int b = 0;
  while (b < kBuckets - 1 && ulps > kBucketTops[b]) ++b;
  return b;
}

struct Tally {
  int64_t buckets[kBuckets] = {};
  int64_t bf16_differs = 0, n = 0;
  void add(float got, double exact) {
    const float want = float(exact);  // 2^x is positive: the bit patterns count ulps
    const int64_t ulps = std::llabs(int64_t(flash3::float_bits(got)) - int64_t(flash3::float_bits(want)));
    ++buckets[bucket_of(ulps)];
    if (round_to_dtype(got, DType::BF16) != round_to_dtype(want, DType::BF16)) ++bf16_differs;
    ++n;
  }
};

void report(std::ofstream& csv, const std::string& method, const std::string& range, const Tally& t) {
  std::printf("%-9s on %-9s (%lld x): float ulps from exact 2^x:", method.c_str(), range.c_str(),
              static_cast<long long>(t.n));
  for (int b = 0; b < kBuckets; ++b)
    std::printf("  %s: %.4f%%", kBucketNames[b], 100.0 * double(t.buckets[b]) / double(t.n));
  std::printf("; bf16 P differs for %.3f%%\n", 100.0 * double(t.bf16_differs) / double(t.n));
  if (!csv.is_open()) return;
  for (int b = 0; b < kBuckets; ++b)
    csv << method << ',' << range << ",\"" << kBucketNames[b] << "\"," << t.buckets[b] << ','
        << double(t.buckets[b]) / double(t.n) << ',' << double(t.bf16_differs) / double(t.n) << '\n';
}

int run(const std::string& csv_path) {
  const GpuInfo& gpu = detect_gpu();
  std::ofstream csv;
  if (!csv_path.empty()) {
    csv.open(csv_path);
    if (!csv) {
      std::fprintf(stderr, "fa_exp2_accuracy: error: cannot write '%s'\n", csv_path.c_str());
      return 1;
    }
    csv << "# " << (gpu.available ? describe_gpu(gpu) : std::string("no GPU (exp2_fma on the host)"))
        << ": build/bin/fa_exp2_accuracy --csv " << csv_path << "\n";
    csv << "method,range,ulps,count,share,bf16_differs_share\n";
  }
  if (!gpu.available)
    std::printf("fa_exp2_accuracy: no GPU (%s): exp2_fma on the host; MUFU.EX2 needs the GPU\n", gpu.reason.c_str());
  int64_t host_device_differ = 0;
  for (const std::string range : {"[-125, 8]", "[-16, 0]"}) {
    const std::vector<float> xs = sample(range);
    const int64_t n = int64_t(xs.size());
    std::vector<float> mufu(xs.size()), fma(xs.size());
    if (gpu.available) {
      float *d_x, *d_mufu, *d_fma;
      CUDA_CHECK(cudaMalloc(&d_x, n * sizeof(float)));
      CUDA_CHECK(cudaMalloc(&d_mufu, n * sizeof(float)));
      CUDA_CHECK(cudaMalloc(&d_fma, n * sizeof(float)));
      CUDA_CHECK(cudaMemcpy(d_x, xs.data(), n * sizeof(float), cudaMemcpyHostToDevice));
      exponentials_kernel<<<unsigned((n + 255) / 256), 256>>>(d_x, d_mufu, d_fma, n);
      CUDA_CHECK_LAUNCH();
      CUDA_CHECK(cudaMemcpy(mufu.data(), d_mufu, n * sizeof(float), cudaMemcpyDeviceToHost));
      CUDA_CHECK(cudaMemcpy(fma.data(), d_fma, n * sizeof(float), cudaMemcpyDeviceToHost));
      CUDA_CHECK(cudaFree(d_x));
      CUDA_CHECK(cudaFree(d_mufu));
      CUDA_CHECK(cudaFree(d_fma));
    }
    Tally t_mufu, t_fma;
    for (int64_t i = 0; i < n; ++i) {
      const double exact = std::exp2(double(xs[i]));
      const float host = flash3::exp2_fma(xs[i]);
      if (gpu.available) {
        t_mufu.add(mufu[i], exact);
        host_device_differ += flash3::float_bits(host) != flash3::float_bits(fma[i]);
        t_fma.add(fma[i], exact);
      } else {
        t_fma.add(host, exact);
      }
    }
    if (gpu.available) report(csv, "mufu", range, t_mufu);
    report(csv, "exp2_fma", range, t_fma);
  }
  if (gpu.available)
    std::printf("exp2_fma on the GPU and on the host: %lld values differ\n",
                static_cast<long long>(host_device_differ));
  return host_device_differ == 0 ? 0 : 1;
}

}  // namespace
}  // namespace fa

int main(int argc, char** argv) {
  std::string csv;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--csv") {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "fa_exp2_accuracy: error: --csv expects a file name\n");
        return 2;
      }
      csv = argv[++i];
    } else {
      std::fprintf(stderr, "fa_exp2_accuracy: error: unknown argument '%s'; allowed: --csv FILE\n", arg.c_str());
      return 2;
    }
  }
  return fa::run(csv);
}
