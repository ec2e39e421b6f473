// Chapter 08's block manager (chapters/08_paged_attention/block_manager.h): fixed cases, and
// random append / fork / release sequences against a simple model. The model keeps every live
// sequence's tokens as a plain list; a simulated cache (one value per slot of every physical
// block) is written only through the block tables and the copy-on-write copies, and every
// sequence must read back exactly its own tokens after every step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "../../chapters/08_paged_attention/block_manager.h"

namespace fa::paged {
namespace {

class SimulatedCache {
 public:
  SimulatedCache(int blocks, int block_size) : block_size_(block_size), slots_(std::size_t(blocks) * block_size, -1) {}
  void apply(const std::vector<BlockCopy>& copies) {
    for (const BlockCopy& c : copies)
      std::copy(slots_.begin() + int64_t(c.from) * block_size_, slots_.begin() + int64_t(c.from + 1) * block_size_,
                slots_.begin() + int64_t(c.to) * block_size_);
  }
  int& at(const std::vector<int>& table, int token) {
    return slots_[std::size_t(table[token / block_size_]) * block_size_ + token % block_size_];
  }

 private:
  int block_size_;
  std::vector<int> slots_;
};

/// Everything observable about the manager, to check that a failed append changed nothing.
struct Snapshot {
  std::map<int, std::vector<int>> tables;
  std::map<int, int> lengths;
  std::vector<int> refs;
  int free = 0;
  bool operator==(const Snapshot& o) const {
    return tables == o.tables && lengths == o.lengths && refs == o.refs && free == o.free;
  }
};
Snapshot snapshot(const BlockManager& m) {
  Snapshot s;
  for (int id : m.sequences()) {
    s.tables[id] = m.block_table(id);
    s.lengths[id] = m.length(id);
  }
  for (int b = 0; b < m.total_blocks(); ++b) s.refs.push_back(m.ref_count(b));
  s.free = m.free_blocks();
  return s;
}

/// Reference counts match the tables, free blocks are exactly the unreferenced ones, every table
/// has ceil(length / block_size) entries, and each sequence reads back its own tokens.
void check_invariants(const BlockManager& m, SimulatedCache& cache, const std::map<int, std::vector<int>>& model,
                      const std::string& where) {
  std::vector<int> refs(m.total_blocks(), 0);
  ASSERT_EQ(m.sequences().size(), model.size()) << where;
  for (const auto& [id, tokens] : model) {
    const std::vector<int>& table = m.block_table(id);
    ASSERT_EQ(m.length(id), int(tokens.size())) << where << ", sequence " << id;
    ASSERT_EQ(int(table.size()), (int(tokens.size()) + m.block_size() - 1) / m.block_size())
        << where << ", sequence " << id;
    for (int b : table) ++refs[b];
    for (int t = 0; t < int(tokens.size()); ++t)
      ASSERT_EQ(cache.at(table, t), tokens[t])
          << where << ": sequence " << id << " token " << t << " reads another's data";
  }
  int unreferenced = 0;
  for (int b = 0; b < m.total_blocks(); ++b) {
    ASSERT_EQ(m.ref_count(b), refs[b]) << where << ": block " << b;
    unreferenced += refs[b] == 0;
  }
  ASSERT_EQ(m.free_blocks(), unreferenced) << where << ": a block is lost or leaked";
}

TEST(BlockManager, AllocatesAsTokensArrive) {
  BlockManager m(8, 4);
  const int a = m.add_sequence();
  EXPECT_TRUE(m.block_table(a).empty());
  m.append(a, 1);
  EXPECT_EQ(m.block_table(a), std::vector<int>({0}));
  m.append(a, 3);  // fills block 0
  EXPECT_EQ(m.used_blocks(), 1);
  m.append(a, 1);  // token 4 needs a second block
  EXPECT_EQ(m.block_table(a), std::vector<int>({0, 1}));
  EXPECT_EQ(m.length(a), 5);
  m.release(a);
  EXPECT_EQ(m.free_blocks(), 8);
}

TEST(BlockManager, ForkSharesAndCopyOnWriteSplitsTheLastBlock) {
  BlockManager m(8, 4);
  const int parent = m.add_sequence();
  m.append(parent, 6);  // blocks 0 (full) and 1 (2 of 4 slots)
  const int child = m.fork(parent);
  EXPECT_EQ(m.block_table(child), m.block_table(parent));
  EXPECT_EQ(m.ref_count(0), 2);
  EXPECT_EQ(m.ref_count(1), 2);
  EXPECT_EQ(m.used_blocks(), 2);

  m.append(child, 1);  // would write slot 2 of the shared block 1: copy it first
  EXPECT_EQ(m.take_copies(), std::vector<BlockCopy>({{1, 2}}));
  EXPECT_EQ(m.block_table(child), std::vector<int>({0, 2}));
  EXPECT_EQ(m.ref_count(1), 1);
  EXPECT_EQ(m.ref_count(0), 2);  // the full block stays shared

  m.append(parent, 1);  // block 1 is the parent's alone now: no copy
  EXPECT_TRUE(m.take_copies().empty());
  EXPECT_EQ(m.block_table(parent), std::vector<int>({0, 1}));
}

TEST(BlockManager, ForkAtABlockBoundaryNeedsNoCopy) {
  BlockManager m(8, 4);
  const int parent = m.add_sequence();
  m.append(parent, 8);
  const int child = m.fork(parent);
  m.append(child, 1);
  EXPECT_TRUE(m.take_copies().empty());
  EXPECT_EQ(m.block_table(child), std::vector<int>({0, 1, 2}));
}

TEST(BlockManager, RunningOutIsAClearErrorThatChangesNothing) {
  BlockManager m(3, 4);
  const int a = m.add_sequence();
  m.append(a, 6);
  const int b = m.fork(a);
  const Snapshot before = snapshot(m);
  // b needs a copy of block 1 plus two new blocks for 9 more tokens: 3, and 1 is free.
  try {
    m.append(b, 9);
    FAIL() << "append should have run out of blocks";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "out of KV-cache blocks: sequence 1 needs 3 more for 9 tokens, 1 of 3 are free");
  }
  EXPECT_TRUE(snapshot(m) == before);
  EXPECT_TRUE(m.take_copies().empty());
}

TEST(BlockManager, RejectsBadArguments) {
  EXPECT_THROW(BlockManager(0, 16), std::invalid_argument);
  EXPECT_THROW(BlockManager(4, 12), std::invalid_argument);
  EXPECT_THROW(BlockManager(4, 2048), std::invalid_argument);
  try {
    BlockManager(4, 12);
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "block_size must be a power of two from 1 to 1024, got 12");
  }
  BlockManager m(4, 16);
  EXPECT_THROW(m.append(7, 1), std::invalid_argument);
  EXPECT_THROW(m.fork(7), std::invalid_argument);
  EXPECT_THROW(m.release(7), std::invalid_argument);
  const int a = m.add_sequence();
  EXPECT_THROW(m.append(a, -1), std::invalid_argument);
}

