// fa_bench -- every registered forward kernel over a named sweep, timed with CUDA events
// (common/timing.h: warm-up, then the median of repeats), a sampled check against the fp64
// oracle, and CSV out.
//
// The standard sweep is the FlashAttention papers': 16k tokens in total (batch = 16384 / seq),
// hidden size 2048 (heads = 2048 / head_dim), head_dim 64 and 128, seq 512 ... 16k, causal off
// and on; the memory sweep adds seq 128 and 256. Every forward, backward and decode point also
// reports its peak device memory (device_mib: inputs, outputs and workspace; in the backward also
// dO and the gradients, in the decode the paged K/V cache, its block tables and context lengths).
// --ceilings also measures what the GPU can do at all: a device-to-device copy (bytes read +
// written per second) and cuBLAS GEMMs (fp32 on the FMA units, bf16 on the tensor cores).
//
// Run: build/bin/fa_bench --sweep standard --csv build/bench/fa_bench.csv --ceilings build/bench/ceilings.csv
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "../chapters/07_backward/forward_for_backward.h"
#include "../chapters/08_paged_attention/decode_runner.h"
#include "backward_runner.h"
#include "cli.h"
#include "cuda_check.h"
#include "random.h"
#include "registry.h"
#include "report.h"
#include "runner.h"
#include "timing.h"

namespace fa {
namespace {

struct BenchOptions {
  std::string sweep = "standard";
  std::vector<std::string> kernel_filters;  // substrings of kernel names; empty = all
  std::vector<int> dims = {64, 128};        // head_dim values of the sweep to run
  std::string csv;
  std::string ceilings_csv;
  int iters = 20;
  int warmup = 2;
  double budget_ms = 1500;
  uint64_t seed = 1234;
  bool check = true;
  bool list = false;
  bool decode = false;
  bool backward = false;
  bool features = false;
  /// Evict the L2 before each timed launch. Off by default: the published figures are taken
  /// without it, and a flushed run is not comparable with them.
  bool flush_l2 = false;
  /// Skip a kernel's next point of a (head_dim, causal) series once its last point took over
  /// this much / 2 (the next doubles the sequence, so about doubles the time); 0 = never skip.
  double max_point_ms = 0;
  /// Backward: the fp64 oracle checks the first K/V head of batch 0 up to this sequence length;
  /// longer points are only checked to be written and finite (the oracle is O(seq^2) on the CPU).
  int backward_check_max_seq = 2048;
};

const char* kUsage =
    "usage: fa_bench [flags]\n"
    "  --sweep NAME      standard (16k tokens, hidden 2048, d 64/128, seq 512..16k, causal off/on), quick, or\n"
    "                    memory (the standard one from seq 128: the FlashAttention-1 paper's range)\n"
    "  --kernels A,B     only kernels whose name contains A or B (default: all registered)\n"
    "  --dims 64,128     the head_dim values of the sweep: 64, 96, 128, 256 (default: 64,128); heads = 2048 / d,\n"
    "                    rounded down (21 at 96)\n"
    "  --csv FILE        append one row per (kernel, shape) to FILE\n"
    "  --ceilings FILE   also measure copy bandwidth and cuBLAS GEMM rates, write them to FILE\n"
    "  --iters N         at most N timed repeats per point (default 20)\n"
    "  --warmup N        untimed launches first (default 2)\n"
    "  --budget-ms X     cut repeats to fit about X ms per point (default 1500; 0 = always --iters)\n"
    "  --max-point-ms X  skip a kernel's longer points of a series once one took over X/2 ms (default 0 = never)\n"
    "  --seed N          input seed (default 1234)\n"
    "  --no-check        skip the sampled oracle check\n"
    "  --flush-l2        overwrite a buffer twice the L2's size before each timed launch (not timed), so every\n"
    "                    launch starts with a cold L2 (default off, as the published figures were measured)\n"
    "  --decode          time the paged decode kernels (chapter 08) instead: K/V bandwidth and peak device\n"
    "                    memory at batch x context 64 x 16k, 8 x 8k, 1 x 32k and more, heads 32/8, head_dim 128\n"
    "                    (d 64 too with --dims)\n"
    "  --backward        time the backward kernels (chapter 07) over the sweep instead: TFLOP/s at 2.5x the\n"
    "                    forward's flops; the fp64 oracle checks seq <= 2048 (--check-max-seq), longer points\n"
    "                    are checked to be written and finite\n"
    "  --features        time chapter 09's kernels on its points instead: seq 4k/8k/16k causal with a window\n"
    "                    of 1024 or 4096 keys, softcap 50, ALiBi, a packed batch, and a bias at seq 4k; TFLOP/s\n"
    "                    count only the pairs the mask leaves (use --dims 128 for the FlexAttention table);\n"
    "                    with --backward, chapter 09's backward kernels on the same points (checked to be\n"
    "                    written and finite)\n"
    "  --check-max-seq N with --backward: the longest sequence checked against the oracle (default 2048)\n"
    "  --list            list the registered kernels and exit\n";

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, sep)) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

