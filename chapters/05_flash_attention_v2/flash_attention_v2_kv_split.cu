// Chapter 05, variant 2 -- `kv_split`: FlashAttention-1's way of sharing a tile between warps,
// kept as the control experiment for variant 3.
//
// Same block as variant 3 (4 warps, a 64-row Q tile, 64-key K/V tiles, mma.sync m16n8k16, plain
// loads into padded shared memory); only the split differs. Here warp w takes keys 16w .. 16w + 15
// of every K/V tile for *all* 64 rows. A row's scores are spread over four warps, so per tile:
//   1. each warp's partial row maxima go through shared memory (barrier) to agree on m_new;
//   2. the running O can live in no single warp: it sits in shared memory as fp32, every row is
//      rescaled there (read + write), and each warp adds its partial P_w V_w into it (read +
//      write of the whole 64 x d tile, four times, in four barrier-separated steps);
//   3. every warp needs every Q row, so Q fragments are read from shared memory on every tile.
// Variant 3 splits Q instead: a warp owns its rows, Q stays in registers, O stays in registers,
// and none of the three costs exists. The chapter README counts the bytes; fa_bench times both.
// Run: build/bin/ch05_flash_attention_v2 --variant kv_split
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "algorithm.h"
#include "ampere.cuh"
#include "cuda_check.h"
#include "log2_units.h"
#include "mma_variants.h"
#include "not_implemented.h"
#include "online_softmax.cuh"
#include "registry.h"
#include "static_switch.h"

namespace fa::flash2 {
namespace {

using namespace fa::ampere;

constexpr int kSplitWarps = 4, kSplitThreads = 32 * kSplitWarps, kSplitRows = 64, kSplitKeys = 64;
constexpr int kWarpKeys = kSplitKeys / kSplitWarps;  // 16: one mma k-step of P V

template <class T, int kD>
__global__ void __launch_bounds__(kSplitThreads)
    flash2_kv_split_kernel(AttentionShape shape, const T* q, const T* k, const T* v, T* o, float* lse) {
  constexpr int kLd = kD + 8, kLdO = kD + 8;  // 16-bit tiles and the fp32 O tile, both padded
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  T* q_s = reinterpret_cast<T*>(shared_bytes);
  T* k_s = q_s + kSplitRows * kLd;
  T* v_s = k_s + kSplitKeys * kLd;
  float* o_s = reinterpret_cast<float*>(v_s + kSplitKeys * kLd);  // [64][kLdO]: the running O, fp32
  float* part = o_s + kSplitRows * kLdO;                          // [4 warps][64 rows]: partial max, then l

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int n_q = shape.seq_q, n_k = shape.seq_kv;
  const int i0 = blockIdx.x * kSplitRows, bh = blockIdx.y;
  const T* k_head = k + shape.kv_head_offset(bh);
  const T* v_head = v + shape.kv_head_offset(bh);
  const float scale_log2 = float(shape.softmax_scale()) * kLog2e;

  load_tile<T, kD, kLd, kSplitRows>(q_s, q + shape.q_head_offset(bh), i0, n_q);
  for (int e = threadIdx.x; e < kSplitRows * kLdO; e += kSplitThreads) o_s[e] = 0.0f;

  // Thread (g, t) holds rows 16 mt + 8 h + g (mt = 0..3, h = 0..1) of S_w: index r = 2 mt + h.
  float m[8], l[8];  // m: the block-wide running max (log2 units, scale folded in); l: this thread's part
#pragma unroll
  for (int r = 0; r < 8; ++r) m[r] = -INFINITY, l[r] = 0.0f;
  const int last_row = min(i0 + kSplitRows, n_q) - 1;
  const int key_end = shape.causal ? shape.visible_keys(last_row) : n_k;
  const int key0 = kWarpKeys * warp;  // this warp's keys within each tile

  for (int j0 = 0; j0 < key_end; j0 += kSplitKeys) {
    __syncthreads();  // everyone is done with the previous K/V tile and its O updates
    load_tile<T, kD, kLd, kSplitKeys>(k_s, k_head, j0, n_k);
    load_tile<T, kD, kLd, kSplitKeys>(v_s, v_head, j0, n_k);
    __syncthreads();

    // S_w (64 rows x this warp's 16 keys) = Q K_w^T. Every warp reads all of Q from shared memory.
    float s[4][2][4] = {};
#pragma unroll
    for (int ks = 0; ks < kD / 16; ++ks) {
      uint32_t b[4];  // keys key0 + 0..7 and key0 + 8..15, dims ks*16 + 0..15
      ldmatrix_x4(b, k_s + (key0 + (lane / 16) * 8 + lane % 8) * kLd + ks * 16 + (lane / 8 % 2) * 8);
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        uint32_t a[4];
        ldmatrix_x4(a, q_s + (16 * mt + lane % 16) * kLd + ks * 16 + (lane / 16) * 8);
        Mma<T>::run(s[mt][0], a, b[0], b[1]);
        Mma<T>::run(s[mt][1], a, b[2], b[3]);
      }
    }
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
      for (int nb = 0; nb < 2; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = i0 + 16 * mt + 8 * (e / 2) + g, key = j0 + key0 + 8 * nb + 2 * t + (e & 1);
          if (!(row < n_q && key < n_k && shape.visible(row, key))) s[mt][nb][e] = -INFINITY;
        }
    }

