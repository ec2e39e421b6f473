// Chapter 05, variant 3 -- `mma`: the Q tile split across warps, and both products on the
// tensor cores with mma.sync.m16n8k16 (fp16 or bf16 operands, fp32 accumulators).
//
// Block: 4 warps, a 64-row Q tile; warp w owns rows 16w .. 16w + 15 and never needs another
// warp's result (FlashAttention-2's split of Q, not FlashAttention-1's split of K/V). Per K/V
// tile of 64 keys, each warp computes its 16 x 64 slice of S in registers (8 mma n-blocks x
// head_dim/16 k-steps), runs the online softmax on it (a row's 64 scores live in the 4 lanes of
// a quad: two shuffles finish a row max), turns the S accumulators into P *in registers* and
// feeds them straight back as the A operand of P V_j. exp2 of the scores multiplied by scale * log2(e) first. l is
// kept per thread and summed over the quad once, at the end.
//
// Fragment layouts and the PTX wrappers (mma, cp.async, ldmatrix): common/ampere.cuh.
// Variant 4, `pipelined`, is the same kernel with kPipelined = true (see flash2_mma_kernel).
// Run: build/bin/ch05_flash_attention_v2 --variant mma   (or --variant pipelined)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>

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

using namespace fa::ampere;

constexpr int kWarps = 4, kRows = 16 * kWarps, kKeys = 64, kMmaThreads = 32 * kWarps;

/// The same copy with cp.async: nothing waits for it until cp_async_wait.
template <class T, int kD, int kLd>
__device__ void load_tile_async(T* tile, const T* src, int first, int n_rows) {
  constexpr int kChunks = kD / 8;
  for (int e = threadIdx.x; e < 64 * kChunks; e += blockDim.x) {
    const int r = e / kChunks, c = e % kChunks;
    const bool valid = first + r < n_rows;
    cp_async_16(tile + r * kLd + c * 8, src + int64_t(valid ? first + r : 0) * kD + c * 8, valid);
  }
}

