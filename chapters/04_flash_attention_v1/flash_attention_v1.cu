// Chapter 04 -- FlashAttention-1: tiled, fused attention in fp32 (Dao et al., 2022, Algorithm 1).
//
// Chapter 03's fused loop read every K and V row once per query row. Here a tile of B_c keys
// and values is loaded into shared memory once and used by a whole tile of B_r queries; S_ij
// and P_ij exist only as a B_r x B_c tile in shared memory. Each row's (m, l) and its output
// are updated tile by tile with the online-softmax rule, kept normalized after every step as
// in the paper:
//   m_new = max(m, m~),  l_new = e^(m - m_new) l + e^(m~ - m_new) l~,
//   O <- (l e^(m - m_new) O + e^(m~ - m_new) P~ V_j) / l_new.
//
// Variants (same tiles, same three steps per tile, different loop order):
//   1 kv_outer  the paper's order: one block per head; for each K/V tile (outer), for each Q
//               tile (inner), read O_i, l_i, m_i from device memory, update, write back.
//   2 q_outer   one block per (Q tile, head); O_i, l_i, m_i stay in shared memory while the
//               block walks the K/V tiles, and are written once.
// Tiles: B_c = ceil(M / 4d), B_r = min(B_c, d) with M = 48 KB (tiles.h); 256 threads.
// Run:   build/bin/ch04_flash_attention_v1 --variant q_outer   (or --variant kv_outer)
#include <algorithm>
#include <sstream>

#include "algorithm.h"
#include "block_limits.h"
#include "cuda_check.h"
#include "not_implemented.h"
#include "registry.h"
#include "row_update.cuh"
#include "tiles.h"