    //! [kv_split_max]
    // Cost 1: the row max is split over four warps. Each posts its part; a barrier; each reads all four.
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      const int mt = r / 2, h = r % 2;
      const float mx =
          quad_max(fmaxf(fmaxf(s[mt][0][2 * h], s[mt][0][2 * h + 1]), fmaxf(s[mt][1][2 * h], s[mt][1][2 * h + 1])));
      if (t == 0) part[warp * kSplitRows + 16 * mt + 8 * h + g] = mx;
    }
    __syncthreads();
    //! [kv_split_max]
    float rescale[8];
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      const int mt = r / 2, h = r % 2, row = 16 * mt + 8 * h + g;
      float tile_max = part[row];
#pragma unroll
      for (int w = 1; w < kSplitWarps; ++w) tile_max = fmaxf(tile_max, part[w * kSplitRows + row]);
      float m_use;
      rescale[r] = online_max_update<false>(m[r], tile_max * scale_log2, m_use);
      float row_sum = 0.0f;
#pragma unroll
      for (int nb = 0; nb < 2; ++nb)
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; ++e) {
          s[mt][nb][e] = exp2f(fmaf(s[mt][nb][e], scale_log2, -m_use));
          row_sum += s[mt][nb][e];
        }
      l[r] = l[r] * rescale[r] + row_sum;
    }
    // Cost 2a: O is in shared memory, so rescaling it is a read and a write of 64 x d floats.
    // Warp w rescales rows 16w .. 16w + 15 (its lanes hold their factors as rescale[2w], [2w + 1]).
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float factor = rescale[h];
#pragma unroll
      for (int mt = 1; mt < 4; ++mt) factor = mt == warp ? rescale[2 * mt + h] : factor;  // no dynamic register index
      float* o_row = o_s + (16 * warp + 8 * h + g) * kLdO;
      for (int c = t; c < kD; c += 4) o_row[c] *= factor;
    }
    __syncthreads();  // rescaled before anyone adds, and the partial maxima are read

    //! [kv_split_pv]
    // Cost 2b: each warp's partial P_w V_w (64 x d) must be added into the shared O. In step r,
    // warp w adds m-tile (w + r) % 4: the four warps touch disjoint rows, and every row receives
    // the warps' parts in the same order on every run (shared-memory atomics would not, and are
    // slower). A barrier separates the steps.
#pragma unroll 1
    for (int step = 0; step < kSplitWarps; ++step) {
      const int my_mt = (warp + step) % kSplitWarps;
      float acc[kD / 8][4] = {};
      // BEGIN SOLUTION ch05_pv (device): acc = P V for m-tile my_mt over this warp's 16 keys (key0 ..): P's A fragment packed to T from s[my_mt] (selected with a compile-time loop, no run-time register index), V's B fragments by ldmatrix_x4_trans, two Mma<T>::run per 16 output columns
      const int b_row_offset = (key0 + (lane / 8 % 2) * 8 + lane % 8) * kLd + (lane / 16) * 8;
      uint32_t p_frag[4];
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {  // select m-tile my_mt without indexing registers at run time
        if (mt == my_mt) {
          p_frag[0] = Mma<T>::pack(s[mt][0][0], s[mt][0][1]);
          p_frag[1] = Mma<T>::pack(s[mt][0][2], s[mt][0][3]);
          p_frag[2] = Mma<T>::pack(s[mt][1][0], s[mt][1][1]);
          p_frag[3] = Mma<T>::pack(s[mt][1][2], s[mt][1][3]);
        }
      }
#pragma unroll
      for (int db = 0; db < kD / 8; db += 2) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, v_s + b_row_offset + db * 8);
        Mma<T>::run(acc[db], p_frag, b[0], b[1]);
        Mma<T>::run(acc[db + 1], p_frag, b[2], b[3]);
      }
      // END SOLUTION