/// kPipelined = false: variant 3. true: variant 4 -- K/V double-buffered with cp.async (tile j+1
/// loads while tile j computes), K and V fragments via ldmatrix, the mask applied only to tiles
/// that cross the causal diagonal or the ends.
template <class T, int kD, bool kPipelined>
__global__ void __launch_bounds__(kMmaThreads)
    flash2_mma_kernel(AttentionShape shape, const T* q, const T* k, const T* v, T* o, float* lse) {
  constexpr int kLd = kD + 8;  // pad rows by 16 bytes: the fragment loads of a warp hit 32 different banks
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  T* q_s = reinterpret_cast<T*>(shared_bytes);
  T* kv_s = q_s + kRows * kLd;  // [stage][K tile, V tile]; one stage for variant 3, two for variant 4

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int n_q = shape.seq_q, n_k = shape.seq_kv;
  const int i0 = blockIdx.x * kRows, bh = blockIdx.y;
  const int row_a = i0 + 16 * warp + g, row_b = row_a + 8;  // the two rows this thread holds
  const T* k_head = k + shape.kv_head_offset(bh);
  const T* v_head = v + shape.kv_head_offset(bh);

  load_tile<T, kD, kLd, 64>(q_s, q + shape.q_head_offset(bh), i0, n_q);
  __syncthreads();
  // The warp's Q rows as A fragments, one per 16-wide step of the head dimension; they stay in
  // registers for the whole K/V loop.
  //! [mma_q_fragments]
  uint32_t q_frag[kD / 16][4];
  const T* q_warp = q_s + (16 * warp) * kLd;
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks) {
    const int col = ks * 16 + 2 * t;
    q_frag[ks][0] = load32(q_warp + g * kLd + col);
    q_frag[ks][1] = load32(q_warp + (g + 8) * kLd + col);
    q_frag[ks][2] = load32(q_warp + g * kLd + col + 8);
    q_frag[ks][3] = load32(q_warp + (g + 8) * kLd + col + 8);
  }
  //! [mma_q_fragments]

  float out[kD / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows a and b; m in log2 units
  const float scale_log2 = float(shape.softmax_scale()) * kLog2e;
  const int last_row = min(i0 + kRows, n_q) - 1;
  const int key_end = shape.causal ? shape.visible_keys(last_row) : n_k;

  if constexpr (kPipelined) {
    load_tile_async<T, kD, kLd>(kv_s, k_head, 0, n_k);
    load_tile_async<T, kD, kLd>(kv_s + kKeys * kLd, v_head, 0, n_k);
    cp_async_commit();
  }
  for (int j0 = 0, stage = 0; j0 < key_end; j0 += kKeys, stage ^= 1) {
    T* k_s = kv_s + (kPipelined ? stage : 0) * 2 * kKeys * kLd;
    T* v_s = k_s + kKeys * kLd;
    //! [mma_stages]
    if constexpr (kPipelined) {
      // Start the next tile's copy into the other stage, then wait only for this tile's.
      if (j0 + kKeys < key_end) {
        T* next = kv_s + (stage ^ 1) * 2 * kKeys * kLd;
        load_tile_async<T, kD, kLd>(next, k_head, j0 + kKeys, n_k);
        load_tile_async<T, kD, kLd>(next + kKeys * kLd, v_head, j0 + kKeys, n_k);
        cp_async_commit();
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();
    } else {
      __syncthreads();
      load_tile<T, kD, kLd, 64>(k_s, k_head, j0, n_k);
      load_tile<T, kD, kLd, 64>(v_s, v_head, j0, n_k);
      __syncthreads();
    }
    //! [mma_stages]

    //! [mma_scores]
    // S (16 x 64 per warp) = Q K_j^T: 8 n-blocks of 8 keys, kD / 16 k-steps each.
    float s[8][4] = {};
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
      if constexpr (kPipelined) {
        // One ldmatrix.x4 brings the B fragments of two k-steps: matrices (dims +0, +8, +16, +24).
#pragma unroll
        for (int ks = 0; ks < kD / 16; ks += 2) {
          uint32_t b[4];
          ldmatrix_x4(b, k_s + (nb * 8 + lane % 8) * kLd + ks * 16 + (lane / 8) * 8);
          Mma<T>::run(s[nb], q_frag[ks], b[0], b[1]);
          Mma<T>::run(s[nb], q_frag[ks + 1], b[2], b[3]);
        }
      } else {
        const T* k_row = k_s + (nb * 8 + g) * kLd + 2 * t;  // B(k, n) = K[key n][dim k]
#pragma unroll
        for (int ks = 0; ks < kD / 16; ++ks)
          Mma<T>::run(s[nb], q_frag[ks], load32(k_row + ks * 16), load32(k_row + ks * 16 + 8));
      }
    }
    //! [mma_scores]

    // Scale into log2 units and mask (causal, and keys/rows past the end).
    // Variant 4 masks only tiles that cross the causal diagonal for some row of the block, or the ends.
    //! [mma_mask]
    const bool crosses_diagonal = shape.causal && (!kPipelined || j0 + kKeys > shape.visible_keys(i0));
    const bool needs_mask = crosses_diagonal || j0 + kKeys > n_k || i0 + kRows > n_q;
    //! [mma_mask]
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = e < 2 ? row_a : row_b, key = j0 + nb * 8 + 2 * t + (e & 1);
        const bool visible = !needs_mask || (row < n_q && key < n_k && shape.visible(row, key));
        s[nb][e] = visible ? s[nb][e] * scale_log2 : -INFINITY;
      }
    }

    //! [mma_softmax]
    // Online softmax, deferred normalization. Row a is in s[.][0..1], row b in s[.][2..3]; the
    // 4 lanes of a quad hold the rest of the row. The scores are already in log2 units (scaled
    // above, with the mask), hence the scale 1 here.
    float rescale[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      auto row = [&](int j) -> float& { return s[j / 2][2 * h + j % 2]; };  // row h's 16 scores in this thread
      rescale[h] = online_softmax_row<16, false>(row, m[h], l[h], 1.0f);
    }