int parse_int(const std::string& flag, const std::string& text, int min_value) {
  char* end = nullptr;
  long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < min_value || v > 1000000) {
    throw std::invalid_argument(flag + " expects an integer >= " + std::to_string(min_value) + ", got '" + text + "'");
  }
  return int(v);
}

BenchOptions parse_bench(int argc, char** argv) {
  BenchOptions o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--sweep") {
      o.sweep = value();
      if (o.sweep != "standard" && o.sweep != "quick" && o.sweep != "memory") {
        throw std::invalid_argument("unknown sweep '" + o.sweep + "'; allowed: standard, quick, memory");
      }
    } else if (arg == "--kernels") {
      o.kernel_filters = split(value(), ',');
    } else if (arg == "--dims") {
      o.dims.clear();
      for (const std::string& d : split(value(), ',')) {
        int dim = parse_int(arg, d, 1);
        if (!head_dim_reason(dim, {64, 96, 128, 256}).empty())
          throw std::invalid_argument("--dims expects 64, 96, 128 and/or 256, got '" + d + "'");
        o.dims.push_back(dim);
      }
    } else if (arg == "--csv") {
      o.csv = value();
    } else if (arg == "--ceilings") {
      o.ceilings_csv = value();
    } else if (arg == "--iters") {
      o.iters = parse_int(arg, value(), 1);
    } else if (arg == "--warmup") {
      o.warmup = parse_int(arg, value(), 0);
    } else if (arg == "--budget-ms") {
      o.budget_ms = parse_int(arg, value(), 0);
    } else if (arg == "--seed") {
      o.seed = uint64_t(parse_int(arg, value(), 0));
    } else if (arg == "--no-check") {
      o.check = false;
    } else if (arg == "--flush-l2") {
      o.flush_l2 = true;
    } else if (arg == "--list") {
      o.list = true;
    } else if (arg == "--decode") {
      o.decode = true;
    } else if (arg == "--backward") {
      o.backward = true;
    } else if (arg == "--features") {
      o.features = true;
    } else if (arg == "--max-point-ms") {
      o.max_point_ms = parse_int(arg, value(), 0);
    } else if (arg == "--check-max-seq") {
      o.backward_check_max_seq = parse_int(arg, value(), 0);
    } else if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      std::exit(0);
    } else {
      throw std::invalid_argument("unknown argument '" + arg + "' (see --help)");
    }
  }
  if (o.decode && (o.backward || o.features))
    throw std::invalid_argument("--decode is a run of its own; --backward and --features go without it");
  return o;
}

/// The sweep of the FlashAttention papers: total tokens and hidden size fixed.
std::vector<AttentionShape> sweep_shapes(const std::string& name, const std::vector<int>& dims) {
  const bool quick = name == "quick";
  std::vector<int> seqs = quick ? std::vector<int>{512, 2048} : std::vector<int>{512, 1024, 2048, 4096, 8192, 16384};
  if (name == "memory") seqs.insert(seqs.begin(), {128, 256});  // the FlashAttention-1 paper's range starts at 128
  std::vector<AttentionShape> shapes;
  for (int dim : dims) {
    for (bool causal : {false, true}) {
      for (int seq : seqs) {
        AttentionShape s;
        s.batch = 16384 / seq;
        s.heads_q = s.heads_kv = 2048 / dim;
        s.seq_q = s.seq_kv = seq;
        s.head_dim = dim;
        s.causal = causal;
        shapes.push_back(s);
      }
    }
  }
  return shapes;
}

