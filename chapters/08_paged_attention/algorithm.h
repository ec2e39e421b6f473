// Chapter 08 on the CPU: decoding one token per sequence from a paged KV cache, split-KV style
// (flash-decoding). Each sequence's context is cut into partitions of `partition_tokens`
// tokens (a multiple of the block size, so a partition is whole blocks). Each partition yields
// its own normalized O_p and LSE_p; the merge is chapter 03's online-softmax merge done once:
//   LSE = log sum_p exp(LSE_p),   O = sum_p exp(LSE_p - LSE) O_p.
// It is exact (up to rounding) for any partition size, which the tests check against the fp64
// oracle (reference_paged_decode in common/reference.h). The GPU kernels run the same plan:
// one thread block per (sequence, head, partition), then a reduce kernel for the merge.
#pragma once

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "not_implemented.h"
#include "reference.h"

namespace fa::paged {

/// Writes one token's K and V rows (heads_kv x head_dim each) into a paged cache laid out as
/// PagedKvView describes: position `pos` of the sequence whose block table is `table`.
inline void write_token(std::vector<float>& k_cache, std::vector<float>& v_cache, const PagedKvView& layout,
                        const std::vector<int>& table, int pos, const float* k, const float* v) {
  const int block = table.at(pos / layout.block_size), row = pos % layout.block_size, d = layout.head_dim;
  for (int h = 0; h < layout.heads_kv; ++h) {
    const int64_t at = layout.row_offset(block, h, row);
    std::copy(k + int64_t(h) * d, k + int64_t(h + 1) * d, k_cache.begin() + at);
    std::copy(v + int64_t(h) * d, v + int64_t(h + 1) * d, v_cache.begin() + at);
  }
}

/// Performs the block manager's copy-on-write copies (BlockCopy in block_manager.h) on a paged
/// cache: every slot of every K/V head of block `from` into block `to`, for K and V.
template <class Copies>
inline void copy_blocks(std::vector<float>& k_cache, std::vector<float>& v_cache, const PagedKvView& layout,
                        const Copies& copies) {
  const int64_t block_floats = int64_t(layout.heads_kv) * layout.block_size * layout.head_dim;
  for (const auto& c : copies)
    for (std::vector<float>* cache : {&k_cache, &v_cache})
      std::copy(cache->begin() + c.from * block_floats, cache->begin() + (c.from + 1) * block_floats,
                cache->begin() + c.to * block_floats);
}

/// The exact merge of one row's partitions, each a normalized O_p (partial_o: d values per
/// partition) and its LSE_p, into the row's O (d values) and *lse: chapter 03's merge done once.
inline void merge_partitions_cpu(const std::vector<float>& partial_o, const std::vector<float>& partial_lse, int d,
                                 float* oh, float* lse) {
  // BEGIN SOLUTION ch08_merge_cpu: merge the partitions' (partial_o, partial_lse) into oh (d values) and *lse: LSE = log sum_p exp(LSE_p) taken around the largest LSE_p, O = sum_p exp(LSE_p - LSE) O_p; no partitions (an empty context): O = 0, LSE = -inf
  std::fill(oh, oh + d, 0.0f);
  if (partial_lse.empty()) {
    *lse = -INFINITY;
    return;
  }
  const float top = *std::max_element(partial_lse.begin(), partial_lse.end());
  float sum = 0.0f;
  for (float x : partial_lse) sum += std::exp(x - top);
  const float total = top + std::log(sum);
  for (std::size_t p = 0; p < partial_lse.size(); ++p) {
    const float w = std::exp(partial_lse[p] - total);
    for (int x = 0; x < d; ++x) oh[x] += w * partial_o[p * d + x];
  }
  *lse = total;
  // END SOLUTION
}

//! [split_kv_decode]
/// o [num_seqs][heads_q][head_dim] and lse [num_seqs][heads_q] for one query token per
/// sequence, in float, partition by partition, then merged.
inline void split_kv_decode_cpu(const PagedKvView& cache, int heads_q, const float* q,
                                const std::vector<std::vector<int>>& block_tables, const std::vector<int>& context_lens,
                                int partition_tokens, float* o, float* lse) {
  if (partition_tokens <= 0 || partition_tokens % cache.block_size != 0)
    throw std::invalid_argument("partition_tokens must be a positive multiple of the block size (" +
                                std::to_string(cache.block_size) + "), got " + std::to_string(partition_tokens));
  const int d = cache.head_dim, group = heads_q / cache.heads_kv;
  const float scale = 1.0f / std::sqrt(float(d));
  std::vector<float> partial_o, partial_lse, acc(d);
  for (std::size_t s = 0; s < context_lens.size(); ++s) {
    const int len = context_lens[s];
    for (int h = 0; h < heads_q; ++h) {
      const float* qh = q + (s * heads_q + h) * d;
      partial_o.clear();
      partial_lse.clear();
      for (int start = 0; start < len; start += partition_tokens) {  // one thread block each on the GPU
        const int end = std::min(len, start + partition_tokens);
        std::vector<float> scores(end - start);
        float m = -INFINITY;
        for (int t = start; t < end; ++t) {
          const float* kt =
              cache.k + cache.row_offset(block_tables[s][t / cache.block_size], h / group, t % cache.block_size);
          float dot = 0.0f;
          for (int x = 0; x < d; ++x) dot += qh[x] * kt[x];
          scores[t - start] = dot * scale;
          m = std::max(m, scores[t - start]);
        }
        float l = 0.0f;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int t = start; t < end; ++t) {
          const float p = std::exp(scores[t - start] - m);
          const float* vt =
              cache.v + cache.row_offset(block_tables[s][t / cache.block_size], h / group, t % cache.block_size);
          l += p;
          for (int x = 0; x < d; ++x) acc[x] += p * vt[x];
        }
        for (int x = 0; x < d; ++x) partial_o.push_back(acc[x] / l);
        partial_lse.push_back(m + std::log(l));
      }
      // The reduce: weights exp(LSE_p - LSE) sum to 1.
      merge_partitions_cpu(partial_o, partial_lse, d, o + (s * heads_q + h) * d, &lse[s * heads_q + h]);
    }
  }
}
//! [split_kv_decode]

}  // namespace fa::paged
