// Chapter 08: the host side of a paged KV cache, as in vLLM's PagedAttention. The cache is a
// pool of physical blocks of `block_size` token slots each. A sequence owns a block table: its
// logical block i lives in physical block table[i], so token t sits in slot t % block_size of
// physical block table[t / block_size]. Blocks are handed out only as tokens arrive, and
// sequences that share a prefix (parallel samples of one prompt, beams) share its blocks:
//
//   * fork(parent) gives a new sequence the parent's table; every block gains a reference.
//   * append(seq, n) makes room for n more tokens. If the sequence's last block is shared and
//     not full, the next token would land in another sequence's block: that block is copied
//     first (copy-on-write). The copy is recorded for the cache (take_copies) and the sequence
//     gets the fresh block; the old one loses a reference.
//   * release(seq) drops the sequence; blocks nobody references go back to the pool.
//
// Running out of blocks is an error that changes nothing: append works out how many blocks it
// needs (new ones, and one more for a copy-on-write) before it takes any. Plain C++, no GPU:
// tests/cpu/test_block_manager.cpp checks it against a simple model under random operations.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "not_implemented.h"

namespace fa::paged {

/// A copy the cache must perform before the next write: all block_size slots of physical
/// block `from` into physical block `to` (for every layer's K and V).
struct BlockCopy {
  int from = 0, to = 0;
  bool operator==(const BlockCopy& o) const { return from == o.from && to == o.to; }
};

class BlockManager {
 public:
  /// num_blocks >= 1; block_size a power of two from 1 to 1024.
  BlockManager(int num_blocks, int block_size) : block_size_(block_size) {
    if (num_blocks < 1) throw std::invalid_argument("num_blocks must be at least 1, got " + std::to_string(num_blocks));
    if (block_size < 1 || block_size > 1024 || (block_size & (block_size - 1)) != 0)
      throw std::invalid_argument("block_size must be a power of two from 1 to 1024, got " +
                                  std::to_string(block_size));
    refs_.assign(num_blocks, 0);
    free_.reserve(num_blocks);
    for (int b = num_blocks - 1; b >= 0; --b) free_.push_back(b);  // hands out 0, 1, 2, ... first
  }

  int block_size() const { return block_size_; }
  int total_blocks() const { return int(refs_.size()); }
  int free_blocks() const { return int(free_.size()); }
  int used_blocks() const { return total_blocks() - free_blocks(); }
  int ref_count(int block) const { return refs_.at(block); }

  /// A new, empty sequence; returns its id (never reused).
  int add_sequence() {
    seqs_[next_id_] = Sequence{};
    return next_id_++;
  }
  bool has_sequence(int seq) const { return seqs_.count(seq) != 0; }
  std::vector<int> sequences() const {
    std::vector<int> ids;
    for (const auto& entry : seqs_) ids.push_back(entry.first);
    return ids;
  }
  int length(int seq) const { return find(seq).length; }
  const std::vector<int>& block_table(int seq) const { return find(seq).table; }

  /// Blocks the sequence would hold if nothing were shared: ceil(length / block_size).
  int blocks_needed(int seq) const { return (length(seq) + block_size_ - 1) / block_size_; }

  /// Room for `tokens` more tokens (>= 0) at the end of `seq`. Throws, changing nothing, when
  /// the pool cannot supply the blocks.
  void append(int seq, int tokens) {
    if (tokens < 0) throw std::invalid_argument("append: tokens must be >= 0, got " + std::to_string(tokens));
    Sequence& s = find(seq);
    const int64_t new_length = int64_t(s.length) + tokens;
    if (new_length > (int64_t(1) << 30))
      throw std::invalid_argument("append: sequence " + std::to_string(seq) + " would exceed 2^30 tokens");
    //! [append]
    // The next token lands in the last block when that block has room. If another sequence
    // shares that block, this one must get its own copy first.
    const bool last_has_room = s.length % block_size_ != 0;
    const bool copy_on_write = tokens > 0 && last_has_room && refs_[s.table.back()] > 1;
    const int new_blocks = int((new_length + block_size_ - 1) / block_size_) - int(s.table.size());
    const int needed = new_blocks + (copy_on_write ? 1 : 0);
    if (needed > free_blocks())
      throw std::runtime_error("out of KV-cache blocks: sequence " + std::to_string(seq) + " needs " +
                               std::to_string(needed) + " more for " + std::to_string(tokens) + " tokens, " +
                               std::to_string(free_blocks()) + " of " + std::to_string(total_blocks()) + " are free");
    if (copy_on_write) {
      // BEGIN SOLUTION ch08_cow_cpu: the copy-on-write: take a fresh block, record the copy {shared last block, fresh block} for take_copies, drop one reference from the shared block, and make the fresh block the sequence's last
      const int shared = s.table.back(), own = take_block();
      copies_.push_back({shared, own});
      --refs_[shared];
      s.table.back() = own;
      // END SOLUTION
    }
    for (int i = 0; i < new_blocks; ++i) s.table.push_back(take_block());
    s.length = int(new_length);
    //! [append]
  }

  /// A new sequence sharing all of `parent`'s blocks (and its length); returns its id.
  int fork(int parent) {
    const Sequence copy = find(parent);
    for (int b : copy.table) ++refs_[b];
    seqs_[next_id_] = copy;
    return next_id_++;
  }

  /// Drops `seq`; each of its blocks loses a reference, and unreferenced blocks are free again.
  void release(int seq) {
    const Sequence s = find(seq);
    seqs_.erase(seq);
    for (int b : s.table)
      if (--refs_[b] == 0) free_.push_back(b);
  }

  /// The copy-on-write copies recorded since the last call, in order; the caller performs them
  /// on the cache before writing the new tokens.
  std::vector<BlockCopy> take_copies() {
    std::vector<BlockCopy> out;
    out.swap(copies_);
    return out;
  }

 private:
  struct Sequence {
    int length = 0;
    std::vector<int> table;
  };

  const Sequence& find(int seq) const {
    const auto it = seqs_.find(seq);
    if (it == seqs_.end()) throw std::invalid_argument("no sequence " + std::to_string(seq));
    return it->second;
  }
  Sequence& find(int seq) { return const_cast<Sequence&>(static_cast<const BlockManager*>(this)->find(seq)); }

  int take_block() {
    const int b = free_.back();
    free_.pop_back();
    refs_[b] = 1;
    return b;
  }

  int block_size_;
  std::vector<int> refs_;  // per physical block: how many table entries point at it
  std::vector<int> free_;  // blocks with no references, taken from the back
  std::map<int, Sequence> seqs_;
  std::vector<BlockCopy> copies_;
  int next_id_ = 0;
};

}  // namespace fa::paged
