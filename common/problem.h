// The attention problem every chapter solves, and its checks.
//
// O = softmax(scale * Q K^T + mask) V for each (batch, query head), with
// Q [batch, heads_q, seq_q, head_dim], K and V [batch, heads_kv, seq_kv, head_dim], O like Q,
// and LSE [batch, heads_q, seq_q] = log(sum_j exp(scale * q.k_j)) over the visible keys.
// Query head h reads key/value head h / (heads_q / heads_kv) (GQA; MQA when heads_kv == 1).
// Causal masking is aligned bottom-right: query i sees key j iff j <= i + (seq_kv - seq_q),
// so the last query sees every key. A query that sees no key gets O = 0 and LSE = -inf.
//
// This is the problem of chapter 01 and nothing more: chapter 09's windows, softcap, ALiBi,
// bias and packed batches are a type of their own (features.h), carried beside it.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>

#if defined(__CUDACC__)
#define FA_HD __host__ __device__
#else
#define FA_HD
#endif

namespace fa {

/// Plain data with host/device helpers, so kernels take it by value and share the mask rule.
struct AttentionShape {
  int batch = 1;
  int heads_q = 1;
  int heads_kv = 1;
  int seq_q = 1;
  int seq_kv = 1;
  int head_dim = 64;
  bool causal = false;
  /// Softmax scale; 0 means the usual 1/sqrt(head_dim).
  double scale = 0.0;

  /// Throws std::invalid_argument naming the bad field, its value and what is allowed.
  void validate() const;

  FA_HD double softmax_scale() const { return scale > 0.0 ? scale : 1.0 / sqrt(double(head_dim)); }
  FA_HD int group_size() const { return heads_q / heads_kv; }
  FA_HD int kv_head(int query_head) const { return query_head / group_size(); }
  /// Query i sees key j iff j <= i + causal_offset() (only when causal).
  FA_HD int causal_offset() const { return seq_kv - seq_q; }
  FA_HD bool visible(int i, int j) const { return !causal || j <= i + causal_offset(); }
  /// How many keys query row i sees: they are keys 0 .. visible_keys(i) - 1.
  FA_HD int visible_keys(int i) const {
    if (!causal) return seq_kv;
    int n = i + causal_offset() + 1;
    return n < 0 ? 0 : (n > seq_kv ? seq_kv : n);
  }
  /// Element offset of head `bh` = batch * heads_q + query_head in Q and O ...
  FA_HD int64_t q_head_offset(int bh) const { return int64_t(bh) * seq_q * head_dim; }
  /// ... and of the K/V head that query head reads.
  FA_HD int64_t kv_head_offset(int bh) const {
    return (int64_t(bh / heads_q) * heads_kv + kv_head(bh % heads_q)) * seq_kv * head_dim;
  }

  FA_HD int64_t q_elems() const { return int64_t(batch) * heads_q * seq_q * head_dim; }
  FA_HD int64_t kv_elems() const { return int64_t(batch) * heads_kv * seq_kv * head_dim; }
  FA_HD int64_t o_elems() const { return q_elems(); }
  FA_HD int64_t lse_elems() const { return int64_t(batch) * heads_q * seq_q; }
  /// Elements of one [seq_q, seq_kv] score matrix per (batch, query head), all heads together.
  FA_HD int64_t score_elems() const { return int64_t(batch) * heads_q * seq_q * seq_kv; }

  /// Forward FLOPs by the FlashAttention papers' convention: 4*B*H*Nq*Nk*d, halved when causal.
  double forward_flops() const;
  /// The fewest bytes a forward kernel must move: Q, K, V read once, O and LSE written once.
  double forward_min_bytes(int element_bytes) const;

  /// "b2 h16/16 q1024 k1024 d64 causal" -- short and human-readable.
  std::string to_string() const;
  /// Same content with only [A-Za-z0-9_], for test names and file names.
  std::string to_identifier() const;
};

/// Chapter 08: one step of attention over a paged KV cache. Each of num_seqs sequences has
/// context_lens[s] tokens in the cache (block size block_size, a block table of up to
/// max_blocks_per_seq entries into a pool of num_blocks blocks) and query_len query tokens:
/// the last query_len tokens of its context, causal among themselves (bottom-right, as in
/// AttentionShape). query_len 1 is decode; more is a prefill chunk over the cache.
/// Q and O are [num_seqs, heads_q, query_len, head_dim] -- AttentionShape's layout with
/// batch = num_seqs -- LSE [num_seqs, heads_q, query_len]; K and V caches are
/// [num_blocks, heads_kv, block_size, head_dim] (PagedKvView in reference.h).
struct DecodeShape {
  int num_seqs = 1;
  int heads_q = 32;
  int heads_kv = 8;
  int head_dim = 128;
  int query_len = 1;
  int block_size = 16;
  int num_blocks = 1;
  int max_blocks_per_seq = 1;
  int max_context = 0;  // the longest context; kernels plan their split from it

  /// Throws std::invalid_argument naming the bad field, its value and what is allowed.
  void validate() const;
  FA_HD int group_size() const { return heads_q / heads_kv; }
  FA_HD int64_t q_elems() const { return int64_t(num_seqs) * heads_q * query_len * head_dim; }
  FA_HD int64_t lse_elems() const { return int64_t(num_seqs) * heads_q * query_len; }
  FA_HD int64_t cache_elems() const { return int64_t(num_blocks) * heads_kv * block_size * head_dim; }
  /// The [num_seqs, heads_q, query_len, head_dim] layout of Q and O as an AttentionShape
  /// (seq_kv = max_context), for the comparison code shared with the forward kernels.
  AttentionShape output_layout() const;
  /// "s8 h32/8 q1 ctx<=8192 d128 bs16"
  std::string to_string() const;
  std::string to_identifier() const;
};

/// "" if head_dim is one of `allowed`, else "head_dim must be 64, 96, 128 or 256, got 80": the
/// reason a kernel built for a fixed list of head dims gives for any other.
std::string head_dim_reason(int head_dim, std::initializer_list<int> allowed);

}  // namespace fa