/// Chapter 09's points (--features): the standard sweep's 16k tokens and hidden size at seq 4k,
/// 8k and 16k, causal, with one feature each, as FlexAttention is benchmarked on them
/// (tools/bench_flex.py has the same list): the plain causal mask, sliding windows of 1024 and
/// 4096 keys, softcap 50, ALiBi, a packed batch of equal-length sequences, and (seq 4k only, not
/// causal) a float bias [batch, heads, seq, seq].
std::vector<std::pair<AttentionShape, AttentionFeatures>> feature_points(const std::vector<int>& dims) {
  std::vector<std::pair<AttentionShape, AttentionFeatures>> points;
  for (int dim : dims) {
    for (int seq : {4096, 8192, 16384}) {
      AttentionShape base;
      base.batch = 16384 / seq;
      base.heads_q = base.heads_kv = 2048 / dim;
      base.seq_q = base.seq_kv = seq;
      base.head_dim = dim;
      base.causal = true;
      AttentionFeatures sliding, wide, capped, alibi, packed, biased;
      sliding.window_left = 1023;
      sliding.window_right = 0;
      wide.window_left = 4095;
      wide.window_right = 0;
      capped.softcap = 50;
      alibi.alibi = true;
      // A packed batch: the same sequences laid end to end (equal_packing), so the work is the
      // dense batch's and only the addressing differs.
      AttentionShape one_pack = base;
      one_pack.batch = 1;
      one_pack.seq_q = one_pack.seq_kv = 16384;
      packed.sequences = base.batch;
      for (const AttentionFeatures& f : {AttentionFeatures{}, sliding, wide, capped, alibi})
        points.push_back({base, f});
      points.push_back({one_pack, packed});
      if (seq == 4096) {
        AttentionShape full = base;
        full.causal = false;
        biased.bias = true;
        points.push_back({full, biased});
      }
    }
  }
  return points;
}

/// Does --kernels pick this kernel (its name contains one of the filters; no filters: all)?
bool selected(const std::string& name, const std::vector<std::string>& filters) {
  if (filters.empty()) return true;
  for (const auto& f : filters) {
    if (name.find(f) != std::string::npos) return true;
  }
  return false;
}

// ---- ceilings ------------------------------------------------------------------------------

#define CUBLAS_CHECK(call)                                                                               \
  do {                                                                                                   \
    cublasStatus_t st_ = (call);                                                                         \
    if (st_ != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string("cuBLAS error in ") + #call); \
  } while (0)

__global__ void fill_random_kernel(float* out, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    // Uniform in [-1, 1): random data, not zeros (zeros run faster than real data on tensor cores).
    out[i] = float(splitmix64(seed + i) >> 40) * (2.0f / 16777216.0f) - 1.0f;
  }
}

__global__ void float_to_bf16_kernel(const float* in, __nv_bfloat16* out, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16(in[i]);
  }
}

/// Median time of `repeats` calls of `work` after one untimed call (time_launches).
double median_time_ms(const std::function<void()>& work, int repeats) {
  TimingOptions timing;
  timing.warmup = 1;
  timing.repeats = repeats;
  return time_launches(work, timing).median_ms;
}

