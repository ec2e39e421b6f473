// Chapter 04's tile sizes, shared by the kernels and algorithm.h.
#pragma once

#include <cstddef>
#include <string>

#include "problem.h"

namespace fa::flash1 {

//! [flash1_choose_tiles]
/// The paper's on-chip memory budget M, in floats: 48 KB, the shared memory every CUDA GPU gives
/// a block without asking. B_c = ceil(M / 4d) fills M with four tiles of d-wide rows (Q_i, K_j,
/// V_j, O_i); B_r = min(B_c, d) (FlashAttention, Algorithm 1, line 1).
constexpr int kSramFloats = 48 * 1024 / 4;

struct Tiles {
  int rows;  // B_r: query rows per tile
  int cols;  // B_c: keys per tile
};

inline Tiles choose_tiles(int head_dim) {
  int cols = (kSramFloats + 4 * head_dim - 1) / (4 * head_dim);
  return {cols < head_dim ? cols : head_dim, cols};
}
//! [flash1_choose_tiles]

/// Shared memory a block uses, in floats: Q_i and K_j padded to d + 1 per row (so a warp reading
/// one column of 32 different rows hits 32 different banks), V_j, O_i, the score tile S_ij
/// padded to B_c + 1, and four per-row values (m, l and the two rescale factors).
inline std::size_t shared_floats(const Tiles& t, int d) {
  return std::size_t(t.rows + t.cols) * (d + 1) + std::size_t(t.cols + t.rows) * d +
         std::size_t(t.rows) * (t.cols + 1) + 4 * std::size_t(t.rows);
}

}  // namespace fa::flash1

namespace fa::flash1 {

enum class LoopOrder { KvOuter, QOuter };

/// Variant 3's fixed tile: 64 x 64, so each thread of 256 owns a 4 x 4 patch of S and, of O, one
/// 4 x 4 patch per 64 columns of head_dim.
constexpr Tiles kRegisterTiles{64, 64};

/// Bytes each variant moves through device memory, counted tile by tile the way the kernels run
/// (causal tiles that are entirely masked are skipped by both). kv_outer: K and V once; Q_i, and
/// O_i, m_i, l_i read and written, once per visited (KV tile, Q tile) pair. q_outer: Q and O
/// once; K_j and V_j once per visited pair.
inline double device_bytes(const AttentionShape& s, LoopOrder order, Tiles t) {
  const double d = s.head_dim;
  double floats_per_head = 0;
  if (order == LoopOrder::KvOuter) {
    floats_per_head = 2.0 * s.seq_kv * d + s.seq_q * d + 3.0 * s.seq_q;  // K, V; O zeroed, m, l set; LSE
    for (int j0 = 0; j0 < s.seq_kv; j0 += t.cols) {
      for (int i0 = 0; i0 < s.seq_q; i0 += t.rows) {
        int rows = (i0 + t.rows < s.seq_q ? t.rows : s.seq_q - i0);
        if (s.causal && j0 >= s.visible_keys(i0 + rows - 1)) continue;
        floats_per_head += rows * (3.0 * d + 4.0);  // Q_i read; O_i read + written; m_i, l_i read + written
      }
    }
  } else {
    floats_per_head = 2.0 * s.seq_q * d + s.seq_q;  // Q read, O and LSE written
    for (int i0 = 0; i0 < s.seq_q; i0 += t.rows) {
      int rows = (i0 + t.rows < s.seq_q ? t.rows : s.seq_q - i0);
      int keys = s.causal ? s.visible_keys(i0 + rows - 1) : s.seq_kv;
      int loaded = ((keys + t.cols - 1) / t.cols) * t.cols;
      floats_per_head += 2.0 * d * (loaded < s.seq_kv ? loaded : s.seq_kv);  // K_j, V_j per tile
    }
  }
  return 4.0 * floats_per_head * s.batch * s.heads_q;
}

/// "tiles B_r = .., B_c = .. (.. KB shared); .. GiB through device memory (minimum ..)" for
/// the chapter program's traffic lines (defined in flash_attention_v1.cu).
std::string traffic_note(const AttentionShape& s, LoopOrder order, Tiles t, std::size_t shared_bytes);

}  // namespace fa::flash1
