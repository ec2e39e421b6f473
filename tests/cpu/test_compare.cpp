// The comparison must catch every way a kernel can be wrong; these tests feed it wrong outputs
// on purpose and check that each is caught and located.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "compare.h"
#include "tensor.h"

namespace fa {
namespace {

struct Fixture {
  AttentionShape shape;
  CheckPlan plan;
  ForwardReference ref;
  std::vector<float> o, lse;  // a correct output, converted from the oracle

  explicit Fixture(bool causal_with_empty_rows = false) {
    shape.batch = 2;
    shape.heads_q = 2;
    shape.heads_kv = 1;
    shape.seq_q = causal_with_empty_rows ? 9 : 5;
    shape.seq_kv = 6;
    shape.head_dim = 4;
    shape.causal = causal_with_empty_rows;
    HostInputs in = make_random_inputs(shape, std::random_device{}());
    plan = full_check_plan(shape);
    ref = reference_forward(shape, in.q.data(), in.k.data(), in.v.data(), plan);
    for (size_t e = 0; e < ref.o.size(); ++e) {
      for (double x : ref.o[e]) o.push_back(float(x));
      for (double x : ref.lse[e]) lse.push_back(float(x));
    }
  }

  std::vector<unsigned char> raw(DType dtype = DType::F32) const {
    std::vector<unsigned char> bytes(o.size() * dtype_size(dtype));
    encode_elements(dtype, o.data(), bytes.data(), o.size());
    return bytes;
  }
  CompareReport compare(DType dtype = DType::F32) const {
    return compare_forward(shape, dtype, raw(dtype), lse, plan, ref);
  }
};

TEST(Compare, CorrectOutputPasses) {
  Fixture f;
  CompareReport r = f.compare();
  EXPECT_TRUE(r.passed()) << r.details();
  EXPECT_EQ(r.checked, int64_t(f.o.size()));
  EXPECT_LT(r.rel_fro, 1e-7);
}

TEST(Compare, RoundedToHalfPassesHalfTolerance) {
  Fixture f;
  CompareReport r = f.compare(DType::F16);
  EXPECT_TRUE(r.passed()) << r.details();
  EXPECT_GT(r.max_abs, 0.0);
}

TEST(Compare, UnwrittenElementsAreCountedAndLocated) {
  Fixture f;
  auto bytes = f.raw();
  // batch 1, head 0, row 3, col 2 -> flat index ((1*2+0)*5+3)*4+2
  const size_t index = ((1 * 2 + 0) * 5 + 3) * 4 + 2;
  std::memset(bytes.data() + index * 4, kPoisonByte, 4);
  std::memset(bytes.data() + (index + 1) * 4, kPoisonByte, 4);
  CompareReport r = compare_forward(f.shape, DType::F32, bytes, f.lse, f.plan, f.ref);
  EXPECT_FALSE(r.passed());
  EXPECT_EQ(r.unwritten, 2);
  ASSERT_TRUE(r.has_first);
  EXPECT_EQ(r.first.batch, 1);
  EXPECT_EQ(r.first.head, 0);
  EXPECT_EQ(r.first.row, 3);
  EXPECT_EQ(r.first.col, 2);
  EXPECT_EQ(r.first.what, "never written");
  EXPECT_NE(r.details().find("O(batch=1, head=0, row=3, col=2)"), std::string::npos) << r.details();
}

TEST(Compare, NanAndSmallErrorsAreCaught) {
  Fixture f;
  f.o[7] = std::nanf("");
  EXPECT_EQ(f.compare().nonfinite, 1);
  Fixture g;
  g.o[11] += 1e-3f;  // over the fp32 max-abs limit
  CompareReport r = g.compare();
  EXPECT_FALSE(r.passed());
  EXPECT_EQ(r.over_tolerance, 1);
  EXPECT_NEAR(r.max_abs, 1e-3, 1e-6);
}

TEST(Compare, LseErrorsAreCaught) {
  Fixture f;
  f.lse[3] += 0.01f;
  CompareReport r = f.compare();
  EXPECT_FALSE(r.passed());
  EXPECT_EQ(r.lse_bad, 1);
  Fixture g;
  std::memset(&g.lse[0], kPoisonByte, sizeof(float));
  EXPECT_EQ(g.compare().lse_bad, 1);
  EXPECT_EQ(g.compare().first_lse.what, "never written");
}

TEST(Compare, EmptyRowsMustBeZeroWithMinusInfLse) {
  Fixture f(/*causal_with_empty_rows=*/true);  // seq_q 9 > seq_kv 6: rows 0..2 see no key
  EXPECT_TRUE(f.compare().passed()) << f.compare().details();
  ASSERT_TRUE(std::isinf(f.lse[0]));
  f.lse[0] = std::nanf("");
  CompareReport r = f.compare();
  EXPECT_FALSE(r.passed());
  EXPECT_EQ(r.first_lse.what, "should be -inf (row sees no key)");
}

}  // namespace
}  // namespace fa