void measure_ceilings(const std::string& path) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write '" + path + "'");
  out << "ceiling,value,unit,detail\n";

  const size_t copy_bytes = size_t(2) << 30;
  {
    DeviceBuffer a(copy_bytes), b(copy_bytes);
    fill_random_kernel<<<1024, 256>>>(a.as<float>(), copy_bytes / 4, 1);
    CUDA_CHECK_LAUNCH();
    double ms = median_time_ms(
        [&] { CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), copy_bytes, cudaMemcpyDeviceToDevice)); }, 10);
    double gbps = 2.0 * copy_bytes / (ms * 1e-3) / 1e9;
    std::printf("ceiling: device copy          %8.0f GB/s (2 GiB, read + write)\n", gbps);
    out << "copy," << gbps << ",GB/s,\"cudaMemcpy device to device, 2 GiB, bytes read + written\"\n";
  }

  const int n = 8192;
  const size_t elems = size_t(n) * n;
  DeviceBuffer a(elems * 4), b(elems * 4), c(elems * 4);
  fill_random_kernel<<<1024, 256>>>(a.as<float>(), elems, 2);
  fill_random_kernel<<<1024, 256>>>(b.as<float>(), elems, 3);
  CUDA_CHECK_LAUNCH();
  cublasHandle_t handle;
  CUBLAS_CHECK(cublasCreate(&handle));
  const float one = 1.0f, zero = 0.0f;
  const double flops = 2.0 * n * double(n) * n;
  {
    CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH));  // true fp32 FMA, no TF32
    double ms = median_time_ms(
        [&] {
          CUBLAS_CHECK(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a.as<float>(), n, b.as<float>(), n,
                                   &zero, c.as<float>(), n));
        },
        5);
    double tflops = flops / (ms * 1e-3) / 1e12;
    std::printf("ceiling: fp32 GEMM (FMA)      %8.1f TFLOP/s (cuBLAS sgemm 8192^3, pedantic math)\n", tflops);
    out << "gemm_fp32," << tflops << ",TFLOP/s,\"cuBLAS sgemm 8192^3, no TF32\"\n";
  }
  {
    CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));
    DeviceBuffer ah(elems * 2), bh(elems * 2);
    float_to_bf16_kernel<<<1024, 256>>>(a.as<float>(), ah.as<__nv_bfloat16>(), elems);
    float_to_bf16_kernel<<<1024, 256>>>(b.as<float>(), bh.as<__nv_bfloat16>(), elems);
    CUDA_CHECK_LAUNCH();
    double ms = median_time_ms(
        [&] {
          CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, ah.get(), CUDA_R_16BF, n, bh.get(),
                                    CUDA_R_16BF, n, &zero, c.get(), CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
        },
        5);
    double tflops = flops / (ms * 1e-3) / 1e12;
    std::printf("ceiling: bf16 GEMM (tensor)   %8.1f TFLOP/s (cuBLAS 8192^3, fp32 accumulate)\n", tflops);
    out << "gemm_bf16," << tflops << ",TFLOP/s,\"cuBLAS GemmEx bf16 in, fp32 accumulate, 8192^3\"\n";
  }
  cublasDestroy(handle);
}

// ---- slow points ---------------------------------------------------------------------------

/// The standard sweep runs each (head_dim, causal) series from short to long sequences at a
/// fixed token count, so a kernel's time roughly doubles from one point to the next. Once a
/// point took over max_ms / 2, the kernel's longer points of that series are skipped, saying so.
class SlowPoints {
 public:
  explicit SlowPoints(double max_ms) : max_ms_(max_ms) {}
  /// "" to run it, else why not.
  std::string skip(const std::string& kernel, const AttentionShape& s) const {
    if (max_ms_ <= 0) return "";
    auto it = last_.find(key(kernel, s));
    if (it == last_.end()) return "";  // no point of this series went over the limit yet
    char why[160];
    std::snprintf(why, sizeof why, "too slow for the sweep: %.0f ms at seq %d, the limit is --max-point-ms %.0f",
                  it->second.second, it->second.first, max_ms_);
    return why;
  }
  void record(const std::string& kernel, const AttentionShape& s, double ms) {
    if (ms > max_ms_ / 2) last_[key(kernel, s)] = {s.seq_q, ms};
  }

 private:
  static std::string key(const std::string& kernel, const AttentionShape& s) {
    return kernel + "/" + std::to_string(s.head_dim) + "/" + std::to_string(s.causal);
  }
  double max_ms_;
  std::map<std::string, std::pair<int, double>> last_;  // series -> (seq, ms) of a point over the limit
};

/// The points of a forward or backward run: chapter 09's (--features), or the sweep's shapes
/// with no feature.
std::vector<std::pair<AttentionShape, AttentionFeatures>> bench_points(const BenchOptions& opt) {
  if (opt.features) return feature_points(opt.dims);
  std::vector<std::pair<AttentionShape, AttentionFeatures>> points;
  for (const AttentionShape& s : sweep_shapes(opt.sweep, opt.dims)) points.push_back({s, AttentionFeatures{}});
  return points;
}

