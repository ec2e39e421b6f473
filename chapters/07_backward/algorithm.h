// Chapter 07 on the CPU: FlashAttention's backward pass by recomputation, in plain C++ (float),
// with the same loops and tiles as the chapter's first GPU variant.
//
// Given Q, K, V, the forward's O and LSE, and dO (all [batch, heads, seq, head_dim]; LSE
// [batch, heads_q, seq_q]):
//   D_i   = sum_x dO[i][x] O[i][x]                       (one number per query row)
//   for each K/V tile j (outer), for each Q tile i (inner):
//     S   = Q_i K_j^T * scale,   P = exp(S - LSE_i)      (recomputed: nothing N x N is stored)
//     dV_j += P^T dO_i
//     dP  = dO_i V_j^T,          dS = P * (dP - D_i)     (elementwise)
//     dK_j += dS^T Q_i * scale,  dQ_i += dS K_j * scale
// dK and dV of a K/V head are sums over the query heads that share it (GQA/MQA). Masked and
// out-of-range (row, key) pairs have P = 0, so they add nothing.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "not_implemented.h"
#include "problem.h"

namespace fa::backward {

constexpr int kTileRows = 64, kTileKeys = 64;

/// dq [B,Hq,Nq,d], dk and dv [B,Hkv,Nk,d] are overwritten.
inline void flash_backward_cpu(const AttentionShape& s, const float* q, const float* k, const float* v, const float* o,
                               const float* lse, const float* d_o, float* dq, float* dk, float* dv) {
  const int d = s.head_dim;
  const float scale = float(s.softmax_scale());
  std::fill(dq, dq + s.q_elems(), 0.0f);
  std::fill(dk, dk + s.kv_elems(), 0.0f);
  std::fill(dv, dv + s.kv_elems(), 0.0f);
  std::vector<float> delta(s.seq_q), p(std::size_t(kTileRows) * kTileKeys), ds(p.size());
  for (int bh = 0; bh < s.batch * s.heads_q; ++bh) {
    const int64_t qo = s.q_head_offset(bh), kvo = s.kv_head_offset(bh);
    const float* lse_head = lse + int64_t(bh) * s.seq_q;
    for (int i = 0; i < s.seq_q; ++i) {  // D = rowsum(dO * O)
      float sum = 0.0f;
      for (int x = 0; x < d; ++x) sum += d_o[qo + int64_t(i) * d + x] * o[qo + int64_t(i) * d + x];
      delta[i] = sum;
    }
    for (int j0 = 0; j0 < s.seq_kv; j0 += kTileKeys) {
      const int keys = std::min(kTileKeys, s.seq_kv - j0);
      for (int i0 = 0; i0 < s.seq_q; i0 += kTileRows) {
        const int rows = std::min(kTileRows, s.seq_q - i0);
        //! [backward_tile]
        // P (recomputed from Q, K and LSE) and dS = P * (dO V^T - D) for the tile.
        // BEGIN SOLUTION ch07_ds_cpu: for every row r < rows and key c < keys of the tile: P = exp(scale q_i . k_j - LSE_i) recomputed (0 where (i, j) is masked or LSE_i is -inf), dP = dO_i . v_j, p[r * kTileKeys + c] = P and ds[r * kTileKeys + c] = P (dP - D_i)
        for (int r = 0; r < rows; ++r) {
          const int i = i0 + r;
          for (int c = 0; c < keys; ++c) {
            const int j = j0 + c;
            float pij = 0.0f, dp = 0.0f;
            if (s.visible(i, j) && lse_head[i] != -INFINITY) {
              float dot = 0.0f;
              for (int x = 0; x < d; ++x) dot += q[qo + int64_t(i) * d + x] * k[kvo + int64_t(j) * d + x];
              pij = std::exp(dot * scale - lse_head[i]);
              for (int x = 0; x < d; ++x) dp += d_o[qo + int64_t(i) * d + x] * v[kvo + int64_t(j) * d + x];
            }
            p[r * kTileKeys + c] = pij;
            ds[r * kTileKeys + c] = pij * (dp - delta[i]);
          }
        }
        // END SOLUTION
        // dV_j += P^T dO_i;  dK_j += dS^T Q_i * scale;  dQ_i += dS K_j * scale.
        for (int c = 0; c < keys; ++c)
          for (int x = 0; x < d; ++x) {
            float acc_v = 0.0f, acc_k = 0.0f;
            for (int r = 0; r < rows; ++r) {
              acc_v += p[r * kTileKeys + c] * d_o[qo + int64_t(i0 + r) * d + x];
              acc_k += ds[r * kTileKeys + c] * q[qo + int64_t(i0 + r) * d + x];
            }
            dv[kvo + int64_t(j0 + c) * d + x] += acc_v;
            dk[kvo + int64_t(j0 + c) * d + x] += acc_k * scale;
          }
        for (int r = 0; r < rows; ++r)
          for (int x = 0; x < d; ++x) {
            float acc = 0.0f;
            for (int c = 0; c < keys; ++c) acc += ds[r * kTileKeys + c] * k[kvo + int64_t(j0 + c) * d + x];
            dq[qo + int64_t(i0 + r) * d + x] += acc * scale;
          }
        //! [backward_tile]
      }
    }
  }
}

}  // namespace fa::backward
