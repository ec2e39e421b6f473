// The attention problem every chapter solves, and its checks.
//
// O = softmax(scale * Q K^T + mask) V for each (batch, query head), with
// Q [batch, heads_q, seq_q, head_dim], K and V [batch, heads_kv, seq_kv, head_dim], O like Q,
// and LSE [batch, heads_q, seq_q] = log(sum_j exp(scale * q.k_j)) over the visible keys.
// Query head h reads key/value head h / (heads_q / heads_kv) (GQA; MQA when heads_kv == 1).
// Causal masking is aligned bottom-right: query i sees key j iff j <= i + (seq_kv - seq_q),
// so the last query sees every key. A query that sees no key gets O = 0 and LSE = -inf.
//
// Chapter 09 adds what real models need, each off by default: a sliding window, a logit softcap,
// ALiBi, an additive bias, and packed variable-length batches (AttentionShape's fields below;
// the bias and the sequence boundaries come in AttentionExtras). Kernels before chapter 09 take
// none of them, and the registry says so.
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

  // Chapter 09. Windows are aligned bottom-right like the causal mask: query i of a sequence
  // sees key j iff i + causal_offset() - window_left <= j <= i + causal_offset() + window_right.
  int window_left = -1;   ///< keys to the left of the diagonal a query sees; -1: all of them
  int window_right = -1;  ///< keys to the right; -1: all of them (causal caps it at 0)
  /// Logit softcap (Gemma-2, Grok): a scaled score x becomes softcap * tanh(x / softcap); 0: off.
  double softcap = 0.0;
  /// ALiBi (MPT, BLOOM): adds -alibi_slope(h) * |i + causal_offset() - j| to the scaled score.
  bool alibi = false;
  /// Adds bias[b][h][i][j] (AttentionExtras::bias, float [batch, heads_q, seq_q, seq_kv]).
  bool bias = false;
  /// Packed variable-length batch: `batch` sequences laid end to end along the seq axis, so Q,
  /// O are [heads_q, seq_q, head_dim], K, V [heads_kv, seq_kv, head_dim] and LSE [heads_q,
  /// seq_q], where seq_q and seq_kv are the totals. Sequence b holds query rows cu_seqlens_q[b]
  /// .. cu_seqlens_q[b + 1] - 1 and keys likewise (AttentionExtras); the masks apply inside each
  /// sequence as if it were a batch of one (sequence_shape()).
  bool varlen = false;

  /// Throws std::invalid_argument naming the bad field, its value and what is allowed.
  void validate() const;

  FA_HD double softmax_scale() const { return scale > 0.0 ? scale : 1.0 / sqrt(double(head_dim)); }
  FA_HD int group_size() const { return heads_q / heads_kv; }
  FA_HD int kv_head(int query_head) const { return query_head / group_size(); }
  /// Query i sees key j iff j <= i + causal_offset() (only when causal).
  FA_HD int causal_offset() const { return seq_kv - seq_q; }
  FA_HD bool visible(int i, int j) const {
    const int diagonal = i + causal_offset();
    if ((causal || window_right == 0) && j > diagonal) return false;
    if (window_right > 0 && j > diagonal + window_right) return false;
    return window_left < 0 || j >= diagonal - window_left;
  }
  /// How many keys query row i sees: they are keys 0 .. visible_keys(i) - 1 (without a left
  /// window; with one, first_visible_key(i) .. visible_keys(i) - 1).
  FA_HD int visible_keys(int i) const {
    int n = seq_kv;
    if (causal || window_right == 0) n = i + causal_offset() + 1;
    if (window_right > 0 && !causal) n = i + causal_offset() + window_right + 1;
    return n < 0 ? 0 : (n > seq_kv ? seq_kv : n);
  }
  /// The first key query row i sees (0 without a left window).
  FA_HD int first_visible_key(int i) const {
    if (window_left < 0) return 0;
    const int j = i + causal_offset() - window_left;
    return j < 0 ? 0 : (j > seq_kv ? seq_kv : j);
  }
  /// ALiBi's slope for query head h of heads_q: the geometric sequence 2^(-8/n), 2^(-16/n), ...
  /// for the largest power of two n <= heads_q, then every other slope of the sequence for 2n
  /// for the remaining heads (the ALiBi paper's rule, as BLOOM and MPT build them).
  FA_HD double alibi_slope(int h) const {
    int n = 1;
    while (2 * n <= heads_q) n *= 2;
    if (h < n) return exp2(-8.0 * (h + 1) / n);
    return exp2(-4.0 * (2 * (h - n) + 1) / n);
  }
  /// A scaled score x of (head h, row i, key j) after softcap and ALiBi (not the bias tensor).
  FA_HD double modify_score(double x, int h, int i, int j) const {
    if (softcap > 0.0) x = softcap * tanh(x / softcap);
    if (alibi) {
      const int distance = i + causal_offset() - j;
      x -= alibi_slope(h) * (distance < 0 ? -distance : distance);
    }
    return x;
  }
  /// Sequence b of a packed batch as a dense batch of one: same heads, masks and scale.
  FA_HD AttentionShape sequence_shape(int len_q, int len_kv) const {
    AttentionShape s = *this;
    s.batch = 1;
    s.seq_q = len_q;
    s.seq_kv = len_kv;
    s.varlen = false;
    return s;
  }
  /// Whether any chapter 09 feature is on (the Feature bits in registry.h name them).
  FA_HD bool has_features() const {
    return window_left >= 0 || window_right >= 0 || softcap > 0.0 || alibi || bias || varlen;
  }
  /// Element offset of head `bh` = batch * heads_q + query_head in Q and O ...
  FA_HD int64_t q_head_offset(int bh) const { return int64_t(bh) * seq_q * head_dim; }
  /// ... and of the K/V head that query head reads.
  FA_HD int64_t kv_head_offset(int bh) const {
    return (int64_t(bh / heads_q) * heads_kv + kv_head(bh % heads_q)) * seq_kv * head_dim;
  }

  /// Leading [batch] extent of the tensors: 1 for a packed batch, whose sequences share the seq axis.
  FA_HD int packs() const { return varlen ? 1 : batch; }
  FA_HD int64_t q_elems() const { return int64_t(packs()) * heads_q * seq_q * head_dim; }
  FA_HD int64_t kv_elems() const { return int64_t(packs()) * heads_kv * seq_kv * head_dim; }
  FA_HD int64_t o_elems() const { return q_elems(); }
  FA_HD int64_t lse_elems() const { return int64_t(packs()) * heads_q * seq_q; }
  /// Elements of one [seq_q, seq_kv] score matrix per (batch, query head), all heads together.
  FA_HD int64_t score_elems() const { return int64_t(packs()) * heads_q * seq_q * seq_kv; }
  /// Elements of the bias tensor when `bias` is on.
  FA_HD int64_t bias_elems() const { return int64_t(batch) * heads_q * seq_q * seq_kv; }

  /// Forward FLOPs by the FlashAttention papers' convention: 4*B*H*Nq*Nk*d, halved when causal.
  /// With a window, 4*d per (query, key) pair the mask leaves, counted exactly. A packed batch
  /// needs its sequence boundaries (cu_seqlens_q/_k, batch + 1 entries each, on the host).
  double forward_flops(const int* cu_seqlens_q = nullptr, const int* cu_seqlens_k = nullptr) const;
  /// The fewest bytes a forward kernel must move: Q, K, V (and a bias) read once, O and LSE
  /// written once.
  double forward_min_bytes(int element_bytes) const;

  /// "b2 h16/16 q1024 k1024 d64 causal" -- short and human-readable; chapter 09's features
  /// follow ("window 256,0 softcap 30 alibi bias varlen").
  std::string to_string() const;
  /// Chapter 09's part of to_string(), "" when no feature is on.
  std::string feature_string() const;
  /// Same content with only [A-Za-z0-9_], for test names and file names.
  std::string to_identifier() const;
};

/// Chapter 09's inputs beyond Q, K and V, on the host (for the oracle and the CPU algorithms)
/// or on the device (in a kernel's parameters), as the shape asks for them.
struct AttentionExtras {
  const float* bias = nullptr;             ///< [batch, heads_q, seq_q, seq_kv] when shape.bias
  const int* cu_seqlens_q = nullptr;       ///< [batch + 1], from 0 to seq_q, when shape.varlen
  const int* cu_seqlens_k = nullptr;       ///< [batch + 1], from 0 to seq_kv, when shape.varlen
  int max_seqlen_q = 0, max_seqlen_k = 0;  ///< the longest sequences, when shape.varlen
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
