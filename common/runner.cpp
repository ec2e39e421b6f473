#include "runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>

#include "cuda_check.h"
#include "phase_timer.h"
#include "random.h"

namespace fa {

Problem::Problem(const AttentionShape& shape, uint64_t seed, bool full_check, const AttentionFeatures& features,
                 const Packing* packing)
    : shape_(shape),
      features_(features),
      seed_(seed),
      plan_(full_check ? full_check_plan(shape) : choose_check_plan(shape, seed)),
      raw_(make_random_inputs(shape, seed)) {
  features.validate(shape);
  bias_ = random_bias(shape, features, seed);
  if (features.varlen()) {
    packing_ = packing ? *packing : random_packing(shape, features, seed);
    check_packing(shape, features, packing_);
  }
}

AttentionExtras Problem::host_extras() const { return host_extras_of(features_, bias_, packing_); }

AttentionExtras Problem::device_extras() {
  if (!device_extras_) device_extras_.emplace(features_, bias_, packing_);
  return device_extras_->extras;
}

std::size_t Problem::device_extras_bytes() {
  device_extras();
  return device_extras_->bytes();
}

double Problem::forward_flops() const {
  return features_.forward_flops(shape_, features_.varlen() ? packing_.cu_q.data() : nullptr,
                                 features_.varlen() ? packing_.cu_k.data() : nullptr);
}

const HostInputs& Problem::host(DType dtype) {
  auto it = rounded_.find(dtype);
  if (it == rounded_.end()) it = rounded_.emplace(dtype, round_inputs(raw_, dtype)).first;
  return it->second;
}

const DeviceInputs& Problem::device(DType dtype) {
  auto it = device_.find(dtype);
  if (it == device_.end()) {
    const HostInputs& h = host(dtype);
    it =
        device_.emplace(dtype, DeviceInputs{upload_as(dtype, h.q), upload_as(dtype, h.k), upload_as(dtype, h.v)}).first;
  }
  return it->second;
}

const ForwardReference& Problem::reference(DType dtype) {
  auto it = reference_.find(dtype);
  if (it == reference_.end()) {
    const HostInputs& h = host(dtype);
    const AttentionExtras extras = host_extras();
    it = reference_
             .emplace(dtype, reference_forward(shape_, h.q.data(), h.k.data(), h.v.data(), plan_, features_, &extras))
             .first;
  }
  return it->second;
}

std::string RunResult::status() const {
  if (!skipped.empty()) return "skipped";
  if (!error.empty()) return "error";
  return passed() ? "ok" : "FAIL";
}

namespace {

template <class Entry>
RunResult start_result(const Entry& entry, const AttentionShape& shape, const AttentionFeatures& features,
                       const char* device) {
  RunResult r;
  r.name = entry.name;
  r.variant = entry.variant;
  r.chapter = entry.chapter;
  r.number = entry.number;
  r.device = device;
  r.shape = shape;
  r.features = features;
  return r;
}

void finish_rates(RunResult& r) {
  if (r.ms <= 0) return;
  r.tflops = (r.flops > 0 ? r.flops : r.shape.forward_flops()) / (r.ms * 1e-3) / 1e12;
  r.gbps = r.features.forward_min_bytes(r.shape, int(dtype_size(r.dtype))) / (r.ms * 1e-3) / 1e9;
}

std::string gib(double bytes) {
  std::ostringstream s;
  s.precision(3);
  s << bytes / double(1ull << 30) << " GiB";
  return s.str();
}

}  // namespace

void launch_forward_on(const ForwardKernel& kernel, const AttentionShape& shape, const std::vector<float>& q,
                       const std::vector<float>& k, const std::vector<float>& v, std::vector<float>& o,
                       std::vector<float>& lse) {
  const DType t = kernel.dtype;
  const DeviceBuffer dq = upload_as(t, q), dk = upload_as(t, k), dv = upload_as(t, v);
  ForwardLaunch launch = prepare_forward(kernel, shape, dq.get(), dk.get(), dv.get());
  kernel.launch(launch.params);
  CUDA_CHECK(cudaDeviceSynchronize());
  o.resize(shape.o_elems());
  decode_in_parallel(t, launch.o.download().data(), o.data(), o.size());
  const std::vector<unsigned char> raw = launch.lse.download();
  lse.resize(shape.lse_elems());
  std::memcpy(lse.data(), raw.data(), raw.size());
}

ForwardLaunch prepare_forward(const ForwardKernel& kernel, const AttentionShape& shape, const void* q, const void* k,
                              const void* v) {
  ForwardLaunch launch{DeviceBuffer(size_t(shape.o_elems()) * dtype_size(kernel.dtype)),
                       DeviceBuffer(size_t(shape.lse_elems()) * sizeof(float)),
                       DeviceBuffer(kernel.workspace_bytes ? kernel.workspace_bytes(shape) : 0), ForwardParams{}};
  launch.o.poison();
  launch.lse.poison();
  ForwardParams& p = launch.params;
  p.shape = shape;
  p.q = q;
  p.k = k;
  p.v = v;
  p.o = launch.o.get();
  p.lse = launch.lse.as<float>();
  p.workspace = launch.workspace.get();
  return launch;
}

ForwardLaunch prepare_forward(const ForwardKernel& kernel, Problem& problem) {
  const DeviceInputs& in = problem.device(kernel.dtype);
  ForwardLaunch launch = prepare_forward(kernel, problem.shape(), in.q.get(), in.k.get(), in.v.get());
  launch.params.features = problem.features();
  launch.params.extras = problem.device_extras();
  return launch;
}

RunResult forward_result(const ForwardKernel& kernel, const AttentionShape& shape, const AttentionFeatures& features) {
  RunResult r = start_result(kernel, shape, features, "gpu");
  r.dtype = kernel.dtype;
  return r;
}

RunResult run_forward(const ForwardKernel& kernel, Problem& problem, const RunOptions& options) {
  const AttentionShape& shape = problem.shape();
  RunResult r = forward_result(kernel, shape, problem.features());
  r.flops = problem.forward_flops();
  if (kernel.memory_note) r.note = kernel.memory_note(shape);
  r.skipped = support_reason(kernel, shape, problem.features());
  if (!r.skipped.empty()) return r;
  const GpuInfo& gpu = detect_gpu();
  if (!gpu.available) {
    r.skipped = "no GPU: " + gpu.reason;
    return r;
  }
  try {
    const size_t element = dtype_size(kernel.dtype);
    const size_t workspace = kernel.workspace_bytes ? kernel.workspace_bytes(shape) : 0;
    const size_t output_bytes = size_t(shape.o_elems()) * element + size_t(shape.lse_elems()) * 4;
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    double needed = double(workspace + output_bytes);
    if (needed > 0.9 * double(free_bytes)) {
      r.skipped = "needs " + gib(needed) + " of device memory, " + gib(double(free_bytes)) + " free";
      return r;
    }
    // Peak device memory: the inputs in the kernel's dtype (with chapter 09's bias and sequence
    // boundaries), and whatever the outputs, the workspace and the launch itself add (every device
    // allocation is a DeviceBuffer).
    const DeviceInputs& inputs = problem.device(kernel.dtype);
    const std::size_t input_bytes =
        inputs.q.bytes() + inputs.k.bytes() + inputs.v.bytes() + problem.device_extras_bytes();
    DeviceBuffer::reset_peak();
    const std::size_t before = DeviceBuffer::live_bytes();
    ForwardLaunch launch = prepare_forward(kernel, problem);
    const ForwardParams& params = launch.params;
    kernel.launch(params);
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cudaDeviceSynchronize());
    r.device_mib = double(input_bytes + DeviceBuffer::peak_bytes() - before) / (1 << 20);
    r.ran = true;

    if (options.check) {
      std::vector<unsigned char> o_raw = launch.o.download();
      std::vector<unsigned char> lse_raw = launch.lse.download();
      std::vector<float> lse_values(shape.lse_elems());
      std::memcpy(lse_values.data(), lse_raw.data(), lse_raw.size());
      r.report = compare_forward(shape, kernel.dtype, o_raw, lse_values, problem.plan(),
                                 problem.reference(kernel.dtype), kernel.tolerance ? &*kernel.tolerance : nullptr);
      r.checked = true;
      r.plan = problem.plan().describe(shape);
    }

    if (options.iters > 0) {
      TimingOptions timing;
      timing.warmup = options.warmup;
      timing.repeats = options.iters;
      timing.budget_ms = options.budget_ms;
      timing.min_repeats = 3;
      timing.flush_l2 = options.flush_l2;
      timing.stream = params.stream;
      const LaunchTimes times = time_launches([&] { kernel.launch(params); }, timing);
      r.iters = int(times.ms.size());
      r.ms = times.median_ms;
      r.ms_min = times.min_ms;
      finish_rates(r);
      // Where the time goes, for kernels that mark their phases: more launches with the marks
      // live, up to 7 (as many as were timed), and each phase's median over them (one launch's
      // phases vary as much as its total does). The L2 is flushed before each when the timed
      // launches had it flushed, so the phases add up to the same total.
      std::optional<L2Flush> l2;
      if (options.flush_l2) l2.emplace();
      std::vector<std::vector<std::pair<std::string, float>>> runs;
      for (int i = 0; i < std::min(r.iters, 7); ++i) {
        if (l2) l2->flush(params.stream);
        PhaseTimer phases(params.stream);
        kernel.launch(params);
        runs.push_back(phases.finish());
      }
      std::vector<std::pair<std::string, float>> medians = runs.front();
      for (std::size_t k = 0; k < medians.size(); ++k) {
        std::vector<float> phase_times;
        for (const auto& run : runs) phase_times.push_back(run[k].second);
        medians[k].second = float(median_ms(phase_times));
      }
      r.phases = describe_phases(medians);
    }
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  return r;
}

RunResult run_cpu_algorithm(const CpuAlgorithm& algorithm, Problem& problem, const RunOptions& options) {
  const AttentionShape& shape = problem.shape();
  RunResult r = start_result(algorithm, shape, problem.features(), "cpu");
  r.flops = problem.forward_flops();
  r.skipped = support_reason(algorithm, shape, problem.features());
  if (!r.skipped.empty()) return r;
  try {
    const HostInputs& in = problem.host(DType::F32);
    std::vector<float> o(shape.o_elems()), lse(shape.lse_elems());
    std::memset(o.data(), kPoisonByte, o.size() * sizeof(float));
    std::memset(lse.data(), kPoisonByte, lse.size() * sizeof(float));
    auto t0 = std::chrono::steady_clock::now();
    if (algorithm.run_extras) {
      algorithm.run_extras(shape, problem.features(), problem.host_extras(), in.q.data(), in.k.data(), in.v.data(),
                           o.data(), lse.data());
    } else {
      algorithm.run(shape, in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data());
    }
    auto t1 = std::chrono::steady_clock::now();
    r.ran = true;
    r.iters = 1;
    r.ms = r.ms_min = std::chrono::duration<double, std::milli>(t1 - t0).count();
    finish_rates(r);
    if (options.check) {
      std::vector<unsigned char> o_raw(o.size() * sizeof(float));
      std::memcpy(o_raw.data(), o.data(), o_raw.size());
      r.report = compare_forward(shape, DType::F32, o_raw, lse, problem.plan(), problem.reference(DType::F32));
      r.checked = true;
      r.plan = problem.plan().describe(shape);
    }
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  return r;
}

}  // namespace fa