namespace fa::flash1 {

constexpr int kThreads = 256;

/// The block's shared memory, carved as tiles.h counts it.
struct SharedTiles {
  float *q, *k, *v, *o, *s, *m, *l, *alpha, *beta;
};

__device__ SharedTiles carve(float* base, Tiles t, int d) {
  SharedTiles sm;
  sm.q = base;
  sm.k = sm.q + t.rows * (d + 1);
  sm.v = sm.k + t.cols * (d + 1);
  sm.o = sm.v + t.cols * d;
  sm.s = sm.o + t.rows * d;
  sm.m = sm.s + t.rows * (t.cols + 1);
  sm.l = sm.m + t.rows;
  sm.alpha = sm.l + t.rows;
  sm.beta = sm.alpha + t.rows;
  return sm;
}

/// Copies rows [first, first + count) of a [n_rows, d] matrix into a tile with row stride `ld`;
/// rows past the end are zero. Consecutive threads copy consecutive floats (coalesced).
__device__ void load_rows(float* tile, int ld, const float* src, int first, int count, int n_rows, int d) {
  for (int e = threadIdx.x; e < count * d; e += blockDim.x) {
    const int r = e / d, c = e % d;
    tile[r * ld + c] = first + r < n_rows ? src[int64_t(first + r) * d + c] : 0.0f;
  }
}

//! [flash1_tile_steps]
/// Step 1: S = scale * Q_i K_j^T on the tile; -inf where the key is masked or past the end.
__device__ void tile_scores(const AttentionShape& shape, const SharedTiles& sm, Tiles t, int i0, int j0, float scale) {
  const int d = shape.head_dim;
  for (int e = threadIdx.x; e < t.rows * t.cols; e += blockDim.x) {
    const int r = e / t.cols, c = e % t.cols, i = i0 + r, j = j0 + c;
    float s = -INFINITY;
    if (i < shape.seq_q && j < shape.seq_kv && shape.visible(i, j)) {
      float dot = 0.0f;
      for (int x = 0; x < d; ++x) dot += sm.q[r * (d + 1) + x] * sm.k[c * (d + 1) + x];
      s = dot * scale;
    }
    sm.s[r * (t.cols + 1) + c] = s;
  }
}

/// Step 2, one thread per row: the tile's max m~, P~ = exp(S - m~) in place, l~ = rowsum(P~);
/// then the row's new (m, l) and the two factors that rescale its output:
/// alpha = l e^(m - m_new) / l_new for the old O, beta = e^(m~ - m_new) / l_new for P~ V_j.
/// m and l point at the tile's first row (device memory for kv_outer, shared for q_outer).
__device__ void tile_row_update(const SharedTiles& sm, Tiles t, int valid_rows, float* m, float* l) {
  for (int r = threadIdx.x; r < t.rows; r += blockDim.x) {
    float* row = sm.s + r * (t.cols + 1);
    float tile_max = -INFINITY;
    for (int c = 0; c < t.cols; ++c) tile_max = fmaxf(tile_max, row[c]);
    float tile_sum = 0.0f;
    for (int c = 0; c < t.cols; ++c) {
      const float p = tile_max == -INFINITY ? 0.0f : expf(row[c] - tile_max);
      row[c] = p;
      tile_sum += p;
    }
    sm.alpha[r] = sm.beta[r] = 0.0f;  // a row past the end of Q adds nothing
    if (r >= valid_rows) continue;
    const RowFactors f = flash1_row_update(m[r], l[r], tile_max, tile_sum, [](float x) { return expf(x); });
    sm.alpha[r] = f.alpha;
    sm.beta[r] = f.beta;
  }
}

/// Step 3: O_i = alpha * O_i + beta * P~ V_j, one thread per output element (row stride d).
__device__ void tile_output_update(const SharedTiles& sm, Tiles t, int d, int valid_rows, float* o) {
  for (int e = threadIdx.x; e < valid_rows * d; e += blockDim.x) {
    const int r = e / d, c = e % d;
    float acc = 0.0f;
    for (int j = 0; j < t.cols; ++j) acc += sm.s[r * (t.cols + 1) + j] * sm.v[j * d + c];
    o[r * d + c] = sm.alpha[r] * o[r * d + c] + sm.beta[r] * acc;
  }
}
//! [flash1_tile_steps]

__device__ float lse_of(float m, float l) { return m == -INFINITY ? -INFINITY : m + logf(l); }

//! [flash1_kv_outer]
__global__ void __launch_bounds__(kThreads)
    flash1_kv_outer_kernel(AttentionShape shape, Tiles t, const float* q, const float* k, const float* v, float* o,
                           float* lse, float* m_all, float* l_all) {
  extern __shared__ float shared[];
  const int d = shape.head_dim, n_q = shape.seq_q, n_k = shape.seq_kv, bh = blockIdx.x;
  const SharedTiles sm = carve(shared, t, d);
  const float* q_head = q + shape.q_head_offset(bh);
  const float* k_head = k + shape.kv_head_offset(bh);
  const float* v_head = v + shape.kv_head_offset(bh);
  float* o_head = o + shape.q_head_offset(bh);
  float* m_head = m_all + int64_t(bh) * n_q;
  float* l_head = l_all + int64_t(bh) * n_q;
  const float scale = float(shape.softmax_scale());

  // O = 0, m = -inf, l = 0, in device memory (Algorithm 1, line 2).
  for (int64_t e = threadIdx.x; e < int64_t(n_q) * d; e += blockDim.x) o_head[e] = 0.0f;
  for (int r = threadIdx.x; r < n_q; r += blockDim.x) {
    m_head[r] = -INFINITY;
    l_head[r] = 0.0f;
  }
  for (int j0 = 0; j0 < n_k; j0 += t.cols) {  // outer loop: K_j, V_j into shared memory
    __syncthreads();
    load_rows(sm.k, d + 1, k_head, j0, t.cols, n_k, d);
    load_rows(sm.v, d, v_head, j0, t.cols, n_k, d);
    for (int i0 = 0; i0 < n_q; i0 += t.rows) {  // inner loop: every Q tile
      const int rows = min(t.rows, n_q - i0);
      if (shape.causal && j0 >= shape.visible_keys(i0 + rows - 1)) continue;  // tile fully masked
      __syncthreads();
      load_rows(sm.q, d + 1, q_head, i0, t.rows, n_q, d);
      __syncthreads();
      tile_scores(shape, sm, t, i0, j0, scale);
      __syncthreads();
      tile_row_update(sm, t, rows, m_head + i0, l_head + i0);  // m_i, l_i read and written in device memory
      __syncthreads();
      tile_output_update(sm, t, d, rows, o_head + int64_t(i0) * d);  // O_i read and written in device memory
    }
  }
  __syncthreads();
  for (int r = threadIdx.x; r < n_q; r += blockDim.x) lse[int64_t(bh) * n_q + r] = lse_of(m_head[r], l_head[r]);
}
//! [flash1_kv_outer]

//! [flash1_q_outer]
__global__ void __launch_bounds__(kThreads)
    flash1_q_outer_kernel(AttentionShape shape, Tiles t, const float* q, const float* k, const float* v, float* o,
                          float* lse) {
  extern __shared__ float shared[];
  const int d = shape.head_dim, n_q = shape.seq_q, n_k = shape.seq_kv;
  const int i0 = blockIdx.x * t.rows, bh = blockIdx.y, rows = min(t.rows, n_q - i0);
  const SharedTiles sm = carve(shared, t, d);
  const float* k_head = k + shape.kv_head_offset(bh);
  const float* v_head = v + shape.kv_head_offset(bh);
  const float scale = float(shape.softmax_scale());

  // Q_i once; O_i, m_i, l_i start in shared memory and stay there.
  load_rows(sm.q, d + 1, q + shape.q_head_offset(bh), i0, t.rows, n_q, d);
  for (int e = threadIdx.x; e < t.rows * d; e += blockDim.x) sm.o[e] = 0.0f;
  for (int r = threadIdx.x; r < t.rows; r += blockDim.x) {
    sm.m[r] = -INFINITY;
    sm.l[r] = 0.0f;
  }
  const int key_end = shape.causal ? shape.visible_keys(i0 + rows - 1) : n_k;  // later tiles are fully masked
  for (int j0 = 0; j0 < key_end; j0 += t.cols) {
    __syncthreads();
    load_rows(sm.k, d + 1, k_head, j0, t.cols, n_k, d);
    load_rows(sm.v, d, v_head, j0, t.cols, n_k, d);
    __syncthreads();
    tile_scores(shape, sm, t, i0, j0, scale);
    __syncthreads();
    tile_row_update(sm, t, rows, sm.m, sm.l);
    __syncthreads();
    tile_output_update(sm, t, d, rows, sm.o);
  }
  __syncthreads();
  float* o_tile = o + shape.q_head_offset(bh) + int64_t(i0) * d;  // O_i written once, coalesced
  for (int e = threadIdx.x; e < rows * d; e += blockDim.x) o_tile[e] = sm.o[e];
  for (int r = threadIdx.x; r < rows; r += blockDim.x) lse[int64_t(bh) * n_q + i0 + r] = lse_of(sm.m[r], sm.l[r]);
}
//! [flash1_q_outer]

std::size_t shared_bytes(const AttentionShape& s) {
  return shared_floats(choose_tiles(s.head_dim), s.head_dim) * sizeof(float);
}

std::string flash1_support(const AttentionShape& s, bool per_q_tile) {
  return block_limits(s, shared_bytes(s), per_q_tile);
}

//! [flash1_shared_optin]
template <class Kernel>
void allow_shared_memory(Kernel kernel, std::size_t bytes) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}
//! [flash1_shared_optin]