#pragma unroll
    for (int db = 0; db < kD / 8; ++db) {
      out[db][0] *= rescale[0];
      out[db][1] *= rescale[0];
      out[db][2] *= rescale[1];
      out[db][3] *= rescale[1];
    }
    //! [mma_softmax]

    //! [mma_pv]
    // O += P V_j. The C fragments of two neighbouring S n-blocks are exactly the A fragment of
    // one 16-key step of P: P never leaves registers.
    // BEGIN SOLUTION ch05_pv (device): O += P V_j, P packed to T from the S accumulators (s[2kk] and s[2kk + 1] are the A fragment of key step kk); V's B fragments by ldmatrix_x4_trans when kPipelined, else two pack16 of V[key k][dim n] per mma
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      const uint32_t p_frag[4] = {Mma<T>::pack(s[2 * kk][0], s[2 * kk][1]), Mma<T>::pack(s[2 * kk][2], s[2 * kk][3]),
                                  Mma<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                  Mma<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      if constexpr (kPipelined) {
        // ldmatrix.trans: matrices (keys +0, dims db), (keys +8, db), (keys +0, db+1), (keys +8, db+1).
#pragma unroll
        for (int db = 0; db < kD / 8; db += 2) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, v_s + (kk * 16 + (lane / 8 % 2) * 8 + lane % 8) * kLd + (db + lane / 16) * 8);
          Mma<T>::run(out[db], p_frag, b[0], b[1]);
          Mma<T>::run(out[db + 1], p_frag, b[2], b[3]);
        }
      } else {
        const T* v_rows = v_s + (kk * 16 + 2 * t) * kLd + g;  // B(k, n) = V[key k][dim n]
#pragma unroll
        for (int db = 0; db < kD / 8; ++db) {
          const T* p = v_rows + db * 8;
          Mma<T>::run(out[db], p_frag, pack16(p, p + kLd), pack16(p + 8 * kLd, p + 9 * kLd));
        }
      }
    }
    // END SOLUTION
    //! [mma_pv]
    if constexpr (kPipelined) __syncthreads();  // the next iteration's copy overwrites this stage
  }

  // The one division by l, after summing each row's l over its quad.
  float inv_l[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] = quad_sum(l[h]);
    inv_l[h] = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
  }
  T* o_head = o + shape.q_head_offset(bh);
#pragma unroll
  for (int db = 0; db < kD / 8; ++db) {
    const int col = db * 8 + 2 * t;
    if (row_a < n_q) {
      o_head[int64_t(row_a) * kD + col] = T(out[db][0] * inv_l[0]);
      o_head[int64_t(row_a) * kD + col + 1] = T(out[db][1] * inv_l[0]);
    }
    if (row_b < n_q) {
      o_head[int64_t(row_b) * kD + col] = T(out[db][2] * inv_l[1]);
      o_head[int64_t(row_b) * kD + col + 1] = T(out[db][3] * inv_l[1]);
    }
  }
  if (t == 0) {
    // LSE = ln(sum e^s) = (m + log2 l) * ln 2, with m and l in log2 units.
    if (row_a < n_q) lse[int64_t(bh) * n_q + row_a] = m[0] == -INFINITY ? -INFINITY : (m[0] + log2f(l[0])) * kLn2;
    if (row_b < n_q) lse[int64_t(bh) * n_q + row_b] = m[1] == -INFINITY ? -INFINITY : (m[1] + log2f(l[1])) * kLn2;
  }
}

template <class T, int kD, bool kPipelined>
void launch_mma_dim(const ForwardParams& p) {
  // BEGIN SOLUTION ch05_pv: write the P V step in this file's kernel (the mma_pv block), then delete this line
  // END SOLUTION
  const AttentionShape& s = p.shape;
  const int stages = kPipelined ? 2 : 1;
  const int bytes = int((kRows + stages * 2 * kKeys) * (kD + 8) * sizeof(T));
  auto kernel = flash2_mma_kernel<T, kD, kPipelined>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  dim3 grid(unsigned((s.seq_q + kRows - 1) / kRows), unsigned(s.batch * s.heads_q));
  kernel<<<grid, kMmaThreads, bytes, p.stream>>>(s, static_cast<const T*>(p.q), static_cast<const T*>(p.k),
                                                 static_cast<const T*>(p.v), static_cast<T*>(p.o), p.lse);
  CUDA_CHECK_LAUNCH();
}

template <class T, bool kPipelined>
void launch_mma(const ForwardParams& p) {
  with_head_dim<64, 128>(p.shape.head_dim, [&](auto d) { launch_mma_dim<T, d.value, kPipelined>(p); });
}

