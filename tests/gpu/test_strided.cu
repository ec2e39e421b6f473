// The kernels that take strided tensors (ForwardKernel::strided, BackwardKernel::strided) on
// layouts other than the packed [batch, heads, seq, head_dim]: flash-attn's [batch, seq, heads,
// head_dim], Q, K and V as views of one [batch, seq, heads_q + 2 heads_kv, head_dim] projection,
// and tensors with gaps between heads, rows and batches. Fresh random inputs; the elements in
// the gaps of the inputs are NaN (a kernel that reads one spoils its output) and those of the
// outputs are poisoned and must stay so (a kernel that writes one fails); the outputs are
// compared with the fp64 oracle (with chapter 09's features, for a strided kernel that takes
// them). Without a GPU each test reports SKIPPED with the reason.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attention_features.h"
#include "backward_runner.h"
#include "compare.h"
#include "cuda_check.h"
#include "feature_inputs.h"
#include "reference.h"
#include "registry.h"
#include "strides.h"
#include "tensor.h"
#include "../test_shapes.h"

namespace fa {
namespace {

enum class Layout { Bshd, Qkv, Gaps };
const char* layout_name(Layout l) { return l == Layout::Bshd ? "bshd" : l == Layout::Qkv ? "qkv" : "gaps"; }

/// One tensor of `heads` heads of `rows` rows in a buffer of `elements` elements, from `offset`.
struct Placement {
  TensorStrides strides;
  int64_t offset = 0, elements = 0;
};

/// Where tensor `which` (0 q, 1 k, 2 v, 3 an output like q or k) goes in `layout`. In Qkv the
/// inputs are the three slices of one projection row of heads_q + 2 heads_kv heads (as separate
/// buffers with the same strides and offsets).
Placement place(Layout layout, const AttentionShape& s, int which, bool kv, int d) {
  const int heads = kv ? s.heads_kv : s.heads_q, rows = kv ? s.seq_kv : s.seq_q;
  Placement p;
  switch (layout) {
    case Layout::Bshd: p.strides = {int64_t(rows) * heads * d, d, int64_t(heads) * d}; break;
    case Layout::Qkv: {
      if (which == 3) return place(Layout::Bshd, s, which, kv, d);
      const int total = s.heads_q + 2 * s.heads_kv;
      p.strides = {int64_t(rows) * total * d, d, int64_t(total) * d};
      p.offset = which == 0 ? 0 : which == 1 ? int64_t(s.heads_q) * d : int64_t(s.heads_q + s.heads_kv) * d;
      p.elements = int64_t(s.batch) * p.strides.batch;
      return p;
    }
    case Layout::Gaps:
      p.strides.head = d + 8;
      p.strides.row = int64_t(heads) * (d + 8) + 8;
      p.strides.batch = int64_t(rows) * p.strides.row + 16;
      p.offset = 8;
      break;
  }
  p.elements = p.offset + int64_t(s.batch) * p.strides.batch;
  return p;
}

/// Packed [batch, heads, rows, d] floats into a buffer laid out as `p`, the rest `fill`.
std::vector<float> scatter(const std::vector<float>& packed, const Placement& p, int batch, int heads, int rows, int d,
                           float fill) {
  std::vector<float> out(std::size_t(p.elements), fill);
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h)
      for (int r = 0; r < rows; ++r)
        for (int x = 0; x < d; ++x)
          out[std::size_t(p.offset + b * p.strides.batch + h * p.strides.head + r * p.strides.row + x)] =
              packed[((std::size_t(b) * heads + h) * rows + r) * d + x];
  return out;
}

/// The tensor's elements back in packed order, as raw 16-bit elements of `dtype`, and how many
/// elements outside the tensor are no longer poison.
struct Gathered {
  std::vector<unsigned char> packed;
  int64_t touched_outside = 0;
};
Gathered gather(DType dtype, const DeviceBuffer& buffer, const Placement& p, int batch, int heads, int rows, int d) {
  const std::vector<unsigned char> raw = buffer.download();
  const uint16_t* elements = reinterpret_cast<const uint16_t*>(raw.data());
  std::vector<char> inside(std::size_t(p.elements), 0);
  Gathered g;
  g.packed.resize(std::size_t(batch) * heads * rows * d * 2);
  uint16_t* out = reinterpret_cast<uint16_t*>(g.packed.data());
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h)
      for (int r = 0; r < rows; ++r)
        for (int x = 0; x < d; ++x) {
          const std::size_t at =
              std::size_t(p.offset + b * p.strides.batch + h * p.strides.head + r * p.strides.row + x);
          inside[at] = 1;
          out[((std::size_t(b) * heads + h) * rows + r) * d + x] = elements[at];
        }
  for (std::size_t i = 0; i < inside.size(); ++i)
    if (!inside[i] && !is_poison(dtype, raw.data(), i)) ++g.touched_outside;
  return g;
}