// ---- backward (chapter 07) ----------------------------------------------------------------

/// Every registered backward kernel over the sweep. Per point and input dtype, one problem: O
/// and LSE from chapter 07's forward (forward_for_backward.h), the fp64 oracle on the first K/V
/// head of batch 0 up to --check-max-seq. With --features: the kernels that take chapter 09's
/// features, on its points (feature_points), with O and LSE from the same forward (which knows
/// no feature: the values differ from the features' own, the work does not) and no oracle; a
/// packed batch is packed into equal lengths, as the forward's points are.
int run_backward_sweep(const BenchOptions& opt) {
  std::vector<const BackwardKernel*> kernels;
  for (const BackwardKernel& k : backward_kernels()) {
    if (selected(k.name, opt.kernel_filters) && (!opt.features || k.features != 0)) kernels.push_back(&k);
  }
  const ForwardKernel forward = backward::forward_for_backward();
  std::ofstream csv;
  if (!opt.csv.empty()) {
    csv.open(opt.csv);
    if (!csv) throw std::runtime_error("cannot write '" + opt.csv + "'");
    csv << "chapter,kernel,variant,dtype,batch,heads_q,heads_kv,seq_q,seq_kv,head_dim,causal,status,check,time_ms,tflops,"
           "dq_rel,dk_rel,dv_rel,note,device_mib,features\n";
  }
  const std::vector<std::pair<AttentionShape, AttentionFeatures>> points = bench_points(opt);
  const size_t total = points.size() * kernels.size();
  size_t done = 0, failures = 0;
  SlowPoints slow(opt.max_point_ms);
  for (const auto& [shape, features] : points) {
    const bool oracle = opt.check && !opt.features && shape.seq_q <= opt.backward_check_max_seq;
    const Packing packing = features.varlen() ? equal_packing(shape, features) : Packing{};
    const double flops =
        2.5 * (features.varlen() ? features.forward_flops(shape, packing.cu_q.data(), packing.cu_k.data())
                                 : features.forward_flops(shape));
    std::map<DType, BackwardProblem> problems;
    for (const BackwardKernel* k : kernels) {
      ++done;
      std::printf("[%3zu/%zu] %-24s %-34s ", done, total, k->name.c_str(), describe(shape, features).c_str());
      std::fflush(stdout);
      std::string status, detail;
      BackwardRunResult r;
      const std::string too_slow = slow.skip(k->name, shape);
      const std::string unsupported = support_reason(*k, shape, features);
      if (!too_slow.empty() || !unsupported.empty()) {
        status = "skipped";
        detail = too_slow.empty() ? unsupported : too_slow;
      } else {
        auto found = problems.find(k->dtype);
        if (found == problems.end()) {
          BackwardProblem p = make_backward_problem(shape, opt.seed, k->dtype, oracle ? 1 : -1, features);
          if (features.varlen()) p.packing = packing;
          run_forward_for(p, forward);
          found = problems.emplace(k->dtype, std::move(p)).first;
        }
        r = run_backward(*k, found->second, opt.iters, opt.budget_ms, opt.flush_l2);
        if (!r.ran) {
          status = r.error.empty() ? "skipped" : "error";
          detail = r.error.empty() ? r.skipped : r.error;
        } else {
          status = r.passed ? "ok" : "FAIL";
          detail = oracle ? r.summary() : r.passed ? "all written and finite" : "some never written or not finite";
          slow.record(k->name, shape, r.time_ms);
        }
      }
      const double tflops = r.time_ms > 0 ? flops / (r.time_ms * 1e9) : 0.0;
      if (r.time_ms > 0)
        std::printf("%10.3f ms %8.2f TFLOP/s %9.1f MiB  %s  %s\n", r.time_ms, tflops, r.device_mib, status.c_str(),
                    detail.c_str());
      else std::printf("%s (%s)\n", status.c_str(), detail.c_str());
      std::fflush(stdout);
      failures += status == "FAIL" || status == "error";
      if (!opt.csv.empty()) {
        csv << k->chapter << "," << k->name << "," << k->variant << "," << dtype_name(k->dtype) << "," << shape.batch
            << "," << shape.heads_q << "," << shape.heads_kv << "," << shape.seq_q << "," << shape.seq_kv << ","
            << shape.head_dim << "," << int(shape.causal) << "," << status << ","
            << (oracle ? "oracle" : "written+finite") << ",";
        if (r.time_ms > 0) csv << r.time_ms << "," << tflops;
        else csv << ",";
        if (r.ran && oracle) csv << "," << r.dq.rel << "," << r.dk.rel << "," << r.dv.rel;
        else csv << ",,,";
        csv << ",\"" << detail << "\",";
        if (r.ran) csv << r.device_mib;
        csv << ",\"" << features.to_string() << "\"\n";  // "window 1023,0": quoted
        csv.flush();
      }
    }
  }
  std::printf("%zu points, %zu failed%s%s\n", total, failures, opt.csv.empty() ? "" : "; CSV: ", opt.csv.c_str());
  return failures ? 1 : 0;
}