#pragma unroll
      for (int db = 0; db < kD / 8; ++db) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float2* o_pair = reinterpret_cast<float2*>(o_s + (16 * my_mt + 8 * h + g) * kLdO + db * 8 + 2 * t);
          const float2 old = *o_pair;
          *o_pair = make_float2(old.x + acc[db][2 * h], old.y + acc[db][2 * h + 1]);
        }
      }
      __syncthreads();
    }
    //! [kv_split_pv]
  }

  // Each warp's l covers its own keys: sum over the quad, then over the four warps. The loop's
  // last barrier (or none, if it never ran) is behind us: `part` is free again.
  __syncthreads();
#pragma unroll
  for (int r = 0; r < 8; ++r) {
    l[r] = quad_sum(l[r]);
    if (t == 0) part[warp * kSplitRows + 16 * (r / 2) + 8 * (r % 2) + g] = l[r];
  }
  __syncthreads();
  T* o_head = o + shape.q_head_offset(bh);
  for (int e = threadIdx.x; e < kSplitRows * kD; e += kSplitThreads) {
    const int r = e / kD, c = e % kD;
    if (i0 + r >= n_q) continue;
    const float l_row = part[r] + part[kSplitRows + r] + part[2 * kSplitRows + r] + part[3 * kSplitRows + r];
    o_head[int64_t(i0 + r) * kD + c] = T(l_row == 0.0f ? 0.0f : o_s[r * kLdO + c] / l_row);  // l NaN: O NaN
  }
  if (warp == 0 && t == 0) {
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      const int row = 16 * (r / 2) + 8 * (r % 2) + g;
      const float l_row = part[row] + part[kSplitRows + row] + part[2 * kSplitRows + row] + part[3 * kSplitRows + row];
      if (i0 + row < n_q) lse[int64_t(bh) * n_q + i0 + row] = l_row == 0.0f ? -INFINITY : (m[r] + log2f(l_row)) * kLn2;
    }
  }
}

template <int kD>
constexpr int kv_split_shared_bytes() {
  return (kSplitRows + 2 * kSplitKeys) * (kD + 8) * 2 + (kSplitRows * (kD + 8) + kSplitWarps * kSplitRows) * 4;
}

template <class T, int kD>
void launch_kv_split_dim(const ForwardParams& p) {
  // BEGIN SOLUTION ch05_pv: write the P V step in this file's kernel (each warp's P V over its keys), then delete this line
  // END SOLUTION
  const AttentionShape& s = p.shape;
  constexpr int bytes = kv_split_shared_bytes<kD>();
  auto kernel = flash2_kv_split_kernel<T, kD>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  dim3 grid(unsigned((s.seq_q + kSplitRows - 1) / kSplitRows), unsigned(s.batch * s.heads_q));
  kernel<<<grid, kSplitThreads, bytes, p.stream>>>(s, static_cast<const T*>(p.q), static_cast<const T*>(p.k),
                                                   static_cast<const T*>(p.v), static_cast<T*>(p.o), p.lse);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void launch_kv_split(const ForwardParams& p) {
  with_head_dim<64, 128>(p.shape.head_dim, [&](auto d) { launch_kv_split_dim<T, d.value>(p); });
}

ForwardKernel kv_split_kernel(const char* name, DType dtype, void (*launch)(const ForwardParams&)) {
  const char* summary = "control for variant 3: K/V split across 4 warps (FlashAttention-1), O in shared memory";
  ForwardKernel k{name, 5, 2, "kv_split", dtype, summary, launch};
  k.supports = [](const AttentionShape& s) { return mma_support(s); };
  k.memory_note = [](const AttentionShape& s) { return warp_split_traffic_note(s, WarpSplit::Keys); };
  return k;
}

}  // namespace

FA_REGISTER_FORWARD_KERNEL(kv_split_kernel("ch05_kv_split_fp16", DType::F16, launch_kv_split<__half>));
FA_REGISTER_FORWARD_KERNEL(kv_split_kernel("ch05_kv_split_bf16", DType::BF16, launch_kv_split<__nv_bfloat16>));

}  // namespace fa::flash2