DeviceBuffer upload_placed(DType dtype, const std::vector<float>& packed, const Placement& p, int batch, int heads,
                           int rows, int d) {
  return upload_as(dtype, scatter(packed, p, batch, heads, rows, d, std::numeric_limits<float>::quiet_NaN()));
}

DeviceBuffer poisoned(const Placement& p) {
  DeviceBuffer b(std::size_t(p.elements) * 2);
  b.poison();
  return b;
}

const std::vector<AttentionShape>& strided_shapes() {
  static const std::vector<AttentionShape> shapes = {
      shape_of(2, 4, 4, 200, 200, 64, true),  shape_of(1, 4, 2, 257, 257, 128, false),
      shape_of(2, 8, 2, 130, 130, 64, false), shape_of(1, 2, 1, 100, 300, 128, true),
      shape_of(1, 2, 2, 300, 100, 64, true),  shape_of(3, 2, 2, 65, 65, 96, true),
      shape_of(1, 2, 2, 200, 200, 256, true)};
  return shapes;
}

template <class Kernel>
struct StridedCase {
  const Kernel* kernel;
  AttentionShape shape;
  Layout layout;
};
template <class Kernel>
void PrintTo(const StridedCase<Kernel>& c, std::ostream* out) {
  *out << c.kernel->name << " on " << c.shape.to_string() << " " << layout_name(c.layout);
}

template <class Kernel>
std::vector<StridedCase<Kernel>> strided_cases(const std::vector<Kernel>& kernels) {
  std::vector<StridedCase<Kernel>> cases;
  for (const Kernel& k : kernels) {
    if (!k.strided) continue;
    for (const AttentionShape& s : strided_shapes())
      for (Layout l : {Layout::Bshd, Layout::Qkv, Layout::Gaps})
        if (l != Layout::Qkv || s.seq_q == s.seq_kv) cases.push_back({&k, s, l});
  }
  return cases;
}

template <class Case>
std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return info.param.kernel->name + "__" + info.param.shape.to_identifier() + "_" + layout_name(info.param.layout);
}