std::string mma_support(const AttentionShape& s, std::initializer_list<int> head_dims) {
  if (std::string why = head_dim_reason(s.head_dim, head_dims); !why.empty()) return why;
  const GpuInfo& gpu = detect_gpu();
  if (gpu.available && gpu.sm_major < 8)
    return "needs an sm_80 or newer GPU (mma.sync with bf16), this one is sm_" +
           std::to_string(gpu.sm_major * 10 + gpu.sm_minor);
  const int64_t heads = int64_t(s.batch) * s.heads_q;
  if (heads > 65535) return "batch*heads_q must be at most 65535, got " + std::to_string(heads);
  return "";
}

std::string warp_split_traffic_note(const AttentionShape& s, WarpSplit split) {
  const double tile = 64.0 * s.head_dim;  // elements of a 64-row Q, K or V tile
  const double stores = 2 * tile * 2;     // K_j and V_j written to shared memory, 16-bit
  // Queries: all 4 warps read all of K_j, V_j.
  double kv_reads = 4 * 2 * tile * 2, q_reads = 0, o_bytes = 0, exchange = 0;
  if (split == WarpSplit::Keys) {
    kv_reads = 2 * tile * 2;                       // each K/V element read by one warp
    q_reads = 4 * tile * 2;                        // every warp reads every Q row, every tile
    o_bytes = tile * 4 * 2 + 4 * tile * 4 * 2;     // rescale (read + write), 4 warps' adds (read + write)
    exchange = 4 * 64 * 4 + kMmaThreads * 32 * 4;  // maxima posted; each thread reads 8 rows x 4 warps
  }
  const double per_tile = stores + kv_reads + q_reads + o_bytes + exchange;
  int64_t tiles = 0;
  for (int i0 = 0; i0 < s.seq_q; i0 += 64) {
    const int end = s.causal ? s.visible_keys(std::min(i0 + 64, s.seq_q) - 1) : s.seq_kv;
    if (end > 0) tiles += (end + 63) / 64;
  }
  tiles *= int64_t(s.batch) * s.heads_q;
  char line[256];
  std::snprintf(line, sizeof line,
                "shared memory per block per K/V tile: %.0f KB (K/V in %.0f, K/V reads %.0f, Q reads %.0f, O in shared "
                "%.0f, max exchange %.0f); %.1f GB over the launch",
                per_tile / 1024, stores / 1024, kv_reads / 1024, q_reads / 1024, o_bytes / 1024, exchange / 1024,
                per_tile * double(tiles) / 1e9);
  return line;
}

ForwardKernel mma_kernel(const char* name, int number, const char* variant, DType dtype, const char* summary,
                         void (*launch)(const ForwardParams&)) {
  ForwardKernel k{name, 5, number, variant, dtype, summary, launch};
  k.supports = [](const AttentionShape& s) { return mma_support(s); };
  if (number == 3)
    k.memory_note = [](const AttentionShape& s) { return warp_split_traffic_note(s, WarpSplit::Queries); };
  return k;
}
constexpr const char* kMmaSummary =
    "Q tile split across 4 warps; S and P*V on tensor cores (mma.sync m16n8k16), P in registers";
constexpr const char* kPipelinedSummary =
    "variant 3 + cp.async double-buffered K/V, ldmatrix fragments, diagonal-only masking";
FA_REGISTER_FORWARD_KERNEL(mma_kernel("ch05_mma_fp16", 3, "mma", DType::F16, kMmaSummary, launch_mma<__half, false>));
FA_REGISTER_FORWARD_KERNEL(mma_kernel("ch05_mma_bf16", 3, "mma", DType::BF16, kMmaSummary,
                                      launch_mma<__nv_bfloat16, false>));
FA_REGISTER_FORWARD_KERNEL(mma_kernel("ch05_pipelined_fp16", 4, "pipelined", DType::F16, kPipelinedSummary,
                                      launch_mma<__half, true>));
FA_REGISTER_FORWARD_KERNEL(mma_kernel("ch05_pipelined_bf16", 4, "pipelined", DType::BF16, kPipelinedSummary,
                                      launch_mma<__nv_bfloat16, true>));

}  // namespace fa::flash2
