// Chapter 09's features as small host/device functions, shared by the CPU algorithm
// (algorithm.h) and the kernels, so both read the same rule:
//   * sequence_rows: where sequence b of a packed batch (or batch b of a dense one) starts, and
//     its dense shape -- a packed batch is a list of batches of one;
//   * WindowMask (attention_features.h): the causal rule and the window as a mask policy, each
//     row's run of visible keys;
//   * tile_keys: which K/V tiles a window leaves a Q tile (the mask policy's tile_visible says
//     which of those need no mask);
//   * rows_for_keys: the backward's view of the same, which Q rows see a K/V tile;
//   * the score changes (softcap, ALiBi, the bias), applied to a scaled score before the mask:
//     modified_score is the rule per score, which the CPU algorithm applies; the kernels apply
//     it tile by tile (modify_scores, modify_tile, the backward's score loop), with what it
//     needs per block in ScoreChanges.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attention_features.h"
#include "not_implemented.h"
#include "problem.h"

namespace fa::features {

/// One (sequence, query head) of a batch: its dense shape (batch 1) and where its rows start.
struct SequenceRows {
  AttentionShape shape;        // seq_q, seq_kv: this sequence's lengths; the masks apply inside it
  AttentionFeatures features;  // the problem's, without the packing
  int head = 0;
  int sequence = 0;     // b: the sequence of a packed batch, or the batch of a dense one
  int64_t q_row0 = 0;   // row 0 of this head in Q, O (times head_dim) and LSE
  int64_t kv_row0 = 0;  // row 0 of its K/V head in K and V (times head_dim)
  int64_t bias0 = 0;    // element 0 of its [seq_q][seq_kv] bias, when shape.bias
  // The same rows as (plane, row in plane) of the [planes][seq][head_dim] tensors, for TMA.
  int q_plane = 0, kv_plane = 0, q_start = 0, kv_start = 0;
  FA_HD WindowMask mask() const { return WindowMask(shape, features); }
};

/// The mask policy `Mask` for this sequence: chapter 09's WindowMask, or mask.h's CausalMask for
/// a kernel compiled for a problem without a window.
template <class Mask>
FA_HD Mask sequence_mask(const SequenceRows& seq) {
  if constexpr (std::is_same_v<Mask, WindowMask>) return seq.mask();
  else return Mask(seq.shape);
}

//! [sequence_rows]
FA_HD inline SequenceRows sequence_rows(const AttentionShape& s, const AttentionFeatures& f, const AttentionExtras& e,
                                        int b, int head) {
  SequenceRows r;
  r.head = head;
  r.sequence = b;
  r.features = f;
  r.features.sequences = 0;
  if (f.varlen()) {
    // Sequence b is rows cu_seqlens[b] .. cu_seqlens[b + 1] - 1 of every head's packed rows.
    const int q0 = e.cu_seqlens_q[b], k0 = e.cu_seqlens_k[b];
    r.shape = sequence_shape(s, e.cu_seqlens_q[b + 1] - q0, e.cu_seqlens_k[b + 1] - k0);
    r.q_plane = head;
    r.kv_plane = s.kv_head(head);
    r.q_start = q0;
    r.kv_start = k0;
  } else {
    r.shape = sequence_shape(s, s.seq_q, s.seq_kv);
    r.q_plane = b * s.heads_q + head;
    r.kv_plane = b * s.heads_kv + s.kv_head(head);
  }
  r.q_row0 = int64_t(r.q_plane) * s.seq_q + r.q_start;
  r.kv_row0 = int64_t(r.kv_plane) * s.seq_kv + r.kv_start;
  r.bias0 = f.varlen() ? 0 : r.q_row0 * s.seq_kv;
  return r;
}
//! [sequence_rows]

/// Keys [begin, end) a tile of query rows first_row .. last_row visits, begin rounded down to a
/// multiple of `tile`: the window's left edge moves right with the row, so the first row sees
/// the first key and the last row the last.
struct KeySpan {
  int begin = 0, end = 0;
};
//! [tile_keys]
template <class Mask>
FA_HD inline KeySpan tile_keys(const Mask& mask, int first_row, int last_row, int tile) {
  KeySpan span;
  // BEGIN SOLUTION ch09_window_tiles_cpu: span.begin = the first row's first visible key (mask.keys(row).begin), rounded down to a multiple of tile; span.end = one past the last row's last visible key (mask.keys(row).end)
  span.begin = mask.keys(first_row).begin / tile * tile;
  span.end = mask.keys(last_row).end;
  // END SOLUTION
  return span;
}
//! [tile_keys]

/// Query rows [begin, end) whose visible keys overlap keys j0 .. j1 - 1: a row's run of keys
/// moves right with the row at both ends, so these rows are one run too, found by two binary
/// searches (the backward's K/V-side loop visits only them). Rows inside may still see none.
FA_HD inline KeySpan rows_for_keys(const WindowMask& mask, int j0, int j1) {
  KeySpan rows;
  // BEGIN SOLUTION ch09_window_tiles_cpu: rows.begin = the first row whose run ends after j0 (mask.visible_keys(row) > j0), rows.end = the first row from there whose run starts at or after j1 (mask.first_visible_key(row) >= j1), each found by a binary search over rows 0 .. mask.seq_q (seq_q when there is none)
  int lo = 0, hi = mask.seq_q;  // the first row whose run ends after j0
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (mask.visible_keys(mid) > j0) hi = mid;
    else lo = mid + 1;
  }
  rows.begin = lo;
  hi = mask.seq_q;  // the first row whose run starts at or after j1
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (mask.first_visible_key(mid) >= j1) hi = mid;
    else lo = mid + 1;
  }
  rows.end = lo;
  // END SOLUTION
  return rows;
}

