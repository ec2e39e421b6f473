// Chapter 06's FP8 kernels on the FlashAttention-3 paper's outlier experiment, beside the CPU
// model of the same recipe (chapters/06_flash_attention_v3/algorithm.h): RMSE of O against the
// fp64 oracle with incoherent processing (ch06_fp8) and without (ch06_fp8_plain).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "../../chapters/06_flash_attention_v3/algorithm.h"
#include "../../chapters/06_flash_attention_v3/flash_attention_v3.h"
#include "compare.h"
#include "cuda_check.h"
#include "dtype.h"
#include "reference.h"
#include "registry.h"
#include "runner.h"
#include "../test_shapes.h"

namespace fa {
namespace {

const ForwardKernel* find_kernel(const std::string& name) {
  for (const ForwardKernel& k : forward_kernels())
    if (k.name == name) return &k;
  return nullptr;
}

double rmse(const AttentionShape& s, const std::vector<float>& o, const CheckPlan& plan, const ForwardReference& ref) {
  double sum = 0;
  int64_t count = 0;
  for (std::size_t e = 0; e < plan.heads.size(); ++e) {
    const int bh = plan.heads[e].batch * s.heads_q + plan.heads[e].head;
    for (std::size_t r = 0; r < plan.heads[e].rows.size(); ++r)
      for (int x = 0; x < s.head_dim; ++x) {
        const double diff =
            o[s.q_head_offset(bh) + int64_t(plan.heads[e].rows[r]) * s.head_dim + x] - ref.o[e][r * s.head_dim + x];
        sum += diff * diff;
        ++count;
      }
  }
  return std::sqrt(sum / double(count));
}

std::vector<float> run_on_gpu(const ForwardKernel& k, const AttentionShape& s, const std::vector<float>& q,
                              const std::vector<float>& kk, const std::vector<float>& v) {
  std::vector<float> o, lse;
  launch_forward_on(k, s, q, kk, v, o, lse);
  return o;
}

TEST(Fp8OnTheGpu, IncoherentProcessingOnOutliers) {
  const GpuInfo& gpu = detect_gpu();
  if (!gpu.available) GTEST_SKIP() << "no GPU: " << gpu.reason;
  const ForwardKernel* rotated = find_kernel("ch06_fp8");
  const ForwardKernel* plain = find_kernel("ch06_fp8_plain");
  ASSERT_TRUE(rotated && plain) << "chapter 06's FP8 kernels are not registered";
  const AttentionShape s = shape_of(1, 4, 4, 512, 512, 128, false);
  const std::string why = rotated->supports(s);
  if (!why.empty()) GTEST_SKIP() << why;

  const uint64_t seed = fresh_seed();
  std::vector<float> q = with_outliers(s.q_elems(), seed, 0), k = with_outliers(s.kv_elems(), seed, 1),
                     v = with_outliers(s.kv_elems(), seed, 2);
  for (auto* x : {&q, &k, &v})
    for (float& e : *x) e = round_to_dtype(e, DType::BF16);  // the oracle sees exactly the kernel's inputs
  const CheckPlan plan = full_check_plan(s);
  const ForwardReference ref = reference_forward(s, q.data(), k.data(), v.data(), plan);

  const double gpu_rotated = rmse(s, run_on_gpu(*rotated, s, q, k, v), plan, ref);
  const double gpu_plain = rmse(s, run_on_gpu(*plain, s, q, k, v), plan, ref);
  std::vector<float> o(s.o_elems()), lse(s.lse_elems());
  flash3::fp8_attention_cpu(s, q.data(), k.data(), v.data(), o.data(), lse.data(),
                            flash3::Fp8Recipe{128, 128, true, true});
  const double cpu_rotated = rmse(s, o, plan, ref);
  flash3::fp8_attention_cpu(s, q.data(), k.data(), v.data(), o.data(), lse.data(),
                            flash3::Fp8Recipe{128, 128, false, true});
  const double cpu_plain = rmse(s, o, plan, ref);
  std::printf(
      "FP8 RMSE vs fp64 on inputs with 0.1%% outliers (%s, seed %llu):\n"
      "                        GPU kernel   CPU model\n"
      "  block scales          %.2e     %.2e\n"
      "  + incoherent          %.2e     %.2e\n",
      s.to_string().c_str(), (unsigned long long)seed, gpu_plain, cpu_plain, gpu_rotated, cpu_rotated);
  EXPECT_LT(gpu_rotated, gpu_plain) << "incoherent processing must lower the error on outliers; seed " << seed;
  EXPECT_LT(gpu_rotated, 1.5 * cpu_rotated) << "the kernel strays from its CPU model; seed " << seed;
  EXPECT_GT(gpu_rotated, cpu_rotated / 1.5) << "the kernel strays from its CPU model; seed " << seed;
}

// O is kept in units of the largest V block scale, and an all-zero V block has scale 0 (its P
// then takes the factor r = 1: its P V is 0 whatever P is, and P must still count in l). One zero block among random ones must not
// disturb the others (error within 1.5x of the CPU model's), and an all-zero V must give O = 0
// exactly with the oracle's LSE.
TEST(Fp8OnTheGpu, ZeroValueBlocks) {
  const GpuInfo& gpu = detect_gpu();
  if (!gpu.available) GTEST_SKIP() << "no GPU: " << gpu.reason;
  const ForwardKernel* kernel = find_kernel("ch06_fp8");
  ASSERT_TRUE(kernel) << "chapter 06's FP8 kernel is not registered";
  const AttentionShape s = shape_of(1, 2, 2, 300, 300, 128, false);  // K/V blocks of 128, 128 and 44 keys
  const std::string why = kernel->supports(s);
  if (!why.empty()) GTEST_SKIP() << why;

  const uint64_t seed = fresh_seed();
  std::vector<float> q(s.q_elems()), k(s.kv_elems()), v(s.kv_elems());
  for (int64_t i = 0; i < s.q_elems(); ++i) q[i] = round_to_dtype(random_normal(seed, 0, i), DType::BF16);
  for (int64_t i = 0; i < s.kv_elems(); ++i) {
    k[i] = round_to_dtype(random_normal(seed, 1, i), DType::BF16);
    const int64_t key = (i / s.head_dim) % s.seq_kv;
    v[i] = key >= 128 && key < 256 ? 0.0f : round_to_dtype(random_normal(seed, 2, i), DType::BF16);
  }
  const CheckPlan plan = full_check_plan(s);
  const ForwardReference ref = reference_forward(s, q.data(), k.data(), v.data(), plan);
  const double gpu_rmse = rmse(s, run_on_gpu(*kernel, s, q, k, v), plan, ref);
  std::vector<float> o(s.o_elems()), lse(s.lse_elems());
  flash3::fp8_attention_cpu(s, q.data(), k.data(), v.data(), o.data(), lse.data(), flash3::Fp8Recipe{});
  const double cpu = rmse(s, o, plan, ref);
  std::printf("FP8 RMSE with V's keys 128..255 all zero (%s, seed %llu): GPU %.2e, CPU model %.2e\n",
              s.to_string().c_str(), (unsigned long long)seed, gpu_rmse, cpu);
  EXPECT_LT(gpu_rmse, 1.5 * cpu) << "seed " << seed;

  std::fill(v.begin(), v.end(), 0.0f);
  const ForwardReference zero_ref = reference_forward(s, q.data(), k.data(), v.data(), plan);
  std::vector<float> out, out_lse;
  launch_forward_on(*kernel, s, q, k, v, out, out_lse);
  int nonzero = 0;
  for (float x : out) nonzero += x != 0.0f;
  EXPECT_EQ(nonzero, 0) << "V is all zero, so O must be exactly 0; seed " << seed;
  double lse_err = 0.0;
  for (std::size_t e = 0; e < plan.heads.size(); ++e) {
    const int bh = plan.heads[e].batch * s.heads_q + plan.heads[e].head;
    for (std::size_t r = 0; r < plan.heads[e].rows.size(); ++r)
      lse_err =
          std::max(lse_err, std::fabs(out_lse[int64_t(bh) * s.seq_q + plan.heads[e].rows[r]] - zero_ref.lse[e][r]));
  }
  EXPECT_LT(lse_err, fp8_tolerance().lse_abs) << "seed " << seed;
}

// Variant 5 keeps a row's running max until a tile passes it by more than 0.75 (log2 units),
// then rescales O, l and P to the new max. Planted scores make every row's max jump at two key
// tiles: by tens at keys 256..383 and by more than 100 at keys 384.. (O's earlier part then
// shrinks by 2^-100 and below). Q rows get 30 in dimension 0 and K rows c = 0, 10 or 50 there (by
// key tile), so the scores of a tile rise by 30 c / sqrt(d) together and the softmax inside it
// stays well posed. 320 rows and 500 keys put a partial Q block and a partial last tile (the
// masked paths) in the run. The host checks that the inputs jump that far; the kernel must stay
// within 1.5x of its CPU model's error.
TEST(Fp8OnTheGpu, RowMaxJumps) {
  const GpuInfo& gpu = detect_gpu();
  if (!gpu.available) GTEST_SKIP() << "no GPU: " << gpu.reason;
  const ForwardKernel* kernel = find_kernel("ch06_fp8");
  ASSERT_TRUE(kernel) << "chapter 06's FP8 kernel is not registered";
  for (int d : {64, 128, 256}) {
    const AttentionShape s = shape_of(1, 2, 2, 320, 500, d, false);
    const std::string why = kernel->supports(s);
    if (!why.empty()) GTEST_SKIP() << why;
    const uint64_t seed = fresh_seed();
    std::vector<float> q(s.q_elems()), k(s.kv_elems()), v(s.kv_elems());
    for (int64_t i = 0; i < s.q_elems(); ++i)
      q[i] = round_to_dtype(i % d == 0 ? 30.0f : random_normal(seed, 0, i), DType::BF16);
    for (int64_t i = 0; i < s.kv_elems(); ++i) {
      const int64_t key = (i / d) % s.seq_kv;
      const float c = key < 256 ? 0.0f : key < 384 ? 10.0f : 50.0f;
      k[i] = round_to_dtype(i % d == 0 ? c : random_normal(seed, 1, i), DType::BF16);
      v[i] = round_to_dtype(random_normal(seed, 2, i), DType::BF16);
    }
    // Each row's running max (log2 units) before and after tiles 2 and 3.
    double least_rise[4] = {INFINITY, INFINITY, INFINITY, INFINITY},
           most_rise[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    for (int bh = 0; bh < s.heads_q; ++bh)
      for (int r = 0; r < s.seq_q; ++r) {
        double running = -INFINITY;
        for (int tile = 0; tile < 4; ++tile) {
          double tile_max = -INFINITY;
          for (int key = 128 * tile; key < std::min(128 * (tile + 1), s.seq_kv); ++key) {
            double dot = 0.0;
            for (int x = 0; x < d; ++x)
              dot +=
                  double(q[s.q_head_offset(bh) + int64_t(r) * d + x]) * k[s.kv_head_offset(bh) + int64_t(key) * d + x];
            tile_max = std::max(tile_max, dot * s.softmax_scale() * 1.4426950408889634);
          }
          if (tile > 0) {
            least_rise[tile] = std::min(least_rise[tile], tile_max - running);
            most_rise[tile] = std::max(most_rise[tile], tile_max - running);
          }
          running = std::max(running, tile_max);
        }
      }
    ASSERT_TRUE(least_rise[2] > 4.0 && most_rise[2] < 80.0)
        << "the planted scores must rise by tens at tile 2 (d " << d << ")";
    ASSERT_GT(least_rise[3], 100.0) << "the planted scores must rise past 2^100 at tile 3 (d " << d << ")";

    const CheckPlan plan = full_check_plan(s);
    const ForwardReference ref = reference_forward(s, q.data(), k.data(), v.data(), plan);
    const std::vector<float> out = run_on_gpu(*kernel, s, q, k, v);
    const double gpu_rmse = rmse(s, out, plan, ref);
    std::vector<float> o(s.o_elems()), lse(s.lse_elems());
    flash3::fp8_attention_cpu(s, q.data(), k.data(), v.data(), o.data(), lse.data(), flash3::Fp8Recipe{});
    const double cpu = rmse(s, o, plan, ref);
    std::printf(
        "FP8 RMSE with row maxes jumping by >= %.0f and >= %.0f (log2) at key tiles 2 and 3 (%s, seed %llu): "
        "GPU %.2e, CPU model %.2e\n",
        least_rise[2], least_rise[3], s.to_string().c_str(), (unsigned long long)seed, gpu_rmse, cpu);
    EXPECT_LT(gpu_rmse, 1.5 * cpu) << "d " << d << ", seed " << seed;
  }
}

// Variant 5's split tail: without the causal mask, the last wave's blocks run as 2, 3 or 4
// pieces that each take a share of the K/V tiles, and the last piece to finish merges them
// (merge_pieces). The shapes are built from this GPU's block slots so that all three piece
// counts occur, once also after a full wave (slots + slots / 2 blocks); 8269 keys (65 tiles: a
// quarter is 16, the least a piece takes) put a partial tile in the last piece. Each runs
// against the fp64 oracle (O and LSE), with fresh inputs and poisoned outputs, and the 3-piece
// one twice for bitwise-identical results (the merge must not depend on which piece finishes
// last).
TEST(Fp8OnTheGpu, SplitTailMatchesOracle) {
  SKIP_WITHOUT_GPU();
  const ForwardKernel* kernel = find_kernel("ch06_fp8");
  ASSERT_TRUE(kernel) << "chapter 06's FP8 kernel is not registered";
  for (int d : {128, 64, 256}) {
    const int rows = d == 128 ? 192 : 128;  // one Q block per plane (three or two 64-row consumers)
    const AttentionShape probe = shape_of(1, 1, 1, rows, 8269, d, false);
    const std::string why = kernel->supports(probe);
    if (!why.empty()) GTEST_SKIP() << why;
    const int slots = flash3::fp8_tail_split(probe).slots;
    ASSERT_GE(slots, 8) << "block slots on this GPU at head_dim " << d;
    std::set<int> seen;
    for (int planes : {slots / 4, slots / 3, slots / 2, slots + slots / 2}) {
      const AttentionShape s = shape_of(1, planes, 1, rows, 8269, d, false);
      const flash3::Fp8TailSplit split = flash3::fp8_tail_split(s);
      ASSERT_EQ(split.blocks, planes) << s.to_string();
      seen.insert(split.pieces);
      const uint64_t seed = fresh_seed();
      Problem problem(s, seed);
      RunOptions options;
      options.iters = 0;
      const RunResult r = run_forward(*kernel, problem, options);
      ASSERT_TRUE(r.ran && r.error.empty()) << r.skipped << r.error;
      EXPECT_TRUE(r.report.passed()) << s.to_string() << " in " << split.tail << " x " << split.pieces
                                     << " pieces, seed " << seed << "\n"
                                     << r.report.details();
      if (split.pieces == 3)
        EXPECT_TRUE(output_bytes(*kernel, problem) == output_bytes(*kernel, problem))
            << "3 pieces gave different bits on identical inputs, " << s.to_string();
    }
    EXPECT_EQ(seen, (std::set<int>{2, 3, 4})) << "head_dim " << d << ", " << slots << " block slots";
  }
}

}  // namespace
}  // namespace fa
