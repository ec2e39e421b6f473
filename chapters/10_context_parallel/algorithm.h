// Chapter 10 on the CPU: attention over one long sequence split across N ranks (context
// parallelism), with all N ranks simulated in one process. Each rank's data is a std::vector of
// its own; a message from one rank to another is an explicit move between those vectors, so the
// order of the traffic is as visible in the code as the arithmetic.
//
//   1. The split: contiguous (rank r holds chunk r of N) or zigzag (2N chunks; rank r holds
//      chunks r and 2N-1-r, which evens out the causal work), and each rank's global positions.
//   2. Ring attention: the K/V blocks travel around the ring of ranks, one hop per step. Each
//      rank computes its queries' partial (O, LSE) against the block it holds (chapter 05's row
//      step) and merges it into its running (O, LSE) with chapter 08's merge of partitions (chapter
//      03's merge in LSE form). The backward sends dK and dV along with their block, so they are
//      complete when they arrive back at the block's owner.
//   3. The GPU ring's plan (ring_gpu.h): each step as one attention launch per (query chunk,
//      key chunk) pair the causal mask does not skip (pairs_for).
//   4. DeepSpeed-Ulysses, in ulysses.h: an all-to-all turns sequence shards into head shards,
//      every rank runs ordinary attention over the whole sequence for its heads, and a second
//      all-to-all turns the output back into sequence shards.
//
// Layout. The global problem is an AttentionShape (problem.h) with seq_q == seq_kv: the
// self-attention of one sequence, which is what context parallelism splits. Every shard keeps
// problem.h's order, [batch, heads, rows, head_dim] (LSE [batch, heads_q, rows]), where a rank's
// rows are its global positions in chunk order. A shard is then the familiar tensor with fewer
// rows, and scatter_rows / gather_rows convert between the global tensor and the shards.
// The causal rule is applied in GLOBAL positions: the query at position i sees the key at j iff
// j <= i, wherever the two rows are stored.
//
// Tests: build/bin/fa_cpu_tests --gtest_filter='*Ring*:*Ulysses*:*ContextParallel*'
// (tests/cpu/test_context_parallel.cpp, against the fp64 oracle on the whole sequence).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../05_flash_attention_v2/algorithm.h"
#include "../08_paged_attention/algorithm.h"
#include "problem.h"

namespace fa::context_parallel {

/// One vector per rank: the rank's shard of a tensor.
using Shards = std::vector<std::vector<float>>;
/// counts[rank][step]
using PerRankStep = std::vector<std::vector<int64_t>>;

enum class Split { Contiguous, Zigzag };

inline const char* split_name(Split kind) { return kind == Split::Contiguous ? "contiguous" : "zigzag"; }

/// A run of consecutive global positions [start, start + length); length may be 0.
struct Chunk {
  int start = 0;
  int length = 0;
  int last() const { return start + length - 1; }
};

/// How one sequence of `seq` tokens is cut across `ranks` ranks. chunks[r] are rank r's runs
/// of positions, in the order its rows are stored.
struct SequenceSplit {
  int seq = 0;
  int ranks = 1;
  Split kind = Split::Contiguous;
  std::vector<std::vector<Chunk>> chunks;