TEST(BlockManager, ParallelSamplingSharesThePrompt) {
  // One 1000-token prompt, 8 samples of 100 tokens each, block size 16.
  BlockManager m(1024, 16);
  const int prompt = m.add_sequence();
  m.append(prompt, 1000);
  std::vector<int> samples;
  for (int i = 0; i < 8; ++i) samples.push_back(m.fork(prompt));
  m.release(prompt);
  int unshared = 0;
  for (int s : samples) {
    for (int t = 0; t < 100; ++t) m.append(s, 1);
    unshared += m.blocks_needed(s);
  }
  // Without sharing: 8 x ceil(1100 / 16) = 552 blocks. With it: 62 full prompt blocks once, and
  // per sample its own copy of the prompt's half-full last block plus 6 more = 7 x 8.
  EXPECT_EQ(unshared, 552);
  EXPECT_EQ(m.used_blocks(), 62 + 8 * 7);
}

TEST(BlockManager, RandomOperationsAgainstAModel) {
  const uint64_t seed = std::random_device{}();
  std::mt19937_64 rng(seed);
  for (int block_size : {1, 4, 16}) {
    const int blocks = std::max(64, 1024 / block_size);
    BlockManager m(blocks, block_size);
    SimulatedCache cache(blocks, block_size);
    std::map<int, std::vector<int>> model;
    int next_value = 0, failures = 0;
    for (int step = 0; step < 3000; ++step) {
      const std::string where = "seed " + std::to_string(seed) + ", block size " + std::to_string(block_size) +
                                ", step " + std::to_string(step);
      std::vector<int> ids;
      for (const auto& entry : model) ids.push_back(entry.first);
      const int op = int(rng() % 10);
      if (ids.empty() || (op == 0 && ids.size() < 12)) {
        model[m.add_sequence()] = {};
      } else if (op <= 5) {  // append 1..40 tokens to a random sequence
        const int id = ids[rng() % ids.size()], n = 1 + int(rng() % 40);
        const Snapshot before = snapshot(m);
        try {
          m.append(id, n);
        } catch (const std::runtime_error&) {
          ++failures;
          ASSERT_TRUE(snapshot(m) == before) << where << ": a failed append changed the manager";
          ASSERT_TRUE(m.take_copies().empty()) << where;
          continue;
        }
        cache.apply(m.take_copies());
        std::vector<int>& tokens = model[id];
        for (int i = 0; i < n; ++i) {
          cache.at(m.block_table(id), int(tokens.size())) = next_value;
          tokens.push_back(next_value++);
        }
      } else if (op <= 7 && ids.size() < 12) {
        const int parent = ids[rng() % ids.size()];
        model[m.fork(parent)] = model[parent];
      } else {
        const int id = ids[rng() % ids.size()];
        m.release(id);
        model.erase(id);
      }
      check_invariants(m, cache, model, where);
      if (::testing::Test::HasFatalFailure()) return;
    }
    for (const auto& entry : model) m.release(entry.first);
    EXPECT_EQ(m.free_blocks(), blocks) << "seed " << seed << ": blocks leaked after releasing everything";
    EXPECT_GT(failures, 0) << "the pool never ran out: the test did not exercise the error path (seed " << seed << ")";
    std::printf("block size %d: 3000 random steps, %d appends refused for lack of blocks (seed %llu)\n", block_size,
                failures, (unsigned long long)seed);
  }
}

}  // namespace
}  // namespace fa::paged
