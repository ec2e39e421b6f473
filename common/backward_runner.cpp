// See backward_runner.h.
#include "backward_runner.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "cuda_check.h"
#include "random.h"
#include "runner.h"
#include "tensor.h"
#include "timing.h"

namespace fa {

BackwardProblem make_backward_problem(const AttentionShape& shape, uint64_t seed, DType dtype, int check_kv_heads,
                                      const AttentionFeatures& features) {
  features.validate(shape);
  BackwardProblem p;
  p.shape = shape;
  p.features = features;
  p.seed = seed;
  p.dtype = dtype;
  auto fill = [&](std::vector<float>& x, int64_t n, int stream) {
    x.resize(n);
    fill_random_normal(x, seed, uint64_t(stream));  // threads; the same values as one thread would draw
    round_all(x, dtype);
  };
  fill(p.q, shape.q_elems(), 0);
  fill(p.k, shape.kv_elems(), 1);
  fill(p.v, shape.kv_elems(), 2);
  fill(p.d_o, shape.o_elems(), 3);
  p.bias = random_bias(shape, features, seed);
  if (features.varlen()) p.packing = random_packing(shape, features, seed);
  if (features.any() && check_kv_heads > 0) check_kv_heads = 0;
  p.checked = shape;
  if (check_kv_heads < 0) {  // no oracle: outputs are only checked to be written and finite
    p.checked.batch = 0;
    p.needs_forward = true;
    return p;
  }
  if (check_kv_heads > 0 && (shape.batch > 1 || check_kv_heads < shape.heads_kv)) {
    // The first K/V heads of batch 0 and their query heads: the leading planes of every tensor.
    p.checked.batch = 1;
    p.checked.heads_kv = std::min(check_kv_heads, shape.heads_kv);
    p.checked.heads_q = p.checked.heads_kv * shape.group_size();
    p.needs_forward = true;
  }
  const AttentionExtras extras = p.host_extras();
  p.ref = reference_backward(p.checked, p.q.data(), p.k.data(), p.v.data(), p.d_o.data(), features, &extras);
  if (!p.needs_forward) {
    p.o.resize(p.ref.o.size());
    for (std::size_t i = 0; i < p.o.size(); ++i) p.o[i] = round_to_dtype(float(p.ref.o[i]), dtype);
    p.lse.assign(p.ref.lse.begin(), p.ref.lse.end());
  }
  return p;
}

AttentionExtras BackwardProblem::host_extras() const { return host_extras_of(features, bias, packing); }

void run_forward_for(BackwardProblem& problem, const ForwardKernel& forward) {
  launch_forward_on(forward, problem.shape, problem.q, problem.k, problem.v, problem.o, problem.lse);
  round_all(problem.o, problem.dtype);
  problem.needs_forward = false;
}

double backward_tolerance(DType dtype) {
  switch (dtype) {
    case DType::F32: return 1e-4;  // float sums over seq terms, atomics in any order
    case DType::F16: return 1e-2;
    case DType::BF16: return 5e-2;
  }
  return 0;
}

namespace {

/// `want` covers the leading elements of the output (see BackwardProblem::checked); every
/// element of the output must have been written.
GradientCheck check(DType dtype, const std::vector<unsigned char>& raw, const std::vector<double>& want) {
  GradientCheck c;
  const std::size_t n = raw.size() / dtype_size(dtype);
  c.unwritten = int64_t(count_poison(dtype, raw.data(), want.size(), n));
  std::vector<float> got(want.size());
  decode_elements(dtype, raw.data(), got.data(), got.size());
  double err = 0, norm = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (is_poison(dtype, raw.data(), i)) {
      ++c.unwritten;
      continue;
    }
    if (!std::isfinite(got[i])) {
      ++c.nonfinite;
      continue;
    }
    const double diff = got[i] - want[i];
    err += diff * diff;
    norm += want[i] * want[i];
    c.max_abs = std::max(c.max_abs, std::fabs(diff));
  }
  c.rel = norm > 0 ? std::sqrt(err / norm) : std::sqrt(err);
  return c;
}

}  // namespace

