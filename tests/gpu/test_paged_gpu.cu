// Chapter 08 on the GPU: the cache-write and copy-on-write kernels against the same steps on
// the CPU (bit for bit), every registered decode kernel against the fp64 oracle on tables
// built by the block manager (shared prompts, copy-on-write, shuffled physical blocks, empty
// and one-token contexts, block sizes below and above the kernels' 16-key chunk, GQA, MQA,
// prefill chunks), each decode kernel's reported peak device memory against the bytes its shape
// needs, and the paged prefill check: attention over the paged cache equals chapter 05's
// attention over the same K/V stored contiguously. Without a GPU each test reports SKIPPED with
// the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "../../chapters/08_paged_attention/algorithm.h"
#include "../../chapters/08_paged_attention/block_manager.h"
#include "../../chapters/08_paged_attention/decode_runner.h"
#include "../../chapters/08_paged_attention/paged_kernels.h"
#include "cuda_check.h"
#include "random.h"
#include "registry.h"
#include "runner.h"
#include "../test_shapes.h"

namespace fa {
namespace {

struct DecodeCase {
  const DecodeKernel* kernel;
  std::string name;
  DecodeSpec spec;
};

void PrintTo(const DecodeCase& c, std::ostream* out) { *out << c.kernel->name << " on " << c.name; }

DecodeSpec spec_of(int heads_q, int heads_kv, int d, int block_size, std::vector<int> contexts, int samples = 1,
                   int shared_prompt = 0, int query_len = 1) {
  DecodeSpec s;
  s.heads_q = heads_q;
  s.heads_kv = heads_kv;
  s.head_dim = d;
  s.block_size = block_size;
  s.contexts = std::move(contexts);
  s.samples = samples;
  s.shared_prompt = shared_prompt;
  s.query_len = query_len;
  return s;
}

std::vector<DecodeCase> decode_cases() {
  // Lengths around the 16-key chunk, the 64-key partition unit and the block size; a context
  // of 0 (O = 0, LSE = -inf) and of 1.
  const std::vector<int> mixed = {0, 1, 15, 16, 17, 63, 65, 100, 300, 1000, 1537};
  const std::vector<std::pair<std::string, DecodeSpec>> specs = {
      {"gqa4_d128_bs16", spec_of(8, 2, 128, 16, mixed)},
      {"gqa4_d64_bs16", spec_of(8, 2, 64, 16, mixed)},
      {"mha_d64_bs8", spec_of(4, 4, 64, 8, mixed)},
      {"mqa32_d128_bs32", spec_of(32, 1, 128, 32, {5, 200, 2049})},  // 32 query heads of one K/V head: 2 row tiles
      {"gqa8_d128_bs1", spec_of(16, 2, 128, 1, {33, 130})},
      {"shared_prompts_d128_bs16", spec_of(8, 2, 128, 16, {90, 91, 150, 77, 700, 701, 702, 1200}, 4, 73)},
      {"long_d128_bs16", spec_of(8, 2, 128, 16, {20000, 3})},
      {"prefill5_d128_bs16", spec_of(8, 2, 128, 16, {3, 5, 40, 333}, 1, 0, 5)},  // 3 < 5: rows that see nothing
      {"prefill37_d64_bs8", spec_of(4, 1, 64, 8, {37, 90, 500, 61}, 2, 30, 37)},
  };
  std::vector<DecodeCase> cases;
  for (const DecodeKernel& k : decode_kernels())
    for (const auto& [name, spec] : specs) cases.push_back({&k, name, spec});
  return cases;
}

class DecodeKernelTest : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(DecodeKernelTest, MatchesOracle) {
  SKIP_WITHOUT_GPU();
  const DecodeCase& c = GetParam();
  const uint64_t seed = fresh_seed();
  const DecodeProblem problem = make_decode_problem(c.spec, seed, c.kernel->dtype);
  const std::string why = support_reason(*c.kernel, problem.shape);
  if (!why.empty()) GTEST_SKIP() << c.kernel->name << " does not support " << problem.shape.to_string() << ": " << why;
  const DecodeDeviceInputs inputs = upload_decode_problem(problem);
  const DecodeRunResult r = run_decode(*c.kernel, problem, inputs, 0);
  ASSERT_TRUE(r.ran) << r.skipped << r.error;
  EXPECT_TRUE(r.passed) << c.kernel->name << " on " << c.name << " (" << problem.shape.to_string() << "), seed " << seed
                        << ": " << r.summary() << "\n"
                        << r.report.details();
  EXPECT_TRUE(r.repeat_identical) << c.kernel->name << " wrote different bytes on a second launch; seed " << seed;
}

INSTANTIATE_TEST_SUITE_P(All, DecodeKernelTest, ::testing::ValuesIn(decode_cases()),
                         [](const auto& info) { return info.param.kernel->name + "__" + info.param.name; });

std::vector<const DecodeKernel*> decode_kernel_pointers() {
  std::vector<const DecodeKernel*> out;
  for (const DecodeKernel& k : decode_kernels()) out.push_back(&k);
  return out;
}

class DecodeKernelMemory : public ::testing::TestWithParam<const DecodeKernel*> {};

// The peak device memory a run reports (fa_bench --decode's device_mib) is what it holds, counted
// from the shape: Q and O [num_seqs, heads_q, query_len, head_dim] and the K and V pools
// [num_blocks, heads_kv, block_size, head_dim] in the kernel's dtype, the float LSE, the int block
// tables [num_seqs, max_blocks_per_seq] and context lengths [num_seqs], and the workspace. GQA
// keeps a token's K row smaller than its Q row; the pool holds spare blocks and prompt blocks the
// samples share, so it is neither the blocks the tables reach nor the contexts' tokens; the tables
// are padded to the longest; and the split kernel has a workspace. A count that missed the pool or
// the tables, took only the blocks in use, or missed or doubled the workspace fails.
TEST_P(DecodeKernelMemory, ReportsItsPeakDeviceMemory) {
  SKIP_WITHOUT_GPU();
  const DecodeKernel& k = *GetParam();
  const DecodeProblem problem =
      make_decode_problem(spec_of(8, 2, 128, 16, {90, 91, 150, 700}, 2, 73, 3), fresh_seed(), k.dtype);
  const DecodeShape& s = problem.shape;
  const std::string why = support_reason(k, s);
  if (!why.empty()) GTEST_SKIP() << k.name << " does not support " << s.to_string() << ": " << why;
  ASSERT_LT(problem.blocks_used, s.num_blocks) << "the pool should hold blocks no table reaches";
  const DecodeDeviceInputs inputs = upload_decode_problem(problem);
  const DecodeRunResult r = run_decode(k, problem, inputs, 0);
  ASSERT_TRUE(r.ran) << r.skipped << r.error;
  const std::size_t element = dtype_size(k.dtype);
  const std::size_t workspace = k.workspace_bytes ? k.workspace_bytes(s) : 0;
  if (k.workspace_bytes) EXPECT_GT(workspace, 0u) << k.name << " asks for a workspace of 0 bytes here";
  const std::size_t expected = (std::size_t(s.q_elems()) * 2 + std::size_t(s.cache_elems()) * 2) * element +
                               std::size_t(s.lse_elems()) * sizeof(float) +
                               (std::size_t(s.num_seqs) * s.max_blocks_per_seq + s.num_seqs) * sizeof(int) + workspace;
  EXPECT_DOUBLE_EQ(r.device_mib, double(expected) / (1 << 20)) << k.name << " on " << s.to_string();
}

INSTANTIATE_TEST_SUITE_P(All, DecodeKernelMemory, ::testing::ValuesIn(decode_kernel_pointers()),
                         [](const auto& info) { return info.param->name; });

/// A prefill of the whole sequence over the paged cache (query_len = context, causal) equals
/// chapter 05's tuned kernel over the same K/V laid out contiguously.
TEST(PagedPrefill, PagedEqualsContiguous) {
  SKIP_WITHOUT_GPU();
  const ForwardKernel* contiguous = nullptr;
  for (const ForwardKernel& k : forward_kernels())
    if (k.name == "ch05_tuned_bf16") contiguous = &k;
  ASSERT_NE(contiguous, nullptr) << "chapter 05's ch05_tuned_bf16 is not registered";
  for (int d : {64, 128}) {
    const uint64_t seed = fresh_seed();
    const int n = 300;
    DecodeSpec spec = spec_of(8, 2, d, 16, {n, n}, 2, 100, n);  // two samples sharing a 100-token prompt
    DecodeProblem problem = make_decode_problem(spec, seed, DType::BF16);
    const DecodeShape& s = problem.shape;
    AttentionShape flat;
    flat.batch = s.num_seqs;
    flat.heads_q = s.heads_q;
    flat.heads_kv = s.heads_kv;
    flat.seq_q = flat.seq_kv = n;
    flat.head_dim = d;
    flat.causal = true;
    ASSERT_EQ(support_reason(*contiguous, flat), "");
    // The same K/V, gathered through the tables into [batch, heads_kv, n, d].
    std::vector<float> k(std::size_t(flat.kv_elems())), v(k.size());
    for (int b = 0; b < s.num_seqs; ++b)
      for (int h = 0; h < s.heads_kv; ++h)
        for (int t = 0; t < n; ++t)
          for (int x = 0; x < d; ++x) {
            const int64_t element =
                ((int64_t(problem.tables[b][t / s.block_size]) * s.heads_kv + h) * s.block_size + t % s.block_size) *
                    d +
                x;
            const std::size_t at = ((std::size_t(b) * s.heads_kv + h) * n + t) * d + x;
            k[at] = decode_cache_value(seed, 1, element);
            v[at] = decode_cache_value(seed, 2, element);
          }
    std::vector<float> o_flat, lse_flat;
    launch_forward_on(*contiguous, flat, problem.q, k, v, o_flat, lse_flat);
    const DecodeDeviceInputs inputs = upload_decode_problem(problem);
    for (const DecodeKernel& kernel : decode_kernels()) {
      if (kernel.dtype != DType::BF16) continue;
      const DecodeRunResult r = run_decode(kernel, problem, inputs, 0);
      ASSERT_TRUE(r.ran) << r.skipped << r.error;
      EXPECT_TRUE(r.passed) << kernel.name << " prefill d" << d << ", seed " << seed << ": " << r.summary();
      // Rerun to get the paged O as floats, and hold it against the contiguous kernel's.
      DeviceBuffer o(std::size_t(s.q_elems()) * 2), lse(std::size_t(s.lse_elems()) * 4),
          ws(kernel.workspace_bytes ? kernel.workspace_bytes(s) : 0);
      const DecodeParams p = decode_params(problem, inputs, o.get(), lse.as<float>(), ws.get());
      kernel.launch(p);
      CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<unsigned char> raw = o.download();
      std::vector<float> o_paged(std::size_t(s.q_elems()));
      decode_elements(DType::BF16, raw.data(), o_paged.data(), o_paged.size());
      double worst = 0;
      for (std::size_t i = 0; i < o_paged.size(); ++i)
        worst = std::max(worst, double(std::fabs(o_paged[i] - o_flat[i])));
      EXPECT_LE(worst, tolerance_for(DType::BF16).max_abs)
          << kernel.name << " over the paged cache and " << contiguous->name
          << " over the same K/V stored contiguously differ by " << worst << " (d" << d << ", seed " << seed << ")";
    }
  }
}

/// A serving step by hand: prompts written, forked, then tokens appended with copy-on-write;
/// the GPU's cache after launch_copy_blocks and launch_write_kv_cache equals the CPU's after
/// copy_blocks and write_token, and slots nobody wrote still hold the poison.
TEST(PagedCache, WritesAndCopiesMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  for (int block_size : {1, 4, 16}) {
    DecodeShape layout;
    layout.heads_kv = 2;
    layout.heads_q = 4;
    layout.head_dim = 64;
    layout.block_size = block_size;
    layout.num_blocks = 400 / block_size + 40;
    layout.max_blocks_per_seq = layout.num_blocks;
    const int64_t elems = layout.cache_elems(), row = int64_t(layout.heads_kv) * layout.head_dim;
    PagedKvView view;
    view.num_blocks = layout.num_blocks;
    view.block_size = block_size;
    view.heads_kv = layout.heads_kv;
    view.head_dim = layout.head_dim;
    std::vector<float> k_cpu(std::size_t(elems), NAN), v_cpu(k_cpu.size(), NAN);
    DeviceBuffer k_gpu(std::size_t(elems) * 2), v_gpu(std::size_t(elems) * 2);
    k_gpu.poison();
    v_gpu.poison();
    paged::BlockManager m(layout.num_blocks, block_size);
    uint64_t token = 0;
    auto append = [&](const std::vector<int>& seqs, int n) {
      std::vector<std::pair<int, int>> where;
      for (int seq : seqs) {
        const int start = m.length(seq);
        m.append(seq, n);
        for (int pos = start; pos < start + n; ++pos) where.push_back({seq, pos});
      }
      const std::vector<paged::BlockCopy> copies = m.take_copies();
      if (!copies.empty()) {
        std::vector<int> pairs;
        for (const auto& c : copies) pairs.insert(pairs.end(), {c.from, c.to});
        DeviceBuffer d_pairs(pairs.size() * sizeof(int));
        d_pairs.upload(pairs.data(), pairs.size() * sizeof(int));
        paged::launch_copy_blocks(layout, d_pairs.as<int>(), int(copies.size()), k_gpu.get(), v_gpu.get());
        paged::copy_blocks(k_cpu, v_cpu, view, copies);
      }
      // One padding token (slot -1) in the middle: the kernel must skip it.
      std::vector<float> k_new((where.size() + 1) * row), v_new(k_new.size());
      std::vector<int64_t> slots;
      for (std::size_t i = 0; i <= where.size(); ++i)
        for (int64_t x = 0; x < row; ++x, ++token) {
          k_new[i * row + x] = round_to_dtype(random_normal(seed, 1, token), DType::F16);
          v_new[i * row + x] = round_to_dtype(random_normal(seed, 2, token), DType::F16);
        }
      std::size_t next = 0;
      for (std::size_t i = 0; i <= where.size(); ++i) {
        if (i == where.size() / 2) {
          slots.push_back(-1);
          continue;
        }
        const auto [seq, pos] = where[next++];
        const std::vector<int>& table = m.block_table(seq);
        slots.push_back(int64_t(table[pos / block_size]) * block_size + pos % block_size);
        paged::write_token(k_cpu, v_cpu, view, table, pos, &k_new[i * row], &v_new[i * row]);
      }
      std::vector<uint16_t> k_raw(k_new.size()), v_raw(k_new.size());
      encode_elements(DType::F16, k_new.data(), k_raw.data(), k_new.size());
      encode_elements(DType::F16, v_new.data(), v_raw.data(), v_new.size());
      DeviceBuffer d_k(k_raw.size() * 2), d_v(v_raw.size() * 2), d_slots(slots.size() * sizeof(int64_t));
      d_k.upload(k_raw.data(), k_raw.size() * 2);
      d_v.upload(v_raw.data(), v_raw.size() * 2);
      d_slots.upload(slots.data(), slots.size() * sizeof(int64_t));
      paged::launch_write_kv_cache(layout, d_k.get(), d_v.get(), d_slots.as<int64_t>(), int(slots.size()), k_gpu.get(),
                                   v_gpu.get());
      CUDA_CHECK(cudaDeviceSynchronize());
    };
    const int prompt = m.add_sequence();
    append({prompt}, 45);
    const int a = m.fork(prompt), b = m.fork(prompt);
    for (int step = 0; step < 20; ++step) append({prompt, a, b}, 1);  // the first step copies the half-full block twice
    append({a}, 37);
    const int other = m.add_sequence();
    append({other}, 50);
    int64_t differ = 0, written = 0;
    for (int which = 0; which < 2; ++which) {
      const std::vector<unsigned char> raw = (which == 0 ? k_gpu : v_gpu).download();
      const uint16_t* got = reinterpret_cast<const uint16_t*>(raw.data());
      const std::vector<float>& want = which == 0 ? k_cpu : v_cpu;
      for (int64_t e = 0; e < elems; ++e) {
        uint16_t expect = 0xFFFF;
        if (!std::isnan(want[e])) {
          encode_elements(DType::F16, &want[e], &expect, 1);
          ++written;
        }
        differ += got[e] != expect;
      }
    }
    EXPECT_GT(written, 0);
    EXPECT_EQ(differ, 0) << "block size " << block_size << ": " << differ
                         << " cache elements differ from the CPU's (of " << 2 * elems << "; " << written
                         << " written), seed " << seed;
  }
}

}  // namespace
}  // namespace fa