void launch_kv_outer(const ForwardParams& p) {
  require_row_update();
  const AttentionShape& s = p.shape;
  const Tiles t = choose_tiles(s.head_dim);
  const std::size_t bytes = shared_bytes(s);
  allow_shared_memory(flash1_kv_outer_kernel, bytes);
  float* m_all = static_cast<float*>(p.workspace);
  float* l_all = m_all + s.lse_elems();
  flash1_kv_outer_kernel<<<unsigned(s.batch * s.heads_q), kThreads, bytes, p.stream>>>(
      s, t, static_cast<const float*>(p.q), static_cast<const float*>(p.k), static_cast<const float*>(p.v),
      static_cast<float*>(p.o), p.lse, m_all, l_all);
  CUDA_CHECK_LAUNCH();
}

void launch_q_outer(const ForwardParams& p) {
  require_row_update();
  const AttentionShape& s = p.shape;
  const Tiles t = choose_tiles(s.head_dim);
  const std::size_t bytes = shared_bytes(s);
  allow_shared_memory(flash1_q_outer_kernel, bytes);
  dim3 grid(unsigned((s.seq_q + t.rows - 1) / t.rows), unsigned(s.batch * s.heads_q));
  flash1_q_outer_kernel<<<grid, kThreads, bytes, p.stream>>>(
      s, t, static_cast<const float*>(p.q), static_cast<const float*>(p.k), static_cast<const float*>(p.v),
      static_cast<float*>(p.o), p.lse);
  CUDA_CHECK_LAUNCH();
}