/// One strided forward launch: fresh random inputs placed in `in_layout` (NaN in the gaps), O in
/// `out_layout` (poisoned), the kernel launched with `f` and its inputs; then O must stay in its
/// rows and match the fp64 oracle (with the features) on every row.
void check_strided_forward(const ForwardKernel& kernel, const AttentionShape& s, Layout in_layout, Layout out_layout,
                           const AttentionFeatures& f = {}) {
  const uint64_t seed = fresh_seed();
  const DType dtype = kernel.dtype;  // bf16 or fp16: 2 bytes an element either way
  const HostInputs in = round_inputs(make_random_inputs(s, seed), dtype);
  const Packing packing = f.varlen() ? random_packing(s, f, seed) : Packing{};
  const DeviceExtras extras(f, {}, packing);
  const int d = s.head_dim;
  const Placement pq = place(in_layout, s, 0, false, d), pk = place(in_layout, s, 1, true, d),
                  pv = place(in_layout, s, 2, true, d), po = place(out_layout, s, 3, false, d);
  const DeviceBuffer q = upload_placed(dtype, in.q, pq, s.batch, s.heads_q, s.seq_q, d);
  const DeviceBuffer k = upload_placed(dtype, in.k, pk, s.batch, s.heads_kv, s.seq_kv, d);
  const DeviceBuffer v = upload_placed(dtype, in.v, pv, s.batch, s.heads_kv, s.seq_kv, d);
  const DeviceBuffer o = poisoned(po);
  DeviceBuffer lse(std::size_t(s.lse_elems()) * sizeof(float));
  lse.poison();
  DeviceBuffer work(kernel.workspace_bytes ? kernel.workspace_bytes(s) : 0);
  const ForwardStrides strides{pq.strides, pk.strides, pv.strides, po.strides};
  ASSERT_EQ(strides_reason(strides), "");
  ForwardParams p;
  p.shape = s;
  p.q = q.as<uint16_t>() + pq.offset;
  p.k = k.as<uint16_t>() + pk.offset;
  p.v = v.as<uint16_t>() + pv.offset;
  p.o = o.as<uint16_t>() + po.offset;
  p.lse = lse.as<float>();
  p.workspace = work.get();
  p.strides = &strides;
  p.features = f;
  p.extras = extras.extras;
  kernel.launch(p);
  CUDA_CHECK(cudaDeviceSynchronize());

  const std::string what =
      kernel.name + " on " + describe(s, f) + " " + layout_name(in_layout) + ", seed " + std::to_string(seed);
  const Gathered out = gather(dtype, o, po, s.batch, s.heads_q, s.seq_q, d);
  EXPECT_EQ(out.touched_outside, 0) << what << ": wrote " << out.touched_outside << " elements outside O's rows";
  const std::vector<unsigned char> lse_raw = lse.download();
  std::vector<float> lse_host(std::size_t(s.lse_elems()));
  std::memcpy(lse_host.data(), lse_raw.data(), lse_raw.size());
  const CheckPlan plan = full_check_plan(s);
  const AttentionExtras host = host_extras_of(f, {}, packing);
  const ForwardReference ref = reference_forward(s, in.q.data(), in.k.data(), in.v.data(), plan, f, &host);
  const CompareReport report = compare_forward(s, dtype, out.packed, lse_host, plan, ref);
  EXPECT_TRUE(report.passed()) << what << ":\n" << report.details();
}

using ForwardCase = StridedCase<ForwardKernel>;
class StridedForwardTest : public ::testing::TestWithParam<ForwardCase> {};

TEST_P(StridedForwardTest, MatchesOracleAndStaysInItsRows) {
  const ForwardCase& c = GetParam();
  const GpuInfo& gpu = detect_gpu();
  if (!gpu.available) GTEST_SKIP() << "no GPU: " << gpu.reason;
  if (std::string why = support_reason(*c.kernel, c.shape); !why.empty())
    GTEST_SKIP() << c.kernel->name << " does not support " << c.shape.to_string() << ": " << why;
  check_strided_forward(*c.kernel, c.shape, c.layout, c.layout);
}

INSTANTIATE_TEST_SUITE_P(All, StridedForwardTest, ::testing::ValuesIn(strided_cases(forward_kernels())),
                         case_name<ForwardCase>);

/// The problems a strided kernel that takes chapter 09's features is checked on: a packed batch in
/// flash-attn's varlen layout ([total, heads, head_dim]: the Bshd placement with a batch of one)
/// with a window, softcap and ALiBi, and a dense batch of views of one projection with the same.
struct FeatureCase {
  AttentionShape shape;
  AttentionFeatures features;
  Layout layout;
};
std::vector<FeatureCase> strided_feature_cases() {
  std::vector<FeatureCase> cases;
  for (const bool packed : {true, false}) {
    FeatureCase c{packed ? shape_of(1, 4, 2, 517, 517, 128, true) : shape_of(2, 4, 2, 300, 300, 64, true),
                  {},
                  packed ? Layout::Bshd : Layout::Qkv};
    c.features.window_left = 100;
    c.features.window_right = 0;
    c.features.softcap = 30.0;
    c.features.alibi = true;
    if (packed) c.features.sequences = 5;
    cases.push_back(c);
  }
  return cases;
}

class StridedFeaturesTest : public ::testing::TestWithParam<const ForwardKernel*> {};

