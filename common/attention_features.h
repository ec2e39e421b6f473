// Chapter 09's features: what real models add to the problem of problem.h. A sliding window, a
// logit softcap, ALiBi, an additive bias and packed variable-length batches, each off by
// default. They travel beside the AttentionShape (in the harness, the oracle and chapter 09's
// launch parameters), never inside it: a kernel of chapters 01-08 receives the shape alone and
// cannot read a window, even by mistake. WindowMask is the features' mask as a policy of mask.h,
// for chapter 09's kernels and the rules here alike.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "mask.h"
#include "problem.h"

namespace fa {

struct AttentionFeatures {
  /// Windows are aligned bottom-right like the causal mask: query i of a sequence sees key j iff
  /// i + causal_offset() - window_left <= j <= i + causal_offset() + window_right.
  int window_left = -1;   ///< keys to the left of the diagonal a query sees; -1: all of them
  int window_right = -1;  ///< keys to the right; -1: all of them (causal caps it at 0)
  /// Logit softcap (Gemma-2, Grok): a scaled score x becomes softcap * tanh(x / softcap); 0: off.
  double softcap = 0.0;
  /// ALiBi (MPT, BLOOM): adds -slope(h) * |i + causal_offset() - j| to the scaled score, with the
  /// ALiBi paper's slopes (alibi_slope) or the caller's (AttentionExtras::alibi_slopes).
  bool alibi = false;
  /// Adds bias[b][h][i][j] (AttentionExtras::bias, float [batch, heads_q, seq_q, seq_kv]).
  bool bias = false;
  /// A packed variable-length batch of this many sequences (0: a dense batch). They lie end to
  /// end along the seq axis of a shape whose batch is 1, so Q and O are [heads_q, seq_q,
  /// head_dim], K and V [heads_kv, seq_kv, head_dim] and LSE [heads_q, seq_q], where seq_q and
  /// seq_kv are the totals. Sequence b holds query rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1
  /// and keys likewise (AttentionExtras); the masks apply inside each sequence as if it were a
  /// batch of one (sequence_shape()).
  int sequences = 0;

  FA_HD bool varlen() const { return sequences > 0; }
  FA_HD bool windowed() const { return window_left >= 0 || window_right >= 0; }
  /// Whether any feature is on (the Feature bits in registry.h name them).
  FA_HD bool any() const { return windowed() || softcap > 0.0 || alibi || bias || varlen(); }
  /// The dense sequences of the problem: `sequences` when packed, else the shape's batch.
  FA_HD int sequence_count(const AttentionShape& s) const { return varlen() ? sequences : s.batch; }

  /// Throws std::invalid_argument naming the bad field, its value and what is allowed.
  void validate(const AttentionShape& shape) const;

  /// Whether query i sees key j under the causal rule and the window (WindowMask's rule).
  FA_HD bool visible(const AttentionShape& s, int i, int j) const;
  /// One past the last key query row i sees (the causal rule and the right window).
  FA_HD int visible_keys(const AttentionShape& s, int i) const;
  /// The first key query row i sees (0 without a left window).
  FA_HD int first_visible_key(const AttentionShape& s, int i) const;
  /// ALiBi's slope for query head h of heads_q: the geometric sequence 2^(-8/n), 2^(-16/n), ...
  /// for the largest power of two n <= heads_q, then every other slope of the sequence for 2n
  /// for the remaining heads (the ALiBi paper's rule, as BLOOM and MPT build them).
  FA_HD static double alibi_slope(int heads_q, int h) {
    int n = 1;
    while (2 * n <= heads_q) n *= 2;
    if (h < n) return exp2(-8.0 * (h + 1) / n);
    return exp2(-4.0 * (2 * (h - n) + 1) / n);
  }
  /// A scaled score x of (row i, key j) after softcap and ALiBi with `slope` (not the bias tensor).
  FA_HD double modify_score(const AttentionShape& s, double x, double slope, int i, int j) const {
    if (softcap > 0.0) x = softcap * tanh(x / softcap);
    if (alibi) {
      const int distance = i + s.causal_offset() - j;
      x -= slope * (distance < 0 ? -distance : distance);
    }
    return x;
  }
  /// Elements of the bias tensor when `bias` is on.
  FA_HD int64_t bias_elems(const AttentionShape& s) const { return int64_t(s.batch) * s.heads_q * s.seq_q * s.seq_kv; }

  /// Forward FLOPs: 4*d per (query, key) pair the masks leave, counted exactly with a window;
  /// the shape's own count otherwise. A packed batch needs its sequence boundaries
  /// (cu_seqlens_q/_k, sequences + 1 entries each, on the host).
  double forward_flops(const AttentionShape& s, const int* cu_seqlens_q = nullptr,
                       const int* cu_seqlens_k = nullptr) const;
  /// The shape's fewest bytes, and the bias read once.
  double forward_min_bytes(const AttentionShape& s, int element_bytes) const;