std::string BackwardRunResult::summary() const {
  char line[320];
  std::snprintf(line, sizeof line, "dQ rel %.1e max %.1e, dK rel %.1e max %.1e, dV rel %.1e max %.1e (limit %.0e)%s",
                dq.rel, dq.max_abs, dk.rel, dk.max_abs, dv.rel, dv.max_abs, limit,
                dq.unwritten + dk.unwritten + dv.unwritten + dq.nonfinite + dk.nonfinite + dv.nonfinite > 0
                    ? ", some outputs never written or not finite"
                    : "");
  return line;
}

BackwardRunResult run_backward(const BackwardKernel& kernel, const BackwardProblem& problem, int iters,
                               double budget_ms, bool flush_l2) {
  BackwardRunResult r;
  const AttentionShape& s = problem.shape;
  const GpuInfo& gpu = detect_gpu();
  if (!gpu.available) {
    r.skipped = "no GPU: " + gpu.reason;
    return r;
  }
  r.skipped = support_reason(kernel, s, problem.features);
  if (!r.skipped.empty()) return r;
  if (problem.needs_forward) {
    r.error = "the problem has no O and LSE yet (run_forward_for)";
    return r;
  }
  try {
    const DType t = kernel.dtype;
    DeviceBuffer::reset_peak();
    const std::size_t before = DeviceBuffer::live_bytes();
    DeviceBuffer q = upload_as(t, problem.q), k = upload_as(t, problem.k), v = upload_as(t, problem.v);
    DeviceBuffer o = upload_as(t, problem.o), d_o = upload_as(t, problem.d_o), lse = upload_as(DType::F32, problem.lse);
    DeviceBuffer dq(std::size_t(s.q_elems()) * dtype_size(t)), dk(std::size_t(s.kv_elems()) * dtype_size(t)),
        dv(std::size_t(s.kv_elems()) * dtype_size(t));
    DeviceBuffer workspace(kernel.workspace_bytes ? kernel.workspace_bytes(s) : 0);
    const DeviceExtras extras(problem.features, problem.bias, problem.packing);  // chapter 09's, on the device
    dq.poison();
    dk.poison();
    dv.poison();
    BackwardParams p;
    p.shape = s;
    p.features = problem.features;
    p.q = q.get();
    p.k = k.get();
    p.v = v.get();
    p.o = o.get();
    p.d_o = d_o.get();
    p.lse = static_cast<const float*>(lse.get());
    p.dq = dq.get();
    p.dk = dk.get();
    p.dv = dv.get();
    p.workspace = workspace.get();
    p.extras = extras.extras;
    kernel.launch(p);
    CUDA_CHECK(cudaDeviceSynchronize());
    r.device_mib = double(DeviceBuffer::peak_bytes() - before) / (1 << 20);
    r.ran = true;
    const std::vector<unsigned char> dq_first = dq.download(), dk_first = dk.download(), dv_first = dv.download();
    r.dq = check(t, dq_first, problem.ref.dq);
    r.dk = check(t, dk_first, problem.ref.dk);
    r.dv = check(t, dv_first, problem.ref.dv);
    dq.poison();
    dk.poison();
    dv.poison();
    kernel.launch(p);
    CUDA_CHECK(cudaDeviceSynchronize());
    r.repeat_identical = dq.download() == dq_first && dk.download() == dk_first && dv.download() == dv_first;
    r.limit = backward_tolerance(t);
    const auto ok = [&](const GradientCheck& c) { return c.unwritten == 0 && c.nonfinite == 0 && c.rel <= r.limit; };
    r.passed = ok(r.dq) && ok(r.dk) && ok(r.dv);
    // No warm-up: the two launches above already paid for the module load and the clocks.
    TimingOptions timing;
    timing.repeats = iters;
    timing.budget_ms = budget_ms;
    timing.flush_l2 = flush_l2;
    r.time_ms = time_launches([&] { kernel.launch(p); }, timing).median_ms;
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  return r;
}

}  // namespace fa
