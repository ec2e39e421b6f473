// Chapter 06 on the CPU: FlashAttention-3's FP8 recipe, to measure what it costs in accuracy
// without a GPU. Q, K and V are quantized to e4m3 with one scale per block of rows (block
// quantization), optionally after rotating Q and K by the same random Hadamard matrix
// (incoherent processing); S = Q K^T is computed from the dequantized values; P is rounded to
// e4m3 before P V, as the FP8 tensor cores need both operands in FP8 (scaled by 2^8 first, so
// that probabilities down to 2^-17 stay representable; the factor is divided out with l); the
// row sum l sums the rounded P, the weights P V uses (as the head_dim-128 kernel does, on the
// tensor cores; the head_dim-64 kernel sums P before rounding). Two more differences from the
// kernel, which change which small P values underflow, not the scale of the error: P is taken
// against the row's final max instead
// of the running max of the tile loop; and the kernel also multiplies a tile's P by its V block's
// scale over the largest one (keeping O in one unit), so in blocks of smaller V the small P
// values meet e4m3's floor sooner.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "fp8.h"
#include "not_implemented.h"
#include "problem.h"

namespace fa::flash3 {

/// P is multiplied by this exact power of two before it is rounded to e4m3 (and O divided by it
/// at the end): P <= 1 maps to <= 256 < 448, and e4m3's normal range starts at 2^-6.
constexpr float kPScale = 256.0f;

/// How Q, K, V (and P) are put into e4m3. block_rows = 0 means one scale per head (per tensor).
struct Fp8Recipe {
  int q_block_rows = 128;   // the kernel's Q tile
  int kv_block_rows = 128;  // the kernel's K/V tile
  bool incoherent = true;   // rotate Q and K by diag(signs) * H / sqrt(d) first
  bool p_in_fp8 = true;     // round P * kPScale to e4m3 before P V
  uint64_t sign_seed = 0x5EED;
};

/// The values a block-quantized matrix stands for, row-major.
inline std::vector<float> dequantize(const Fp8Blocks& m) {
  std::vector<float> x(std::size_t(m.rows) * m.cols);
  for (int r = 0; r < m.rows; ++r)
    for (int c = 0; c < m.cols; ++c) x[std::size_t(r) * m.cols + c] = m.at(r, c);
  return x;
}

/// Attention over [batch, heads, seq, head_dim] float inputs with the FP8 recipe; o and lse as
/// in the oracle. head_dim must be a power of two when recipe.incoherent is set.
inline void fp8_attention_cpu(const AttentionShape& s, const float* q, const float* k, const float* v, float* o,
                              float* lse, const Fp8Recipe& recipe) {
  const int d = s.head_dim;
  const float scale = float(s.softmax_scale());
  const std::vector<float> signs = recipe.incoherent ? random_signs(d, recipe.sign_seed) : std::vector<float>();
  std::vector<float> p(s.seq_kv);
  for (int bh = 0; bh < s.batch * s.heads_q; ++bh) {
    std::vector<float> qh(q + s.q_head_offset(bh), q + s.q_head_offset(bh) + int64_t(s.seq_q) * d);
    std::vector<float> kh(k + s.kv_head_offset(bh), k + s.kv_head_offset(bh) + int64_t(s.seq_kv) * d);
    //! [fp8_recipe]
    if (recipe.incoherent) {
      rotate_rows(qh.data(), s.seq_q, d, signs);
      rotate_rows(kh.data(), s.seq_kv, d, signs);
    }
    const int q_block = recipe.q_block_rows > 0 ? recipe.q_block_rows : s.seq_q;
    const int kv_block = recipe.kv_block_rows > 0 ? recipe.kv_block_rows : s.seq_kv;
    const std::vector<float> q8 = dequantize(quantize_e4m3(qh.data(), s.seq_q, d, q_block));
    const std::vector<float> k8 = dequantize(quantize_e4m3(kh.data(), s.seq_kv, d, kv_block));
    const std::vector<float> v8 = dequantize(quantize_e4m3(v + s.kv_head_offset(bh), s.seq_kv, d, kv_block));
    //! [fp8_recipe]
    for (int i = 0; i < s.seq_q; ++i) {
      float m = -INFINITY;
      for (int j = 0; j < s.seq_kv; ++j) {
        float dot = 0.0f;
        for (int x = 0; x < d; ++x) dot += q8[std::size_t(i) * d + x] * k8[std::size_t(j) * d + x];
        p[j] = s.visible(i, j) ? dot * scale : -INFINITY;
        m = std::max(m, p[j]);
      }
      float* o_row = o + s.q_head_offset(bh) + int64_t(i) * d;
      std::fill(o_row, o_row + d, 0.0f);
      if (m == -INFINITY) {
        lse[int64_t(bh) * s.seq_q + i] = -INFINITY;
        continue;
      }
      //! [p_rounded]
      // l sums P as P V uses it: rounded to e4m3 when p_in_fp8 (the kernel at head_dim 128 takes
      // its row sums from the tensor cores, from that same P).
      float l = 0.0f;
      for (int j = 0; j < s.seq_kv; ++j) {
        p[j] = std::exp(p[j] - m);
        if (recipe.p_in_fp8) p[j] = round_to_e4m3(p[j] * kPScale) / kPScale;
        l += p[j];
      }
      //! [p_rounded]
      for (int j = 0; j < s.seq_kv; ++j)
        if (p[j] != 0.0f)
          for (int x = 0; x < d; ++x) o_row[x] += p[j] * v8[std::size_t(j) * d + x];
      for (int x = 0; x < d; ++x) o_row[x] /= l;
      lse[int64_t(bh) * s.seq_q + i] = m + std::log(l);
    }
  }
}

//! [tail_pieces]
/// Variant 5's split tail. `blocks` equally long blocks on `slots` block slots (SMs x blocks per
/// SM) run in waves, and the last wave holds only blocks % slots of them: the other slots idle
/// for a whole block's time. Splitting each of those tail blocks into f pieces, each over 1 / f
/// of the K/V tiles, makes the last wave ceil(tail f / slots) waves of 1 / f of a block. The f
/// in 1..4 with the shortest end, the smaller on a tie; each piece keeps at least kMinTiles
/// tiles of `tiles`: a piece pays its own pipeline start and the merge, and with 4 to 8 tiles per
/// piece (2k keys, 16 tiles, in 2 to 4 pieces) the split was slower than no split at all (the
/// chapter's performance notes).
inline int tail_pieces(int blocks, int slots, int tiles) {
  // BEGIN SOLUTION ch06_tail_pieces: 1 when slots or blocks <= 0 or the last wave is full (blocks % slots == 0); otherwise the f in 1..kMaxPieces, with tiles >= kMinTiles * f, whose tail time ceil(tail f / slots) / f (in blocks) is shortest, the smaller f on a tie (compare with a 1e-9 margin)
  constexpr int kMaxPieces = 4, kMinTiles = 16;
  if (slots <= 0 || blocks <= 0) return 1;
  const int tail = blocks % slots;
  if (tail == 0) return 1;
  int best = 1;
  double best_time = 1.0;  // the tail's time, in blocks
  for (int f = 2; f <= kMaxPieces && tiles >= kMinTiles * f; ++f) {
    const double time = double((int64_t(tail) * f + slots - 1) / slots) / f;
    if (time < best_time - 1e-9) {
      best = f;
      best_time = time;
    }
  }
  return best;
  // END SOLUTION
}
//! [tail_pieces]

}  // namespace fa::flash3
