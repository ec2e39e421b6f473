// The mask as a compile-time policy in per-row run form. Every mask this tutorial meets leaves
// each query row one run of visible keys, [begin, end): a policy computes that run once per row
// and a tile then costs two compares per score, whatever rule made the run. A tile wholly
// inside every row's run skips the mask; one wholly outside is never visited.
//
// CausalMask<kCausal> is the rule of chapters 01-08 (none, or causal aligned bottom-right);
// chapter 09 brings its own, WindowMask, with the sliding window (attention_features.h). A kernel
// compiled with CausalMask carries no window arithmetic at all.
#pragma once

#include <cmath>

#include "problem.h"

// Full unrolling in nvcc's device pass; nothing for the host compiler, which warns on the pragma.
#if defined(__CUDA_ARCH__)
#define FA_UNROLL _Pragma("unroll")
#else
#define FA_UNROLL
#endif

namespace fa {

/// The keys one query row sees: begin .. end - 1 (empty when end <= begin). Held the other way
/// round (rows(key)), the query rows that see one key.
struct KeyRun {
  int begin = 0, end = 0;
};

/// No mask (kCausal false) or the causal mask, as AttentionShape::visible states it.
template <bool kCausal>
struct CausalMask {
  int seq_q, seq_kv, offset;
  FA_HD explicit CausalMask(const AttentionShape& s) : seq_q(s.seq_q), seq_kv(s.seq_kv), offset(s.causal_offset()) {}
  /// Row `row`'s run; empty for a row past the end of Q.
  FA_HD KeyRun keys(int row) const {
    if (row >= seq_q) return {0, 0};
    if (!kCausal) return {0, seq_kv};
    const int end = row + offset + 1;
    return {0, end < 0 ? 0 : (end > seq_kv ? seq_kv : end)};
  }
  /// The query rows that see key `key`, for tiles held keys x rows (chapter 07's dK/dV kernels);
  /// empty for a key past the end of K.
  FA_HD KeyRun rows(int key) const {
    if (key >= seq_kv) return {0, 0};
    if (!kCausal) return {0, seq_q};
    const int begin = key - offset;
    return {begin < 0 ? 0 : begin, seq_q};
  }
  /// Whether row i sees key j, both inside the sequence: the rule per score, for tile code that
  /// masks score by score (chapter 05's tuned_mask).
  FA_HD bool visible(int i, int j) const { return !kCausal || j <= i + offset; }
  /// Whether keys [j0, j0 + n) are visible to every row of [i0, i0 + rows): the tile needs no mask.
  FA_HD bool tile_visible(int i0, int rows, int j0, int n) const {
    return i0 + rows <= seq_q && j0 + n <= (kCausal ? keys(i0).end : seq_kv);
  }
};

/// `hidden` (-inf for scores, 0 for probabilities) outside each row's run, on the accumulator
/// fragment of mma.sync m16n8 and of wgmma m64nN (the same per-warp layout): element 4c + e of `s`
/// is row 8 * (e / 2) of the thread's pair of rows and key first_key + 8c + (e & 1), where
/// first_key is the thread's first column (the tile's first key + 2 * (lane % 4)). runs[h]: the
/// run of the thread's row h (row g, row g + 8).
template <int kElems>
FA_HD inline void mask_fragment(float (&s)[kElems], const KeyRun (&runs)[2], int first_key, float hidden = -INFINITY) {
  //! [mask_fragment]
  int lo[2], hi[2];  // the runs as offsets from first_key: a compare against a constant per score
  FA_UNROLL
  for (int h = 0; h < 2; ++h) {
    lo[h] = runs[h].begin - first_key;
    hi[h] = runs[h].end - first_key;
  }
  FA_UNROLL
  for (int i = 0; i < kElems; ++i) {
    const int h = (i % 4) / 2, offset = 8 * (i / 4) + (i & 1);
    if (offset < lo[h] || offset >= hi[h]) s[i] = hidden;
  }
  //! [mask_fragment]
}

/// mask_fragment on fragments held as [block of 8 columns][4] (chapter 07's mma kernels).
template <int kBlocks>
FA_HD inline void mask_fragment(float (&s)[kBlocks][4], const KeyRun (&runs)[2], int first_key,
                                float hidden = -INFINITY) {
  mask_fragment(reinterpret_cast<float(&)[4 * kBlocks]>(s), runs, first_key, hidden);
}

/// The run of `row` under the shape's own rule (causal or none), chosen per row at run time: one
/// select per row, not per score, for kernels that take `causal` as a run-time flag.
FA_HD inline KeyRun shape_keys(const AttentionShape& s, int row) {
  return s.causal ? CausalMask<true>(s).keys(row) : CausalMask<false>(s).keys(row);
}

/// The rows that see `key` under the shape's own rule, chosen at run time as shape_keys is.
FA_HD inline KeyRun shape_rows(const AttentionShape& s, int key) {
  return s.causal ? CausalMask<true>(s).rows(key) : CausalMask<false>(s).rows(key);
}

/// The same for a thread's rows row0 and row0 + 8 under `mask` (any policy with keys(row)).
template <class Mask, int kElems>
FA_HD inline void mask_rows(float (&s)[kElems], const Mask& mask, int row0, int first_key) {
  const KeyRun runs[2] = {mask.keys(row0), mask.keys(row0 + 8)};
  mask_fragment(s, runs, first_key);
}

}  // namespace fa
