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

namespace {

/// `total` split into `parts` lengths at random cut points (so some may be 0).
std::vector<int> random_lengths(int total, int parts, std::mt19937_64& rng) {
  std::vector<int> cuts(parts - 1);
  for (int& c : cuts) c = std::uniform_int_distribution<int>(0, total)(rng);
  std::sort(cuts.begin(), cuts.end());
  std::vector<int> lengths(parts);
  int previous = 0;
  for (int i = 0; i < parts - 1; ++i) {
    lengths[i] = cuts[i] - previous;
    previous = cuts[i];
  }
  lengths[parts - 1] = total - previous;
  return lengths;
}

std::vector<int> prefix_sums(const std::vector<int>& lengths) {
  std::vector<int> cu(lengths.size() + 1, 0);
  for (size_t i = 0; i < lengths.size(); ++i) cu[i + 1] = cu[i] + lengths[i];
  return cu;
}

}  // namespace

Packing random_packing(const AttentionShape& shape, uint64_t seed) {
  std::mt19937_64 rng(splitmix64(seed ^ 0x5EC1E7ull));
  std::vector<int> q = random_lengths(shape.seq_q, shape.batch, rng),
                   k = random_lengths(shape.seq_kv, shape.batch, rng);
  if (shape.batch >= 3 && shape.seq_q >= 1) {
    // Sequence 1 gives its queries to sequence 0; sequence 2 keeps exactly one, taking it from
    // the longest sequence when it had none.
    q[0] += q[1];
    q[1] = 0;
    if (q[2] == 0) {
      --*std::max_element(q.begin(), q.end());
      q[2] = 1;
    } else {
      q[0] += q[2] - 1;
      q[2] = 1;
    }
  }
  return {prefix_sums(q), prefix_sums(k)};
}

Packing equal_packing(const AttentionShape& shape) {
  std::vector<int> q(shape.batch, shape.seq_q / shape.batch), k(shape.batch, shape.seq_kv / shape.batch);
  q.back() += shape.seq_q % shape.batch;
  k.back() += shape.seq_kv % shape.batch;
  return {prefix_sums(q), prefix_sums(k)};
}

std::vector<float> random_bias(const AttentionShape& shape, uint64_t seed) {
  std::vector<float> bias;
  if (shape.bias) {
    bias.resize(shape.bias_elems());
    fill_random_normal(bias, seed, 7);
  }
  return bias;
}

AttentionExtras host_extras_of(const AttentionShape& shape, const std::vector<float>& bias, const Packing& packing) {
  AttentionExtras e;
  if (shape.bias) e.bias = bias.data();
  if (shape.varlen) {
    e.cu_seqlens_q = packing.cu_q.data();
    e.cu_seqlens_k = packing.cu_k.data();
    for (int b = 0; b < shape.batch; ++b) {
      e.max_seqlen_q = std::max(e.max_seqlen_q, packing.cu_q[b + 1] - packing.cu_q[b]);
      e.max_seqlen_k = std::max(e.max_seqlen_k, packing.cu_k[b + 1] - packing.cu_k[b]);
    }
  }
  return e;
}

DeviceExtras::DeviceExtras(const AttentionShape& shape, const std::vector<float>& bias, const Packing& packing)
    : extras(host_extras_of(shape, bias, packing)) {
  auto upload_ints = [](DeviceBuffer& to, const std::vector<int>& from) {
    to = DeviceBuffer(from.size() * sizeof(int));
    to.upload(from.data(), from.size() * sizeof(int));
    return to.as<int>();
  };
  if (shape.bias) {
    this->bias = upload_as(DType::F32, bias);
    extras.bias = this->bias.as<float>();
  }
  if (shape.varlen) {
    extras.cu_seqlens_q = upload_ints(cu_q, packing.cu_q);
    extras.cu_seqlens_k = upload_ints(cu_k, packing.cu_k);
  }
}

Problem::Problem(const AttentionShape& shape, uint64_t seed, bool full_check, const Packing* packing)
    : shape_(shape),
      seed_(seed),
      plan_(full_check ? full_check_plan(shape) : choose_check_plan(shape, seed)),
      raw_(make_random_inputs(shape, seed)) {
  bias_ = random_bias(shape, seed);
  if (shape.varlen) {
    packing_ = packing ? *packing : random_packing(shape, seed);
    if (int(packing_.cu_q.size()) != shape.batch + 1 || int(packing_.cu_k.size()) != shape.batch + 1 ||
        packing_.cu_q.back() != shape.seq_q || packing_.cu_k.back() != shape.seq_kv)
      throw std::invalid_argument("a packing of " + shape.to_string() +
                                  " needs batch + 1 boundaries ending at seq_q and seq_kv");
  }
}

AttentionExtras Problem::host_extras() const { return host_extras_of(shape_, bias_, packing_); }

AttentionExtras Problem::device_extras() {
  if (!device_extras_) device_extras_.emplace(shape_, bias_, packing_);
  return device_extras_->extras;
}

std::size_t Problem::device_extras_bytes() {
  device_extras();
  return device_extras_->bias.bytes() + device_extras_->cu_q.bytes() + device_extras_->cu_k.bytes();
}

double Problem::forward_flops() const {
  return shape_.forward_flops(shape_.varlen ? packing_.cu_q.data() : nullptr,
                              shape_.varlen ? packing_.cu_k.data() : nullptr);
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
    it = reference_.emplace(dtype, reference_forward(shape_, h.q.data(), h.k.data(), h.v.data(), plan_, &extras)).first;
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
RunResult start_result(const Entry& entry, const AttentionShape& shape, const char* device) {
  RunResult r;
  r.name = entry.name;
  r.variant = entry.variant;
  r.chapter = entry.chapter;
  r.number = entry.number;
  r.device = device;
  r.shape = shape;
  return r;
}

void finish_rates(RunResult& r) {
  if (r.ms <= 0) return;
  r.tflops = (r.flops > 0 ? r.flops : r.shape.forward_flops()) / (r.ms * 1e-3) / 1e12;
  r.gbps = r.shape.forward_min_bytes(int(dtype_size(r.dtype))) / (r.ms * 1e-3) / 1e9;
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
  launch.params.extras = problem.device_extras();
  return launch;
}

RunResult forward_result(const ForwardKernel& kernel, const AttentionShape& shape) {
  RunResult r = start_result(kernel, shape, "gpu");
  r.dtype = kernel.dtype;
  return r;
}

RunResult run_forward(const ForwardKernel& kernel, Problem& problem, const RunOptions& options) {
  const AttentionShape& shape = problem.shape();
  RunResult r = forward_result(kernel, shape);
  r.flops = problem.forward_flops();
  if (kernel.memory_note) r.note = kernel.memory_note(shape);
  r.skipped = support_reason(kernel, shape);
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
  RunResult r = start_result(algorithm, shape, "cpu");
  r.flops = problem.forward_flops();
  r.skipped = support_reason(algorithm, shape);
  if (!r.skipped.empty()) return r;
  try {
    const HostInputs& in = problem.host(DType::F32);
    std::vector<float> o(shape.o_elems()), lse(shape.lse_elems());
    std::memset(o.data(), kPoisonByte, o.size() * sizeof(float));
    std::memset(lse.data(), kPoisonByte, lse.size() * sizeof(float));
    auto t0 = std::chrono::steady_clock::now();
    if (algorithm.run_extras) {
      algorithm.run_extras(shape, problem.host_extras(), in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data());
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