// ---- decode (chapter 08) ------------------------------------------------------------------

/// Every registered decode kernel at each (batch, context) point, heads 32/8: one decode step,
/// all contexts equal, blocks of 16 in shuffled physical order. The oracle checks sequence 0.
int run_decode_sweep(const BenchOptions& opt) {
  const std::vector<std::pair<int, int>> points = {{64, 16384}, {8, 8192},   {1, 32768},
                                                   {32, 4096},  {128, 2048}, {1, 8192}};
  std::vector<const DecodeKernel*> kernels;
  for (const DecodeKernel& k : decode_kernels()) {
    if (selected(k.name, opt.kernel_filters)) kernels.push_back(&k);
  }
  std::ofstream csv;
  if (!opt.csv.empty()) {
    csv.open(opt.csv);
    if (!csv) throw std::runtime_error("cannot write '" + opt.csv + "'");
    csv << "kernel,dtype,num_seqs,context,heads_q,heads_kv,head_dim,status,time_ms,kv_gbps,check,device_mib\n";
  }
  const size_t total = points.size() * opt.dims.size() * kernels.size();
  size_t done = 0, failures = 0;
  for (int dim : opt.dims)
    for (const auto& [batch, context] : points)
      for (DType dtype : {DType::BF16, DType::F16}) {
        std::vector<const DecodeKernel*> of_dtype;
        for (const DecodeKernel* k : kernels)
          if (k->dtype == dtype) of_dtype.push_back(k);
        if (of_dtype.empty()) continue;
        DecodeSpec spec;
        spec.head_dim = dim;
        spec.contexts.assign(batch, context);
        spec.check_seqs = opt.check ? 1 : 0;
        const DecodeProblem problem = make_decode_problem(spec, opt.seed, dtype);
        const DecodeDeviceInputs inputs = upload_decode_problem(problem);
        for (const DecodeKernel* k : of_dtype) {
          ++done;
          std::printf("[%3zu/%zu] %-22s b%-3d ctx %-6d h32/8 d%d  ", done, total, k->name.c_str(), batch, context, dim);
          std::fflush(stdout);
          const DecodeRunResult r = run_decode(*k, problem, inputs, opt.iters, opt.flush_l2);
          const std::string status = !r.ran ? (r.error.empty() ? "skipped" : "error") : r.passed ? "ok" : "FAIL";
          if (r.ran)
            std::printf("%9.4f ms %7.0f GB/s %9.1f MiB  %s  %s\n", r.time_ms, r.gbps, r.device_mib, status.c_str(),
                        r.summary().c_str());
          else std::printf("%s (%s)\n", status.c_str(), (r.error.empty() ? r.skipped : r.error).c_str());
          std::fflush(stdout);
          failures += status == "FAIL" || status == "error";
          if (!opt.csv.empty()) {
            csv << k->name << "," << dtype_name(dtype) << "," << batch << "," << context << ",32,8," << dim << ","
                << status << "," << r.time_ms << "," << r.gbps << ",\"" << (r.ran ? r.summary() : r.skipped + r.error)
                << "\",";
            if (r.ran) csv << r.device_mib;
            csv << "\n";
          }
        }
      }
  std::printf("%zu points, %zu failed%s%s\n", total, failures, opt.csv.empty() ? "" : "; CSV: ", opt.csv.c_str());
  return failures ? 1 : 0;
}

}  // namespace
}  // namespace fa