  int rows(int rank) const {
    int n = 0;
    for (const Chunk& c : chunks[rank]) n += c.length;
    return n;
  }
  /// Rank `rank`'s row i holds global position positions(rank)[i].
  std::vector<int> positions(int rank) const {
    std::vector<int> p;
    for (const Chunk& c : chunks[rank])
      for (int i = 0; i < c.length; ++i) p.push_back(c.start + i);
    return p;
  }
};

//! [sequence_split]
/// [0, seq) cut into `pieces` runs whose lengths differ by at most one (the first seq % pieces
/// runs take one token more), so a length that `pieces` does not divide still splits.
inline std::vector<Chunk> cut_evenly(int seq, int pieces) {
  std::vector<Chunk> runs(pieces);
  for (int p = 0, start = 0; p < pieces; ++p) {
    runs[p] = {start, seq / pieces + (p < seq % pieces ? 1 : 0)};
    start += runs[p].length;
  }
  return runs;
}

inline SequenceSplit split_sequence(int seq, int ranks, Split kind) {
  if (ranks < 1) throw std::invalid_argument("ranks must be at least 1, got " + std::to_string(ranks));
  if (seq < 1) throw std::invalid_argument("seq must be at least 1, got " + std::to_string(seq));
  SequenceSplit split{seq, ranks, kind, std::vector<std::vector<Chunk>>(ranks)};
  if (kind == Split::Contiguous) {
    const std::vector<Chunk> runs = cut_evenly(seq, ranks);
    for (int r = 0; r < ranks; ++r) split.chunks[r] = {runs[r]};
  } else {
    // Zigzag: 2N chunks; rank r takes one from the front half and its mirror from the back half,
    // so early (cheap under the causal mask) and late (expensive) queries pair up on every rank.
    const std::vector<Chunk> runs = cut_evenly(seq, 2 * ranks);
    for (int r = 0; r < ranks; ++r) split.chunks[r] = {runs[r], runs[2 * ranks - 1 - r]};
  }
  return split;
}
//! [sequence_split]

/// The global tensor [outer, seq, width] (outer = batch x heads; width = head_dim, or 1 for the
/// LSE) cut into shards [outer, rows(r), width].
inline Shards scatter_rows(const float* global, int64_t outer, int width, const SequenceSplit& split) {
  Shards shards(split.ranks);
  for (int r = 0; r < split.ranks; ++r) {
    const std::vector<int> pos = split.positions(r);
    shards[r].resize(outer * pos.size() * width);
    for (int64_t h = 0; h < outer; ++h)
      for (std::size_t i = 0; i < pos.size(); ++i)
        std::copy_n(global + (h * split.seq + pos[i]) * width, width,
                    shards[r].begin() + (h * int64_t(pos.size()) + int64_t(i)) * width);
  }
  return shards;
}

/// The inverse of scatter_rows.
inline std::vector<float> gather_rows(const Shards& shards, int64_t outer, int width, const SequenceSplit& split) {
  std::vector<float> global(outer * split.seq * width);
  for (int r = 0; r < split.ranks; ++r) {
    const std::vector<int> pos = split.positions(r);
    for (int64_t h = 0; h < outer; ++h)
      for (std::size_t i = 0; i < pos.size(); ++i)
        std::copy_n(shards[r].begin() + (h * int64_t(pos.size()) + int64_t(i)) * width, width,
                    global.begin() + (h * split.seq + pos[i]) * width);
  }
  return global;
}

//! [documents]
/// Packed sequences (chapter 09's variable-length batch) in self-attention: documents lie end to
/// end along the one sequence, document d at positions starts[d] .. starts[d + 1] - 1 (starts is
/// cu_seqlens: 0, ..., seq; a document may be empty). A query sees keys of its own document only,
/// and, causal, none after itself. The split cuts the sequence as before, across documents.
struct Documents {
  std::vector<int> starts;
  /// [begin, end) of the document holding position `pos`.
  std::pair<int, int> around(int pos) const {
    const auto next = std::upper_bound(starts.begin(), starts.end(), pos);  // the first start after pos
    return {*(next - 1), *next};
  }
};
//! [documents]

//! [block_kind]
/// What the causal mask does to a chunk of queries against a chunk of keys, known from the
/// chunks' positions alone, before any score is computed.
enum class BlockKind {
  Skip,      // every key after every query: nothing to compute (and nothing to read)
  Full,      // every key at or before every query: no mask at all
  Diagonal,  // the chunks overlap the diagonal: the mask is applied key by key
};

inline BlockKind classify(Chunk q, Chunk kv, bool causal) {
  if (q.length == 0 || kv.length == 0) return BlockKind::Skip;
  if (!causal) return BlockKind::Full;
  if (kv.start > q.last()) return BlockKind::Skip;
  if (kv.last() <= q.start) return BlockKind::Full;
  return BlockKind::Diagonal;
}

/// How many keys of chunk kv the query at global position `pos` sees: a prefix of the chunk.
inline int keys_seen(int pos, Chunk kv, bool causal) {
  if (!causal) return kv.length;
  return std::clamp(pos - kv.start + 1, 0, kv.length);
}
//! [block_kind]

/// Which rank's K/V block rank `rank` holds at step `step`: its own at step 0, then the one
/// from one rank further back at each step.
inline int source_rank(int rank, int step, int ranks) { return ((rank - step) % ranks + ranks) % ranks; }

inline float dot(const float* a, const float* b, int d) {
  float sum = 0.0f;
  for (int x = 0; x < d; ++x) sum += a[x] * b[x];
  return sum;
}

//! [block_forward]
/// The (query row, run of keys) pairs of one block, in the order the forward and the backward
/// visit them: for each of this rank's query rows (`row`, its index among the rank's rows) and
/// each chunk of the block, the row in the block of the first key it sees in the chunk
/// (`key_row`) and how many consecutive keys it sees there (`keys`: a prefix of the chunk, or,
/// with packed documents, the part of it in the row's document). Skip chunks, and rows that see
/// none of a chunk, are not visited.
template <class Visit>
inline void for_each_key_run(const std::vector<Chunk>& q_chunks, const std::vector<Chunk>& kv_chunks, bool causal,
                             Visit&& visit, const Documents* docs = nullptr) {
  int q_row0 = 0;
  for (const Chunk& qc : q_chunks) {
    int k_row0 = 0;
    for (const Chunk& kc : kv_chunks) {
      const BlockKind kind = classify(qc, kc, causal);
      for (int i = 0; kind != BlockKind::Skip && i < qc.length; ++i) {
        int first = 0, keys = 0;
        if (docs) {  // the row's document, cut to the causal limit and to the chunk
          const int pos = qc.start + i;
          const auto [begin, end] = docs->around(pos);
          const int lo = std::max(begin, kc.start);
          const int hi = std::min({end, causal ? pos + 1 : end, kc.start + kc.length});
          first = lo - kc.start;
          keys = hi - lo;
        } else {
          keys = kind == BlockKind::Full ? kc.length : keys_seen(qc.start + i, kc, causal);
        }
        if (keys > 0) visit(q_row0 + i, k_row0 + first, keys);
      }
      k_row0 += kc.length;
    }
    q_row0 += qc.length;
  }
}

/// One (batch, query head): this rank's query rows against the K/V block it holds. For each
/// row, the normalized output over the keys it sees in the block and their LSE (O = 0 and
/// LSE = -inf when it sees none). Within the block each run of keys is one of chapter 05's row
/// steps (flash2_row_step), one chunk pair at a time. Returns the number of scores computed.
inline int64_t block_forward(const float* q, const std::vector<Chunk>& q_chunks, const float* k, const float* v,
                             const std::vector<Chunk>& kv_chunks, int d, float scale, bool causal, float* o_part,
                             float* lse_part, const Documents* docs = nullptr) {
  int rows = 0;
  for (const Chunk& c : q_chunks) rows += c.length;
  std::vector<float> m(rows, -INFINITY), l(rows, 0.0f), acc(std::size_t(rows) * d, 0.0f), p;
  int64_t work = 0;
  for_each_key_run(
      q_chunks, kv_chunks, causal,
      [&](int row, int key_row, int keys) {
        p.resize(keys);
        float step_max = -INFINITY;
        for (int j = 0; j < keys; ++j) {
          p[j] = scale * dot(q + int64_t(row) * d, k + int64_t(key_row + j) * d, d);
          step_max = std::max(step_max, p[j]);
        }
        work += keys;
        // Chapter 05's step: the run of keys is a tile, its V rows consecutive.
        flash2::flash2_row_step(p.data(), step_max, m[row], l[row], acc.data() + std::size_t(row) * d,
                                v + int64_t(key_row) * d, keys, d);
      },
      docs);
  for (int row = 0; row < rows; ++row) {
    const bool seen = l[row] > 0.0f;
    for (int x = 0; x < d; ++x) o_part[int64_t(row) * d + x] = seen ? acc[std::size_t(row) * d + x] / l[row] : 0.0f;
    lse_part[row] = seen ? m[row] + std::log(l[row]) : -INFINITY;
  }
  return work;
}
//! [block_forward]

/// The (query, key) scores rank `rank` computes at step `step` for ONE (batch, query head),
/// from the positions alone: the plan the forward and backward loops follow. Multiply by
/// batch x heads_q for the whole problem.
inline int64_t step_work(const SequenceSplit& split, int rank, int step, bool causal, const Documents* docs = nullptr) {
  int64_t pairs = 0;
  for_each_key_run(
      split.chunks[rank], split.chunks[source_rank(rank, step, split.ranks)], causal,
      [&](int, int, int keys) { pairs += keys; }, docs);
  return pairs;
}

//! [pairs_for]
/// One (query chunk, key chunk) launch of a step: the problem the kernel sees and where its
/// tensors start inside the shards.
struct PairLaunch {
  AttentionShape shape;
  int q_chunk = 0, kv_chunk = 0;
};

/// The pairs rank `rank` computes against the block of rank `owner`: every pair the causal mask
/// does not skip. A diagonal pair is one chunk against itself (chunks are disjoint runs, so two
/// different chunks are either wholly before one another or wholly after), which is plain causal
/// attention; every other pair is attention with no mask.
inline std::vector<PairLaunch> pairs_for(const AttentionShape& global, const SequenceSplit& split, int rank,
                                         int owner) {
  std::vector<PairLaunch> pairs;
  for (int i = 0; i < int(split.chunks[rank].size()); ++i)
    for (int j = 0; j < int(split.chunks[owner].size()); ++j) {
      const Chunk qc = split.chunks[rank][i], kc = split.chunks[owner][j];
      const BlockKind kind = classify(qc, kc, global.causal);
      if (kind == BlockKind::Skip) continue;
      if (kind == BlockKind::Diagonal && (qc.start != kc.start || qc.length != kc.length))
        throw std::logic_error("a diagonal pair that is not one chunk against itself");
      AttentionShape s = global;
      s.seq_q = qc.length;
      s.seq_kv = kc.length;
      s.causal = kind == BlockKind::Diagonal;
      s.scale = global.softmax_scale();  // the whole problem's scale, whatever the chunk's length
      pairs.push_back({s, i, j});
    }
  return pairs;
}
//! [pairs_for]

/// With packed documents a pair is one of chapter 09's variable-length problems: its sequences are
/// the documents that reach into either chunk, each with its rows in the query chunk and its keys in
/// the key chunk (either may be none). A diagonal pair's sequences are causal squares; in any other
/// pair a sequence sees all of its keys (causal: every key there precedes every query).
struct PackedPairLaunch {
  PairLaunch pair;
  std::vector<int> cu_q, cu_k;  // the sequences' boundaries in the pair's rows and keys, from 0
};

/// The packed pairs rank `rank` computes against the block of rank `owner`, leaving out pairs in
/// which no query shares a document with a key: the GPU ring's varlen launches (ring_gpu.h).
inline std::vector<PackedPairLaunch> packed_pairs_for(const AttentionShape& global, const SequenceSplit& split,
                                                      int rank, int owner, const Documents& docs) {
  std::vector<PackedPairLaunch> out;
  for (const PairLaunch& p : pairs_for(global, split, rank, owner)) {
    const Chunk qc = split.chunks[rank][p.q_chunk], kc = split.chunks[owner][p.kv_chunk];
    const auto overlap = [](Chunk c, int begin, int end) {
      return std::max(0, std::min(end, c.start + c.length) - std::max(begin, c.start));
    };
    PackedPairLaunch packed{p, {0}, {0}};
    int64_t pairs_seen = 0;
    for (std::size_t d = 0; d + 1 < docs.starts.size(); ++d) {
      const int q = overlap(qc, docs.starts[d], docs.starts[d + 1]);
      const int k = overlap(kc, docs.starts[d], docs.starts[d + 1]);
      if (q == 0 && k == 0) continue;  // the document reaches neither chunk
      packed.cu_q.push_back(packed.cu_q.back() + q);
      packed.cu_k.push_back(packed.cu_k.back() + k);
      pairs_seen += int64_t(q) * k;
    }
    if (pairs_seen > 0) out.push_back(std::move(packed));
  }
  return out;
}

//! [merge_partial]
/// Chapter 03's merge in LSE form: a row's state (o, lse) over the keys seen so far absorbs the
/// partial (o_b, lse_b) over keys it had not seen.
///   LSE = log(e^lse + e^lse_b),  O = e^(lse - LSE) o + e^(lse_b - LSE) o_b
/// It is chapter 08's merge of a row's split-KV partitions, with two partitions: the state so far
/// and the block's partial. A side that has seen no key (LSE = -inf) is no partition at all.
inline void merge_partial(float* o, float& lse, const float* o_b, float lse_b, int d) {
  if (lse_b == -INFINITY) return;  // the block showed this row no key: nothing to add
  std::vector<float> parts_o, parts_lse;
  if (lse != -INFINITY) {
    parts_o.assign(o, o + d);
    parts_lse.push_back(lse);
  }
  parts_o.insert(parts_o.end(), o_b, o_b + d);
  parts_lse.push_back(lse_b);
  paged::merge_partitions_cpu(parts_o, parts_lse, d, o, &lse);
}
//! [merge_partial]

/// Throws std::invalid_argument unless `s` is one sequence's self-attention that `split` cuts
/// and every listed set of shards has one shard per rank of the expected size.
inline void check_problem(const AttentionShape& s, const SequenceSplit& split,
                          std::initializer_list<std::pair<const Shards*, int>> shards_and_heads) {
  s.validate();
  if (s.seq_q != s.seq_kv)
    throw std::invalid_argument("context parallelism splits one sequence's self-attention: seq_q (" +
                                std::to_string(s.seq_q) + ") must equal seq_kv (" + std::to_string(s.seq_kv) + ")");
  if (split.seq != s.seq_q)
    throw std::invalid_argument("the split cuts " + std::to_string(split.seq) + " tokens, the problem has " +
                                std::to_string(s.seq_q));
  for (const auto& [shards, heads] : shards_and_heads) {
    if (int(shards->size()) != split.ranks)
      throw std::invalid_argument("expected one shard per rank (" + std::to_string(split.ranks) + "), got " +
                                  std::to_string(shards->size()));
    for (int r = 0; r < split.ranks; ++r)
      if ((*shards)[r].size() != std::size_t(s.batch) * heads * split.rows(r) * s.head_dim)
        throw std::invalid_argument("rank " + std::to_string(r) + "'s shard has " +
                                    std::to_string((*shards)[r].size()) + " floats, expected batch x heads x " +
                                    std::to_string(split.rows(r)) + " rows x head_dim");
  }
}

/// Throws std::invalid_argument unless `docs` (when given) cuts this problem's one sequence:
/// batch 1 (a packed batch), boundaries from 0 to seq, never decreasing.
inline void check_documents(const AttentionShape& s, const Documents* docs) {
  if (!docs) return;
  if (s.batch != 1)
    throw std::invalid_argument("packed documents lie along one sequence: batch must be 1, got " +
                                std::to_string(s.batch));
  const std::vector<int>& b = docs->starts;
  if (b.size() < 2 || b.front() != 0 || b.back() != s.seq_q || !std::is_sorted(b.begin(), b.end()))
    throw std::invalid_argument("document boundaries must run from 0 to seq (" + std::to_string(s.seq_q) +
                                ") without decreasing");
}

/// What a ring run did: the scores each rank computed at each step (all batches and heads
/// together), and the floats each rank sent to its neighbour.
struct RingCounts {
  PerRankStep work;
  std::vector<int64_t> floats_sent;
};

struct RingForward {
  Shards o, lse;  // sequence shards: O [batch, heads_q, rows, d], LSE [batch, heads_q, rows]
  RingCounts counts;
};

//! [ring_forward]
/// Ring attention's forward. At step t rank r holds the K/V block of rank (r - t) mod N; after
/// the step it passes the block on to rank r + 1. On GPUs the pass of step t's block overlaps
/// step t's compute (two buffers per rank); here the steps simply run in order.
inline RingForward ring_attention_forward(const AttentionShape& s, const SequenceSplit& split, const Shards& q,
                                          const Shards& k, const Shards& v, const Documents* docs = nullptr) {
  check_problem(s, split, {{&q, s.heads_q}, {&k, s.heads_kv}, {&v, s.heads_kv}});
  check_documents(s, docs);
  const int n = split.ranks, d = s.head_dim;
  const float scale = float(s.softmax_scale());
  struct KvBlock {
    int owner;
    std::vector<float> k, v;
  };
  std::vector<KvBlock> held(n);
  RingForward out;
  out.counts.work.assign(n, std::vector<int64_t>(n, 0));
  out.counts.floats_sent.assign(n, 0);
  for (int r = 0; r < n; ++r) {
    held[r] = {r, k[r], v[r]};
    out.o.emplace_back(q[r].size(), 0.0f);
    out.lse.emplace_back(std::size_t(s.batch) * s.heads_q * split.rows(r), -INFINITY);
  }
  for (int step = 0; step < n; ++step) {
    for (int r = 0; r < n; ++r) {  // on GPUs: all ranks at once
      const KvBlock& block = held[r];
      const int rows = split.rows(r), kv_rows = split.rows(block.owner);
      std::vector<float> o_part(std::size_t(rows) * d), lse_part(rows);
      for (int bh = 0; bh < s.batch * s.heads_q; ++bh) {
        const int64_t kv_head = int64_t(bh / s.heads_q) * s.heads_kv + s.kv_head(bh % s.heads_q);
        out.counts.work[r][step] +=
            block_forward(q[r].data() + int64_t(bh) * rows * d, split.chunks[r], block.k.data() + kv_head * kv_rows * d,
                          block.v.data() + kv_head * kv_rows * d, split.chunks[block.owner], d, scale, s.causal,
                          o_part.data(), lse_part.data(), docs);
        for (int i = 0; i < rows; ++i)
          merge_partial(out.o[r].data() + (int64_t(bh) * rows + i) * d, out.lse[r][int64_t(bh) * rows + i],
                        o_part.data() + int64_t(i) * d, lse_part[i], d);
      }
    }
    if (step + 1 == n) break;  // every rank has seen every block: the last hop is not needed
    std::vector<KvBlock> next(n);
    for (int r = 0; r < n; ++r) {  // rank r sends to r + 1 and receives from r - 1
      out.counts.floats_sent[r] += int64_t(held[r].k.size() + held[r].v.size());
      next[(r + 1) % n] = std::move(held[r]);
    }
    held = std::move(next);
  }
  return out;
}
//! [ring_forward]

//! [block_backward]
/// One (batch, query head) of the backward: this rank's query rows against the K/V block it
/// holds, adding into dq (this rank's) and dk, dv (the block's, travelling with it). P comes
/// from the forward's FINAL LSE, so it is the true probability and each block's share of the
/// gradients is a plain term of a sum: unlike the forward, nothing needs rescaling or merging.
///   P = exp(scale q.k - LSE),  dV += P dO,  dS = P (dO.v - D),  dQ += scale dS k,  dK += scale dS q
inline int64_t block_backward(const float* q, const float* d_o, const float* lse, const float* delta,
                              const std::vector<Chunk>& q_chunks, const float* k, const float* v,
                              const std::vector<Chunk>& kv_chunks, int d, float scale, bool causal, float* dq,
                              float* dk, float* dv, const Documents* docs = nullptr) {
  int64_t work = 0;
  for_each_key_run(
      q_chunks, kv_chunks, causal,
      [&](int row, int key_row, int keys) {
        if (lse[row] == -INFINITY) return;  // a row that sees no key anywhere has P = 0
        const float* q_row = q + int64_t(row) * d;
        const float* do_row = d_o + int64_t(row) * d;
        for (int j = 0; j < keys; ++j) {
          const int64_t key = int64_t(key_row + j) * d;
          const float p = std::exp(scale * dot(q_row, k + key, d) - lse[row]);
          const float ds = p * (dot(do_row, v + key, d) - delta[row]);
          for (int x = 0; x < d; ++x) {
            dv[key + x] += p * do_row[x];
            dk[key + x] += scale * ds * q_row[x];
            dq[int64_t(row) * d + x] += scale * ds * k[key + x];
          }
        }
        work += keys;
      },
      docs);
  return work;
}
//! [block_backward]

struct RingBackward {
  Shards dq, dk, dv;  // sequence shards, laid out like q, k and v
  RingCounts counts;
};

//! [ring_backward]
/// Ring attention's backward from the forward's O and LSE. dQ stays home and collects a term at
/// every step. dK and dV of a block start at zero on its owner and travel with the block,
/// collecting a term from each rank's queries; after the N-th step they take one more hop
/// (K and V no longer need to) and arrive back at the owner, complete. The ranks' terms of each
/// dK/dV row are added in the ring's fixed order: the ring adds no run-to-run variation.
inline RingBackward ring_attention_backward(const AttentionShape& s, const SequenceSplit& split, const Shards& q,
                                            const Shards& k, const Shards& v, const Shards& o, const Shards& lse,
                                            const Shards& d_o, const Documents* docs = nullptr) {
  check_problem(s, split, {{&q, s.heads_q}, {&k, s.heads_kv}, {&v, s.heads_kv}, {&o, s.heads_q}, {&d_o, s.heads_q}});
  check_documents(s, docs);
  for (int r = 0; r < split.ranks; ++r)
    if (lse[r].size() != std::size_t(s.batch) * s.heads_q * split.rows(r))
      throw std::invalid_argument("rank " + std::to_string(r) + "'s LSE shard has " + std::to_string(lse[r].size()) +
                                  " floats, expected batch x heads_q x " + std::to_string(split.rows(r)) + " rows");
  const int n = split.ranks, d = s.head_dim;
  const float scale = float(s.softmax_scale());
  struct KvBlock {
    int owner;
    std::vector<float> k, v, dk, dv;
  };
  std::vector<KvBlock> held(n);
  Shards delta(n);  // D = rowsum(dO * O), one number per query row, computed where the row lives
  RingBackward out;
  out.counts.work.assign(n, std::vector<int64_t>(n, 0));
  out.counts.floats_sent.assign(n, 0);
  for (int r = 0; r < n; ++r) {
    held[r] = {r, k[r], v[r], std::vector<float>(k[r].size(), 0.0f), std::vector<float>(v[r].size(), 0.0f)};
    out.dq.emplace_back(q[r].size(), 0.0f);
    delta[r].resize(lse[r].size());
    for (std::size_t i = 0; i < delta[r].size(); ++i) delta[r][i] = dot(d_o[r].data() + i * d, o[r].data() + i * d, d);
  }
  auto pass_along = [&](bool with_kv) {  // rank r sends to r + 1 and receives from r - 1
    std::vector<KvBlock> next(n);
    for (int r = 0; r < n; ++r) {
      KvBlock& b = held[r];
      out.counts.floats_sent[r] +=
          int64_t(b.dk.size() + b.dv.size()) + (with_kv ? int64_t(b.k.size() + b.v.size()) : 0);
      next[(r + 1) % n] = std::move(b);
    }
    held = std::move(next);
  };
  for (int step = 0; step < n; ++step) {
    for (int r = 0; r < n; ++r) {
      KvBlock& block = held[r];
      const int rows = split.rows(r), kv_rows = split.rows(block.owner);
      for (int bh = 0; bh < s.batch * s.heads_q; ++bh) {
        const int64_t qo = int64_t(bh) * rows * d;
        const int64_t kvo = (int64_t(bh / s.heads_q) * s.heads_kv + s.kv_head(bh % s.heads_q)) * kv_rows * d;
        out.counts.work[r][step] +=
            block_backward(q[r].data() + qo, d_o[r].data() + qo, lse[r].data() + int64_t(bh) * rows,
                           delta[r].data() + int64_t(bh) * rows, split.chunks[r], block.k.data() + kvo,
                           block.v.data() + kvo, split.chunks[block.owner], d, scale, s.causal, out.dq[r].data() + qo,
                           block.dk.data() + kvo, block.dv.data() + kvo, docs);
      }
    }
    if (n > 1) pass_along(/*with_kv=*/step + 1 < n);  // the N-th hop carries dK and dV home
  }
  for (int r = 0; r < n; ++r) {
    if (held[r].owner != r) throw std::logic_error("ring backward: a dK/dV block did not arrive home");
    out.dk.push_back(std::move(held[r].dk));
    out.dv.push_back(std::move(held[r].dv));
  }
  return out;
}
//! [ring_backward]

}  // namespace fa::context_parallel