std::string traffic_note(const AttentionShape& s, LoopOrder order, Tiles t, std::size_t shared) {
  const double gib = double(1ull << 30);
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(2);
  out << "tiles B_r = " << t.rows << ", B_c = " << t.cols << " (" << shared / 1024.0 << " KB shared); "
      << device_bytes(s, order, t) / gib << " GiB through device memory (minimum " << s.forward_min_bytes(4) / gib
      << " GiB; chapter 01 moved " << (5.0 * double(s.score_elems()) * 4 + s.forward_min_bytes(4)) / gib << ")";
  return out.str();
}

ForwardKernel flash1_kernel(int number, const char* variant, const char* summary, LoopOrder order) {
  const bool kv_outer = order == LoopOrder::KvOuter;
  ForwardKernel k{std::string("ch04_") + variant,
                  4,
                  number,
                  variant,
                  DType::F32,
                  summary,
                  kv_outer ? launch_kv_outer : launch_q_outer};
  k.supports = [kv_outer](const AttentionShape& s) { return flash1_support(s, !kv_outer); };
  if (kv_outer)
    k.workspace_bytes = [](const AttentionShape& s) { return 2 * std::size_t(s.lse_elems()) * sizeof(float); };
  k.memory_note = [order](const AttentionShape& s) {
    return traffic_note(s, order, choose_tiles(s.head_dim), shared_bytes(s));
  };
  return k;
}
FA_REGISTER_FORWARD_KERNEL(
    flash1_kernel(1, "kv_outer", "the paper's Algorithm 1: K/V tiles outer, Q tiles inner, O/l/m in device memory",
                  LoopOrder::KvOuter));
FA_REGISTER_FORWARD_KERNEL(flash1_kernel(2, "q_outer",
                                         "one block per Q tile looping over K/V tiles: O/l/m stay on chip",
                                         LoopOrder::QOuter));

FA_REGISTER_CPU_ALGORITHM(CpuAlgorithm{
    "ch04_kv_outer_cpu", 4, 1, "kv_outer", "algorithm.h: Algorithm 1 tile by tile (float)",
    [](const AttentionShape& s, const float* q, const float* k, const float* v, float* o, float* lse) {
      flash_attention_v1_cpu(s, q, k, v, o, lse, LoopOrder::KvOuter, choose_tiles(s.head_dim));
    }});
FA_REGISTER_CPU_ALGORITHM(CpuAlgorithm{
    "ch04_q_outer_cpu", 4, 2, "q_outer", "algorithm.h: the same tiles, Q tiles outer (float)",
    [](const AttentionShape& s, const float* q, const float* k, const float* v, float* o, float* lse) {
      flash_attention_v1_cpu(s, q, k, v, o, lse, LoopOrder::QOuter, choose_tiles(s.head_dim));
    }});

}  // namespace fa::flash1
