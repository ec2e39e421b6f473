// Chapter 08's CPU side: a paged cache filled through the block manager (forks, copy-on-write),
// then one decode step, split-KV, against the fp64 oracle (reference_paged_decode) for several
// partition sizes. The merge of partitions must not depend on how the context was cut.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../chapters/08_paged_attention/algorithm.h"
#include "../../chapters/08_paged_attention/block_manager.h"
#include "random.h"
#include "reference.h"

namespace fa::paged {
namespace {

struct PagedProblem {
  PagedKvView layout;
  std::vector<float> k_cache, v_cache, q;
  std::vector<std::vector<int>> tables;
  std::vector<int> lens;
  int heads_q = 0;
};

/// Sequences: a 50-token prompt and two samples forked from it that go on with 30 and 7 tokens
/// of their own (copy-on-write of the prompt's half-full last block), a 1-token sequence, an
/// empty one, and one of exactly two blocks. K/V values are written once per token, through
/// the tables, as the cache-write kernel will.
PagedProblem make_problem(uint64_t seed, int heads_q, int heads_kv, int d, int block_size) {
  PagedProblem p;
  p.heads_q = heads_q;
  p.layout.num_blocks = 64;
  p.layout.block_size = block_size;
  p.layout.heads_kv = heads_kv;
  p.layout.head_dim = d;
  const std::size_t block_floats = std::size_t(heads_kv) * block_size * d;
  p.k_cache.assign(block_floats * p.layout.num_blocks, NAN);  // never-written slots must never be read
  p.v_cache.assign(p.k_cache.size(), NAN);
  BlockManager m(p.layout.num_blocks, block_size);
  uint64_t token_id = 0;
  std::vector<float> k(std::size_t(heads_kv) * d), v(k.size());
  auto append = [&](int seq, int n) {
    const int start = m.length(seq);
    m.append(seq, n);
    copy_blocks(p.k_cache, p.v_cache, p.layout, m.take_copies());
    for (int pos = start; pos < start + n; ++pos, ++token_id) {
      for (std::size_t x = 0; x < k.size(); ++x) {
        k[x] = random_normal(seed, 1, token_id * k.size() + x);
        v[x] = random_normal(seed, 2, token_id * k.size() + x);
      }
      write_token(p.k_cache, p.v_cache, p.layout, m.block_table(seq), pos, k.data(), v.data());
    }
  };
  const int prompt = m.add_sequence();
  append(prompt, 50);
  const int a = m.fork(prompt), b = m.fork(prompt);
  append(a, 30);
  append(b, 7);
  const int single = m.add_sequence();
  append(single, 1);
  const int empty = m.add_sequence();
  const int two_blocks = m.add_sequence();
  append(two_blocks, 2 * block_size);
  for (int seq : {prompt, a, b, single, empty, two_blocks}) {
    p.tables.push_back(m.block_table(seq));
    p.lens.push_back(m.length(seq));
  }
  p.layout.k = p.k_cache.data();
  p.layout.v = p.v_cache.data();
  p.q.resize(p.lens.size() * heads_q * d);
  for (std::size_t i = 0; i < p.q.size(); ++i) p.q[i] = random_normal(seed, 0, i);
  return p;
}

TEST(PagedDecode, SplitKvMatchesTheOracleForAnyPartition) {
  const uint64_t seed = std::random_device{}();
  for (int block_size : {4, 16}) {
    const PagedProblem p = make_problem(seed, 8, 2, 64, block_size);
    const DecodeReference ref = reference_paged_decode(p.layout, p.heads_q, p.q.data(), p.tables, p.lens);
    for (int partition : {block_size, 2 * block_size, 3 * block_size, 1024}) {
      std::vector<float> o(ref.o.size()), lse(ref.lse.size());
      split_kv_decode_cpu(p.layout, p.heads_q, p.q.data(), p.tables, p.lens, partition, o.data(), lse.data());
      double max_o = 0, max_lse = 0;
      // Written so that a NaN (a read of a never-written slot) becomes the maximum.
      auto worse = [](double& acc, double diff) {
        if (!(diff <= acc)) acc = diff;
      };
      for (std::size_t i = 0; i < o.size(); ++i) worse(max_o, std::fabs(o[i] - ref.o[i]));
      for (std::size_t i = 0; i < lse.size(); ++i) {
        if (std::isinf(ref.lse[i])) {
          EXPECT_TRUE(std::isinf(lse[i]) && lse[i] < 0) << "empty context must give LSE = -inf";
          continue;
        }
        worse(max_lse, std::fabs(lse[i] - ref.lse[i]));
      }
      EXPECT_LT(max_o, 1e-5) << "block size " << block_size << ", partition " << partition << ", seed " << seed;
      EXPECT_LT(max_lse, 1e-5) << "block size " << block_size << ", partition " << partition << ", seed " << seed;
    }
  }
}

TEST(PagedDecode, EmptyContextGivesZeroOutput) {
  const PagedProblem p = make_problem(7, 4, 4, 32, 16);
  const DecodeReference ref = reference_paged_decode(p.layout, p.heads_q, p.q.data(), p.tables, p.lens);
  std::vector<float> o(ref.o.size(), 1.0f), lse(ref.lse.size());
  split_kv_decode_cpu(p.layout, p.heads_q, p.q.data(), p.tables, p.lens, 32, o.data(), lse.data());
  const int empty = 4, d = 32;  // the fifth sequence of make_problem
  for (int h = 0; h < p.heads_q; ++h) {
    EXPECT_TRUE(std::isinf(ref.lse[empty * p.heads_q + h]));
    for (int x = 0; x < d; ++x) {
      EXPECT_EQ(ref.o[(empty * p.heads_q + h) * d + x], 0.0);
      EXPECT_EQ(o[(empty * p.heads_q + h) * d + x], 0.0f);
    }
  }
}

TEST(PagedDecode, RejectsAPartitionThatSplitsABlock) {
  const PagedProblem p = make_problem(3, 2, 2, 32, 16);
  std::vector<float> o(p.q.size()), lse(p.lens.size() * 2);
  try {
    split_kv_decode_cpu(p.layout, p.heads_q, p.q.data(), p.tables, p.lens, 24, o.data(), lse.data());
    FAIL() << "a partition of 24 tokens with blocks of 16 should be rejected";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "partition_tokens must be a positive multiple of the block size (16), got 24");
  }
}

TEST(PagedDecode, BadBlockSizeIsAClearError) {
  DecodeShape s;
  s.block_size = 12;
  try {
    s.validate();
    FAIL() << "block size 12 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "block_size must be a power of two from 1 to 1024, got 12");
  }
}

}  // namespace
}  // namespace fa::paged