TEST_P(StridedFeaturesTest, MatchesTheFeatureOracleAndStaysInItsRows) {
  const ForwardKernel& kernel = *GetParam();
  const GpuInfo& gpu = detect_gpu();
  if (!gpu.available) GTEST_SKIP() << "no GPU: " << gpu.reason;
  for (const FeatureCase& c : strided_feature_cases()) {
    if (std::string why = support_reason(kernel, c.shape, c.features); !why.empty())
      GTEST_SKIP() << kernel.name << " does not take " << describe(c.shape, c.features) << ": " << why;
    check_strided_forward(kernel, c.shape, c.layout, Layout::Gaps, c.features);
  }
}

std::vector<const ForwardKernel*> strided_feature_kernels() {
  std::vector<const ForwardKernel*> out;
  for (const ForwardKernel& k : forward_kernels())
    if (k.strided && (k.features & kFeatureVarlen)) out.push_back(&k);
  return out;
}

INSTANTIATE_TEST_SUITE_P(All, StridedFeaturesTest, ::testing::ValuesIn(strided_feature_kernels()),
                         [](const ::testing::TestParamInfo<const ForwardKernel*>& info) { return info.param->name; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(StridedFeaturesTest);

/// One strided backward launch: fresh random inputs (and O, LSE from the oracle) placed in
/// `layout` (NaN in the gaps), the gradients in layouts of their own (poisoned); then each
/// gradient must stay in its rows and match the fp64 oracle (with the features).
void check_strided_backward(const BackwardKernel& kernel, const AttentionShape& s, Layout layout,
                            const AttentionFeatures& f = {}) {
  const uint64_t seed = fresh_seed();
  const DType dtype = kernel.dtype;
  const BackwardProblem problem = make_backward_problem(s, seed, dtype, 0, f);
  const DeviceExtras extras(f, problem.bias, problem.packing);
  const int d = s.head_dim;
  // Inputs in the case's layout; O and dO like Q's output (flash-attn's), the gradients like
  // the inputs they belong to but in a layout of their own (gaps), so nothing assumes they match.
  const Placement pq = place(layout, s, 0, false, d), pk = place(layout, s, 1, true, d),
                  pv = place(layout, s, 2, true, d), po = place(layout, s, 3, false, d);
  const Placement pdq = place(Layout::Gaps, s, 3, false, d), pdk = place(Layout::Gaps, s, 3, true, d),
                  pdv = place(Layout::Bshd, s, 3, true, d);
  const DeviceBuffer q = upload_placed(dtype, problem.q, pq, s.batch, s.heads_q, s.seq_q, d);
  const DeviceBuffer k = upload_placed(dtype, problem.k, pk, s.batch, s.heads_kv, s.seq_kv, d);
  const DeviceBuffer v = upload_placed(dtype, problem.v, pv, s.batch, s.heads_kv, s.seq_kv, d);
  const DeviceBuffer o = upload_placed(dtype, problem.o, po, s.batch, s.heads_q, s.seq_q, d);
  const DeviceBuffer d_o = upload_placed(dtype, problem.d_o, po, s.batch, s.heads_q, s.seq_q, d);
  DeviceBuffer lse(std::size_t(s.lse_elems()) * sizeof(float));
  lse.upload(problem.lse.data(), lse.bytes());
  const DeviceBuffer dq = poisoned(pdq), dk = poisoned(pdk), dv = poisoned(pdv);
  DeviceBuffer work(kernel.workspace_bytes ? kernel.workspace_bytes(s) : 0);
  const BackwardStrides strides{pq.strides, pk.strides,  pv.strides,  po.strides,
                                po.strides, pdq.strides, pdk.strides, pdv.strides};
  ASSERT_EQ(strides_reason(strides), "");
  BackwardParams p;
  p.shape = s;
  p.q = q.as<uint16_t>() + pq.offset;
  p.k = k.as<uint16_t>() + pk.offset;
  p.v = v.as<uint16_t>() + pv.offset;
  p.o = o.as<uint16_t>() + po.offset;
  p.d_o = d_o.as<uint16_t>() + po.offset;
  p.lse = lse.as<float>();
  p.dq = dq.as<uint16_t>() + pdq.offset;
  p.dk = dk.as<uint16_t>() + pdk.offset;
  p.dv = dv.as<uint16_t>() + pdv.offset;
  p.workspace = work.get();
  p.strides = &strides;
  p.features = f;
  p.extras = extras.extras;
  kernel.launch(p);
  CUDA_CHECK(cudaDeviceSynchronize());

  const double limit = backward_tolerance(dtype);
  const struct {
    const char* name;
    const DeviceBuffer& buffer;
    const Placement& place;
    bool kv;
    const std::vector<double>& ref;
  } grads[] = {{"dQ", dq, pdq, false, problem.ref.dq},
               {"dK", dk, pdk, true, problem.ref.dk},
               {"dV", dv, pdv, true, problem.ref.dv}};
  for (const auto& g : grads) {
    const Gathered out =
        gather(dtype, g.buffer, g.place, s.batch, g.kv ? s.heads_kv : s.heads_q, g.kv ? s.seq_kv : s.seq_q, d);
    EXPECT_EQ(out.touched_outside, 0) << kernel.name << " wrote " << out.touched_outside << " elements outside "
                                      << g.name << "'s rows (" << layout_name(layout) << ")";
    const double rel = gradient_error(dtype, out.packed, g.ref);
    EXPECT_LE(rel, limit) << kernel.name << " on " << describe(s, f) << " " << layout_name(layout) << ": " << g.name
                          << " relative error " << rel << ", seed " << seed;
  }
}

using BackwardCase = StridedCase<BackwardKernel>;
class StridedBackwardTest : public ::testing::TestWithParam<BackwardCase> {};

TEST_P(StridedBackwardTest, MatchesOracleAndStaysInItsRows) {
  const BackwardCase& c = GetParam();
  const GpuInfo& gpu = detect_gpu();
  if (!gpu.available) GTEST_SKIP() << "no GPU: " << gpu.reason;
  if (std::string why = support_reason(*c.kernel, c.shape); !why.empty())
    GTEST_SKIP() << c.kernel->name << " does not support " << c.shape.to_string() << ": " << why;
  check_strided_backward(*c.kernel, c.shape, c.layout);
}

INSTANTIATE_TEST_SUITE_P(All, StridedBackwardTest, ::testing::ValuesIn(strided_cases(backward_kernels())),
                         case_name<BackwardCase>);

/// A strided backward kernel that takes chapter 09's features, on StridedFeaturesTest's problems.
class StridedFeaturesBackwardTest : public ::testing::TestWithParam<const BackwardKernel*> {};

TEST_P(StridedFeaturesBackwardTest, MatchesTheFeatureOracleAndStaysInItsRows) {
  const BackwardKernel& kernel = *GetParam();
  const GpuInfo& gpu = detect_gpu();
  if (!gpu.available) GTEST_SKIP() << "no GPU: " << gpu.reason;
  for (const FeatureCase& c : strided_feature_cases()) {
    if (std::string why = support_reason(kernel, c.shape, c.features); !why.empty())
      GTEST_SKIP() << kernel.name << " does not take " << describe(c.shape, c.features) << ": " << why;
    check_strided_backward(kernel, c.shape, c.layout, c.features);
  }
}

std::vector<const BackwardKernel*> strided_feature_backward_kernels() {
  std::vector<const BackwardKernel*> out;
  for (const BackwardKernel& k : backward_kernels())
    if (k.strided && (k.features & kFeatureVarlen)) out.push_back(&k);
  return out;
}

INSTANTIATE_TEST_SUITE_P(All, StridedFeaturesBackwardTest, ::testing::ValuesIn(strided_feature_backward_kernels()),
                         [](const ::testing::TestParamInfo<const BackwardKernel*>& info) { return info.param->name; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(StridedFeaturesBackwardTest);

TEST(Strides, ReasonNamesTheStride) {
  ForwardStrides s = ForwardStrides::packed(shape_of(1, 2, 2, 64, 64, 64, false));
  EXPECT_EQ(strides_reason(s), "");
  s.k.row = 100;
  EXPECT_EQ(strides_reason(s), "k's row stride must be a non-negative multiple of 8 elements, got 100");
  BackwardStrides b = BackwardStrides::packed(shape_of(1, 2, 2, 64, 64, 64, false));
  b.dv.batch = -8;
  EXPECT_EQ(strides_reason(b), "dv's batch stride must be a non-negative multiple of 8 elements, got -8");
}

}  // namespace
}  // namespace fa