int main(int argc, char** argv) {
  using namespace fa;
  BenchOptions opt;
  try {
    opt = parse_bench(argc, argv);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "fa_bench: error: %s\n", e.what());
    return 2;
  }
  if (opt.list) {
    for (const ForwardKernel& k : forward_kernels()) {
      std::printf("ch%02d  %-22s %-5s %s\n", k.chapter, k.name.c_str(), dtype_name(k.dtype), k.summary.c_str());
    }
    for (const BackwardKernel& k : backward_kernels()) {
      std::printf("ch%02d  %-22s %-5s %s (--backward)\n", k.chapter, k.name.c_str(), dtype_name(k.dtype),
                  k.summary.c_str());
    }
    for (const DecodeKernel& k : decode_kernels()) {
      std::printf("ch%02d  %-22s %-5s %s (--decode)\n", k.chapter, k.name.c_str(), dtype_name(k.dtype),
                  k.summary.c_str());
    }
    return 0;
  }
  const GpuInfo& gpu = detect_gpu();
  if (!gpu.available) {
    std::printf("fa_bench: no GPU (%s): nothing to time\n", gpu.reason.c_str());
    return 0;
  }
  try {
    std::printf("fa_bench on %s\n", describe_gpu(gpu).c_str());
    if (!opt.ceilings_csv.empty()) measure_ceilings(opt.ceilings_csv);
    if (opt.decode) return run_decode_sweep(opt);
    if (opt.backward) return run_backward_sweep(opt);  // with --features too

    std::vector<const ForwardKernel*> kernels;
    for (const ForwardKernel& k : forward_kernels()) {
      if (selected(k.name, opt.kernel_filters) && (!opt.features || k.features != 0)) kernels.push_back(&k);
    }
    const std::vector<std::pair<AttentionShape, AttentionFeatures>> points = bench_points(opt);
    const size_t total = points.size() * kernels.size();
    size_t done = 0, failures = 0;
    RunOptions run;
    run.check = opt.check;
    run.iters = opt.iters;
    run.warmup = opt.warmup;
    run.budget_ms = opt.budget_ms;
    run.flush_l2 = opt.flush_l2;
    SlowPoints slow(opt.max_point_ms);
    for (const auto& [shape, features] : points) {
      const Packing packing = features.varlen() ? equal_packing(shape, features) : Packing{};
      Problem problem(shape, opt.seed, false, features, features.varlen() ? &packing : nullptr);
      const std::string label = describe(shape, features);
      for (const ForwardKernel* k : kernels) {
        ++done;
        std::printf("[%3zu/%zu] %-22s %-34s ", done, total, k->name.c_str(), label.c_str());
        std::fflush(stdout);
        RunResult r;
        const std::string too_slow = slow.skip(k->name, shape);
        if (too_slow.empty()) {
          r = run_forward(*k, problem, run);
          if (r.ms > 0) slow.record(k->name, shape, r.ms);
        } else {
          r = forward_result(*k, shape, features);
          r.skipped = too_slow;
        }
        if (r.ms > 0) {
          std::printf("%10.3f ms %8.2f TFLOP/s %7.0f GB/s %9.1f MiB  %s", r.ms, r.tflops, r.gbps, r.device_mib,
                      r.status().c_str());
        } else {
          std::printf("%s", r.status().c_str());
        }
        if (!r.skipped.empty()) std::printf(" (%s)", r.skipped.c_str());
        if (!r.error.empty()) std::printf(" (%s)", r.error.c_str());
        if (r.checked && !r.report.passed()) std::printf(" [%s]", r.report.summary().c_str());
        std::printf("\n");
        std::fflush(stdout);
        if (r.status() == "FAIL" || r.status() == "error") ++failures;
        if (!opt.csv.empty()) append_csv(opt.csv, {r});
      }
    }
    std::printf("%zu points, %zu failed%s%s\n", total, failures, opt.csv.empty() ? "" : "; CSV: ", opt.csv.c_str());
    return failures ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fa_bench: error: %s\n", e.what());
    return 1;
  }
}