  /// "window 256,0 softcap 30 alibi bias varlen 4", "" when no feature is on.
  std::string to_string() const;
  /// The same with only [A-Za-z0-9_], each part led by '_' ("" when no feature is on).
  std::string to_identifier() const;
};

/// Chapter 09's mask policy: the causal rule and the window of one sequence, with mask.h's
/// interface (keys(row), the run form) and the per-score visible(i, j) of chapter 05's tile code.
/// It holds the six integers the rule reads and nothing else, so a kernel keeps them in registers
/// (AttentionFeatures' own rules are this one's).
struct WindowMask {
  int seq_q, seq_kv, offset, left, right;
  bool causal;
  FA_HD WindowMask(const AttentionShape& one, const AttentionFeatures& f)
      : seq_q(one.seq_q),
        seq_kv(one.seq_kv),
        offset(one.causal_offset()),
        left(f.window_left),
        right(f.window_right),
        causal(one.causal) {}
  /// One past the last key row i sees.
  FA_HD int visible_keys(int i) const {
    int n = seq_kv;
    if (causal || right == 0) n = i + offset + 1;
    if (right > 0 && !causal) n = i + offset + right + 1;
    return n < 0 ? 0 : (n > seq_kv ? seq_kv : n);
  }
  /// The first key row i sees.
  FA_HD int first_visible_key(int i) const {
    if (left < 0) return 0;
    const int j = i + offset - left;
    return j < 0 ? 0 : (j > seq_kv ? seq_kv : j);
  }
  FA_HD KeyRun keys(int row) const {
    if (row >= seq_q) return {0, 0};
    return {first_visible_key(row), visible_keys(row)};
  }
  /// The query rows that see key `key`, for tiles held keys x rows (a backward's K/V side): one
  /// run, since both ends of a row's run move right with the row; empty for a key past the end.
  FA_HD KeyRun rows(int key) const {
    if (key >= seq_kv) return {0, 0};
    int begin = 0, end = seq_q;
    if (causal || right == 0) begin = key - offset;  // key <= i + offset
    else if (right > 0) begin = key - offset - right;
    if (left >= 0) end = key - offset + left + 1;  // key >= i + offset - left
    begin = begin < 0 ? 0 : begin;
    end = end > seq_q ? seq_q : end;
    return {begin, end < begin ? begin : end};
  }
  /// The same rule per (i, j), without the clamps to the sequence (the tile code checks its ends).
  FA_HD bool visible(int i, int j) const {
    const int diagonal = i + offset;
    if ((causal || right == 0) && j > diagonal) return false;
    if (right > 0 && j > diagonal + right) return false;
    return left < 0 || j >= diagonal - left;
  }  /// Whether every (row, key) of rows i0 .. i0 + rows - 1 and keys j0 .. j0 + n - 1 is visible
  /// and inside the sequence: such a tile skips the mask.
  //! [window_tile_visible]
  FA_HD bool tile_visible(int i0, int rows, int j0, int n) const {
    const int last_row = i0 + rows - 1;
    return last_row < seq_q && j0 + n <= seq_kv && j0 >= first_visible_key(last_row) && j0 + n <= visible_keys(i0);
  }
  //! [window_tile_visible]
};

FA_HD inline bool AttentionFeatures::visible(const AttentionShape& s, int i, int j) const {
  return j >= first_visible_key(s, i) && j < visible_keys(s, i);
}
FA_HD inline int AttentionFeatures::visible_keys(const AttentionShape& s, int i) const {
  return WindowMask(s, *this).visible_keys(i);
}
FA_HD inline int AttentionFeatures::first_visible_key(const AttentionShape& s, int i) const {
  return WindowMask(s, *this).first_visible_key(i);
}

/// "b2 h16/16 q1024 k1024 d64 causal window 256,0": the shape, then the features when any is on.
std::string describe(const AttentionShape& shape, const AttentionFeatures& features);

/// Chapter 09's inputs beyond Q, K and V, on the host (for the oracle and the CPU algorithms)
/// or on the device (in a kernel's parameters), as the features ask for them.
struct AttentionExtras {
  const float* bias = nullptr;             ///< [batch, heads_q, seq_q, seq_kv] when features.bias
  const int* cu_seqlens_q = nullptr;       ///< [sequences + 1], from 0 to seq_q, when packed
  const int* cu_seqlens_k = nullptr;       ///< [sequences + 1], from 0 to seq_kv, when packed
  int max_seqlen_q = 0, max_seqlen_k = 0;  ///< the longest sequences, when packed
  /// ALiBi's slopes when the caller gives them (flash-attn's alibi_slopes): float [heads_q], or
  /// [sequences, heads_q] (a dense batch's batch) with alibi_slopes_per_sequence; null: the
  /// ALiBi paper's (AttentionFeatures::alibi_slope).
  const float* alibi_slopes = nullptr;
  bool alibi_slopes_per_sequence = false;

  /// The slope of query head h in sequence (or batch) b.
  FA_HD float alibi_slope(const AttentionShape& s, int b, int h) const {
    if (!alibi_slopes) return float(AttentionFeatures::alibi_slope(s.heads_q, h));
    return alibi_slopes[(alibi_slopes_per_sequence ? int64_t(b) * s.heads_q : 0) + h];
  }
};

/// Sequence b of a packed batch (or batch b of a dense one) as a dense batch of one: same heads,
/// causal flag and scale, these lengths.
FA_HD inline AttentionShape sequence_shape(const AttentionShape& s, int len_q, int len_kv) {
  AttentionShape one = s;
  one.batch = 1;
  one.seq_q = len_q;
  one.seq_kv = len_kv;
  return one;
}

}  // namespace fa
