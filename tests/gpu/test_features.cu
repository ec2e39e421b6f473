// Chapter 09's kernels on chapter 09's shape list (test_shapes.h: windows, softcap on large
// logits, ALiBi, a bias, packed batches with empty and length-1 sequences), against the fp64
// oracle, every row. Fresh random inputs and packings per test (the seed is printed on
// failure); outputs poisoned before each launch. The plain shape list runs these kernels too
// (test_forward_kernels.cu).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backward_runner.h"
#include "compare.h"
#include "reference.h"
#include "registry.h"
#include "runner.h"
#include "tensor.h"
#include "../test_shapes.h"

namespace fa {
namespace {

struct FeatureCase {
  const ForwardKernel* kernel;
  FeatureProblem problem;
};

void PrintTo(const FeatureCase& c, std::ostream* out) { *out << c.kernel->name << " on " << c.problem.to_string(); }

std::vector<FeatureCase> feature_cases() {
  std::vector<FeatureCase> cases;
  for (const ForwardKernel& k : forward_kernels()) {
    if (k.features == 0) continue;
    for (const FeatureProblem& p : feature_shapes()) cases.push_back({&k, p});
  }
  return cases;
}

class FeatureKernelTest : public ::testing::TestWithParam<FeatureCase> {};

TEST_P(FeatureKernelTest, MatchesOracle) {
  SKIP_WITHOUT_GPU();
  const FeatureCase& c = GetParam();
  const std::string why = support_reason(*c.kernel, c.problem.shape, c.problem.features);
  if (!why.empty()) GTEST_SKIP() << c.kernel->name << " does not support " << c.problem.to_string() << ": " << why;
  const uint64_t seed = fresh_seed();
  Problem problem(c.problem.shape, seed, /*full_check=*/true, c.problem.features);
  RunOptions options;
  options.iters = 0;
  const RunResult r = run_forward(*c.kernel, problem, options);
  ASSERT_TRUE(r.error.empty()) << r.error;
  ASSERT_TRUE(r.ran) << r.skipped;
  EXPECT_TRUE(r.report.passed()) << c.kernel->name << " on " << c.problem.to_string() << ", seed " << seed << "\n"
                                 << r.report.details();
}

INSTANTIATE_TEST_SUITE_P(Features, FeatureKernelTest, ::testing::ValuesIn(feature_cases()), [](const auto& info) {
  return info.param.kernel->name + "__" + info.param.problem.to_identifier();
});

// flash-attn's alibi_slopes: the caller's slopes, one per head or per (batch, head), reach every
// kernel that takes ALiBi, forward and backward, through AttentionExtras::alibi_slopes (device
// floats). Against the oracle with the same slopes.
struct SlopeCase {
  const ForwardKernel* forward = nullptr;
  const BackwardKernel* backward = nullptr;
  bool per_sequence = false;
  std::string name() const {
    return (forward ? forward->name : backward->name) + (per_sequence ? "__per_batch_and_head" : "__per_head");
  }
};
void PrintTo(const SlopeCase& c, std::ostream* out) { *out << c.name(); }

std::vector<SlopeCase> slope_cases() {
  std::vector<SlopeCase> cases;
  for (bool per_sequence : {false, true}) {
    for (const ForwardKernel& k : forward_kernels())
      if (k.features & kFeatureAlibi) cases.push_back({&k, nullptr, per_sequence});
    for (const BackwardKernel& k : backward_kernels())
      if (k.features & kFeatureAlibi) cases.push_back({nullptr, &k, per_sequence});
  }
  return cases;
}

class CallerSlopesTest : public ::testing::TestWithParam<SlopeCase> {};

TEST_P(CallerSlopesTest, MatchOracle) {
  SKIP_WITHOUT_GPU();
  const SlopeCase& c = GetParam();
  const AttentionShape shape = shape_of(2, 4, 2, 200, 260, 64, true);
  AttentionFeatures f;
  f.alibi = true;
  const DType dtype = c.forward ? c.forward->dtype : c.backward->dtype;
  const std::string why = c.forward ? support_reason(*c.forward, shape, f) : support_reason(*c.backward, shape, f);
  if (!why.empty()) GTEST_SKIP() << c.name() << ": " << why;
  const uint64_t seed = fresh_seed();
  std::vector<float> slopes(std::size_t(c.per_sequence ? shape.batch * shape.heads_q : shape.heads_q));
  fill_random_normal(slopes, seed, 13);
  for (float& x : slopes) x = 0.05f + 0.4f * std::fabs(x);
  AttentionExtras host;
  host.alibi_slopes = slopes.data();
  host.alibi_slopes_per_sequence = c.per_sequence;
  const DeviceBuffer device_slopes = upload_as(DType::F32, slopes);
  AttentionExtras device = host;
  device.alibi_slopes = device_slopes.as<float>();
  if (c.forward) {
    const HostInputs in = round_inputs(make_random_inputs(shape, seed), dtype);
    const DeviceBuffer q = upload_as(dtype, in.q), k = upload_as(dtype, in.k), v = upload_as(dtype, in.v);
    DeviceBuffer o(std::size_t(shape.o_elems()) * dtype_size(dtype)), lse(std::size_t(shape.lse_elems()) * 4);
    o.poison();
    lse.poison();
    DeviceBuffer work(c.forward->workspace_bytes ? c.forward->workspace_bytes(shape) : 0);
    ForwardParams p;
    p.shape = shape;
    p.q = q.get();
    p.k = k.get();
    p.v = v.get();
    p.o = o.get();
    p.lse = lse.as<float>();
    p.workspace = work.get();
    p.features = f;
    p.extras = device;
    c.forward->launch(p);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<unsigned char> lse_raw = lse.download();
    std::vector<float> lse_host(std::size_t(shape.lse_elems()));
    std::memcpy(lse_host.data(), lse_raw.data(), lse_raw.size());
    const CheckPlan plan = full_check_plan(shape);
    const ForwardReference ref = reference_forward(shape, in.q.data(), in.k.data(), in.v.data(), plan, f, &host);
    const CompareReport report = compare_forward(shape, dtype, o.download(), lse_host, plan, ref);
    EXPECT_TRUE(report.passed()) << c.name() << ", seed " << seed << "\n" << report.details();
    return;
  }
  BackwardProblem problem = make_backward_problem(shape, seed, dtype, 0, f);
  // The problem's O, LSE and gradients are those of the paper's slopes: redo them with the caller's.
  std::vector<float> q = problem.q, k = problem.k, v = problem.v, d_o = problem.d_o;
  const BackwardReference ref = reference_backward(shape, q.data(), k.data(), v.data(), d_o.data(), f, &host);
  std::vector<float> o(ref.o.begin(), ref.o.end()), lse(ref.lse.begin(), ref.lse.end());
  round_all(o, dtype);
  const DeviceBuffer dq_in = upload_as(dtype, q), dk_in = upload_as(dtype, k), dv_in = upload_as(dtype, v),
                     do_in = upload_as(dtype, d_o), o_in = upload_as(dtype, o);
  DeviceBuffer lse_in(lse.size() * sizeof(float));
  lse_in.upload(lse.data(), lse_in.bytes());
  DeviceBuffer dq(q.size() * dtype_size(dtype)), dk(k.size() * dtype_size(dtype)), dv(v.size() * dtype_size(dtype));
  dq.poison();
  dk.poison();
  dv.poison();
  DeviceBuffer work(c.backward->workspace_bytes ? c.backward->workspace_bytes(shape) : 0);
  BackwardParams p;
  p.shape = shape;
  p.q = dq_in.get();
  p.k = dk_in.get();
  p.v = dv_in.get();
  p.o = o_in.get();
  p.d_o = do_in.get();
  p.lse = lse_in.as<float>();
  p.dq = dq.get();
  p.dk = dk.get();
  p.dv = dv.get();
  p.workspace = work.get();
  p.features = f;
  p.extras = device;
  c.backward->launch(p);
  CUDA_CHECK(cudaDeviceSynchronize());
  const double limit = backward_tolerance(dtype);
  const struct {
    const char* name;
    const DeviceBuffer& got;
    const std::vector<double>& want;
  } grads[] = {{"dQ", dq, ref.dq}, {"dK", dk, ref.dk}, {"dV", dv, ref.dv}};
  for (const auto& g : grads) {
    const double rel = gradient_error(dtype, g.got.download(), g.want);
    EXPECT_LE(rel, limit) << c.name() << ": " << g.name << " relative error " << rel << ", seed " << seed;
  }
}

INSTANTIATE_TEST_SUITE_P(Features, CallerSlopesTest, ::testing::ValuesIn(slope_cases()),
                         [](const auto& info) { return info.param.name(); });

}  // namespace
}  // namespace fa
