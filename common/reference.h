// The CPU oracle: attention in double precision with Eigen, the one reference every kernel and
// every algorithm.h is compared with.
//
// Big problems are checked on a sample: a CheckPlan names which (batch, head) pairs and which
// query rows to compute, so `--check` stays fast at 16k tokens while small shapes (and every
// test) are checked in full.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attention_features.h"
#include "problem.h"

namespace fa {

/// Some query rows of one (batch, query head).
struct HeadRows {
  int batch = 0;
  int head = 0;
  std::vector<int> rows;
};

struct CheckPlan {
  std::vector<HeadRows> heads;
  bool full = false;

  int64_t row_count() const;
  /// "all 64 heads x 1024 rows" or "4 of 512 heads x 64 of 16384 rows (sampled)".
  std::string describe(const AttentionShape& shape) const;
};

/// Every row of every head, ordered by batch, then head, then row.
CheckPlan full_check_plan(const AttentionShape& shape);
/// The first and last head plus random ones, each with its first and last row plus random ones.
CheckPlan sampled_check_plan(const AttentionShape& shape, uint64_t seed, int max_heads = 4, int max_rows = 64);
/// Full when the oracle's work is small (under ~2^29 multiply-adds), sampled otherwise.
CheckPlan choose_check_plan(const AttentionShape& shape, uint64_t seed);

/// Oracle output for the rows of a CheckPlan, in plan order.
struct ForwardReference {
  /// o[e] holds rows x head_dim values of plan entry e, row-major; lse[e] one value per row.
  std::vector<std::vector<double>> o;
  std::vector<std::vector<double>> lse;
};

/// Forward oracle on the rows of `plan`. q/k/v are the exact inputs the kernel saw (already
/// rounded to its dtype), laid out [batch, heads, seq, head_dim] (a packed batch: batch 1).
/// Chapter 09's `features` (none by default) come with `extras`: the bias and the sequence
/// boundaries on the host, when the features ask for them.
ForwardReference reference_forward(const AttentionShape& shape, const float* q, const float* k, const float* v,
                                   const CheckPlan& plan, const AttentionFeatures& features = {},
                                   const AttentionExtras* extras = nullptr);

/// Backward oracle for the loss L = sum(O * dO): returns dQ, dK, dV (and O and LSE on the way).
/// dK and dV of a shared K/V head are summed over the query heads that read it (GQA/MQA).
/// The bias is a constant: no gradient is taken for it.
struct BackwardReference {
  std::vector<double> o, lse, dq, dk, dv;
};
BackwardReference reference_backward(const AttentionShape& shape, const float* q, const float* k, const float* v,
                                     const float* d_out, const AttentionFeatures& features = {},
                                     const AttentionExtras* extras = nullptr);

/// A paged KV cache (chapter 08): K and V each [num_blocks][heads_kv][block_size][head_dim], so
/// one (block, K/V head) is block_size contiguous rows. Token t of a sequence with block table
/// `table` is row t % block_size of physical block table[t / block_size].
struct PagedKvView {
  int num_blocks = 0, block_size = 16, heads_kv = 1, head_dim = 64;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t row_offset(int block, int kv_head, int row) const {
    return ((int64_t(block) * heads_kv + kv_head) * block_size + row) * head_dim;
  }
};

/// Paged-cache oracle (chapter 08). Sequence s has context_lens[s] tokens, reached through
/// block_tables[s], and query_len query tokens: the last query_len of its context, causal among
/// themselves (bottom-right; query_len 1 is a decode step). q is [num_seqs][heads_q][query_len]
/// [head_dim], o the same, lse [num_seqs][heads_q][query_len]; softmax scale 1/sqrt(head_dim),
/// GQA by heads_q / heads_kv. A query row that sees no key (an empty context) gets O = 0 and
/// LSE = -inf. It gathers each sequence's K/V rows and runs reference_forward on them.
struct DecodeReference {
  std::vector<double> o, lse;
};
DecodeReference reference_paged_decode(const PagedKvView& cache, int heads_q, const float* q,
                                       const std::vector<std::vector<int>>& block_tables,
                                       const std::vector<int>& context_lens, int query_len = 1);

}  // namespace fa