/// A kernel cannot throw, so the launchers of this chapter's kernels call this first: in a
/// student copy it says "not implemented" until tile_keys and rows_for_keys above are written.
inline void require_window_tiles() {
  // BEGIN SOLUTION ch09_window_tiles_cpu: write tile_keys and rows_for_keys above, then delete this line
  // END SOLUTION
}

/// tanh on the special-function unit (one MUFU.TANH, about 2^-11 relative error: finer than the
/// bf16 rounding of P that follows) on the GPU; std::tanh on the CPU.
FA_HD inline float fast_tanh(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return std::tanh(x);
#endif
}

/// A scaled score x of (row i, key j) with softcap, ALiBi (slope: this head's) and the bias
/// (bias_rows: element 0 of this head's [seq_q][seq_kv] bias; null for none, and for a (row,
/// key) outside the sequence, which the mask removes anyway). The mask comes after.
//! [modified_score]
FA_HD inline float modified_score(const AttentionShape& s, const AttentionFeatures& f, float x, float slope, int i,
                                  int j, const float* bias_rows) {
  if (f.softcap > 0.0) x = float(f.softcap) * fast_tanh(x * float(1.0 / f.softcap));  // Gemma-2: 50, Grok: 30
  const int distance = i + s.causal_offset() - j;
  if (f.alibi) x -= slope * float(distance < 0 ? -distance : distance);  // MPT, BLOOM: a penalty growing with distance
  if (bias_rows) x += bias_rows[int64_t(i) * s.seq_kv + j];              // anything else, as a tensor
  return x;
}
//! [modified_score]

/// A block's score changes, with what can be worked out once per block worked out (the kernels'
/// arrangement of modified_score).
struct ScoreChanges {
  float scale;          ///< the softmax scale
  float cap;            ///< the softcap, or 0
  float scale_per_cap;  ///< scale / cap: tanh's argument is the raw score times this
  float slope;          ///< this head's ALiBi slope, or 0
  const float* bias;    ///< this head's [seq_q][seq_kv] bias, or null
};

FA_HD inline ScoreChanges score_changes(const AttentionShape& s, const SequenceRows& seq, const AttentionExtras& e) {
  const AttentionFeatures& f = seq.features;
  const float scale = float(s.softmax_scale()), cap = float(f.softcap);
  return {scale, cap, cap > 0.0f ? scale / cap : 0.0f, f.alibi ? e.alibi_slope(s, seq.sequence, seq.head) : 0.0f,
          f.bias ? e.bias + seq.bias0 : nullptr};
}

}  // namespace fa::features
