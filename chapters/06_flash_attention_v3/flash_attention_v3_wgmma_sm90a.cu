// Chapter 06, variant 2 -- `wgmma`: TMA loads into a two-stage shared-memory ring guarded by
// mbarriers, and both products on Hopper's warpgroup tensor-core instruction.
//
// Block: 2 warpgroups (256 threads), a 128-row Q tile; warpgroup w owns rows 64w .. 64w + 63.
// Thread 0 also drives the copy engine: it announces the bytes of each tile on the tile's
// mbarrier and issues the TMA copies; everyone else waits on the barrier's phase. K and V tiles
// (128 keys) each have two stages, so tile j + 2 loads while tile j is used.
//   S (64 x 128 per warpgroup) = Q K_j^T   wgmma.m64n128k16, A = Q and B = K from shared memory
//   softmax on the S accumulators, in registers (each row sits in one quad, as in chapter 05)
//   O (64 x d) += P V_j                    wgmma.m64n{d}k16, A = P from registers, B = V (MN-major)
// The tiles arrive in the 128-byte-swizzled layout TMA writes for 128-byte box rows; the wgmma
// descriptors describe exactly that layout, so nothing is rearranged by hand.
// Run: build/bin/ch06_flash_attention_v3 --variant wgmma
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda_check.h"
#include "flash_attention_v3.h"
#include "hopper.cuh"
#include "registry.h"
#include "tma.h"

namespace fa::flash3 {
namespace {

using namespace fa::hopper;

constexpr int kWarpgroups = 2, kThreads = 128 * kWarpgroups, kBlockM = 64 * kWarpgroups, kBlockN = 128, kStages = 2;
constexpr int kBoxBytes = 128 * 128;  // one TMA box: 128 rows x 64 bf16 columns (128 bytes)

/// Shared memory, in boxes of 128 rows x 128 bytes (each 1024-byte aligned for the swizzle).
template <int kD>
struct Smem {
  static constexpr int kBoxes = kD / 64;                   // boxes per tile (column blocks of 64)
  static constexpr int kTileBytes = kBoxes * kBoxBytes;    // one 128-row tile of Q, K or V
  static constexpr int kQ = 0, kK = kTileBytes, kV = kK + kStages * kTileBytes;
  static constexpr int kBarriers = kV + kStages * kTileBytes;  // q_full, k_full[2], v_full[2]
  static constexpr int kBytes = kBarriers + 8 * (1 + 2 * kStages) + 1024;  // + alignment slack
};

/// S accumulator index -> (row half h, key column) within the warp's 16 x 128 slice:
/// s[4j + e] is row g + 8 * (e / 2), key 8j + 2t + (e & 1).
template <int kD>
__global__ void __launch_bounds__(kThreads, 1)
    flash3_wgmma_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                        const __grid_constant__ CUtensorMap tm_v, AttentionShape shape, __nv_bfloat16* o, float* lse) {
  using S = Smem<kD>;
  extern __shared__ unsigned char shared_raw[];
  // The swizzle pattern repeats every 1024 bytes; descriptors assume tiles start on that boundary.
  unsigned char* smem = shared_raw + ((1024 - (smem_addr(shared_raw) & 1023)) & 1023);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + S::kBarriers);
  uint64_t* q_full = bars;
  uint64_t* k_full = bars + 1;
  uint64_t* v_full = bars + 1 + kStages;

  const int tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int n_q = shape.seq_q, n_k = shape.seq_kv, bh = blockIdx.y;
  const int kv_plane = (bh / shape.heads_q) * shape.heads_kv + shape.kv_head(bh % shape.heads_q);
  const int i0 = (gridDim.x - 1 - blockIdx.x) * kBlockM;  // last Q tile first (causal: the longest)
  const int last_row = min(i0 + kBlockM, n_q) - 1;
  const int key_end = shape.causal ? shape.visible_keys(last_row) : n_k;
  const int n_tiles = key_end > 0 ? (key_end + kBlockN - 1) / kBlockN : 0;
  const float scale_log2 = float(shape.softmax_scale()) * 1.4426950408889634f;

  auto load_kv = [&](int tile, int stage) {
    mbarrier_arrive_expect_tx(&k_full[stage], S::kTileBytes);
    for (int b = 0; b < S::kBoxes; ++b)
      tma_load_3d(smem + S::kK + stage * S::kTileBytes + b * kBoxBytes, &tm_k, 64 * b, tile * kBlockN, kv_plane, &k_full[stage]);
    mbarrier_arrive_expect_tx(&v_full[stage], S::kTileBytes);
    for (int b = 0; b < S::kBoxes; ++b)
      tma_load_3d(smem + S::kV + stage * S::kTileBytes + b * kBoxBytes, &tm_v, 64 * b, tile * kBlockN, kv_plane, &v_full[stage]);
  };

  if (tid == 0) {
    mbarrier_init(q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&k_full[s], 1);
      mbarrier_init(&v_full[s], 1);
    }
    fence_barrier_init();
  }
  __syncthreads();
  if (tid == 0) {
    mbarrier_arrive_expect_tx(q_full, S::kTileBytes);
    for (int b = 0; b < S::kBoxes; ++b) tma_load_3d(smem + S::kQ + b * kBoxBytes, &tm_q, 64 * b, i0, bh, q_full);
    for (int j = 0; j < kStages && j < n_tiles; ++j) load_kv(j, j);
  }

  float out[kD / 2] = {};  // O accumulators: 64 x d per warpgroup, d / 2 per thread
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int row0 = i0 + 64 * wg + 16 * warp + g;  // this thread's rows: row0 and row0 + 8
  mbarrier_wait(q_full, 0);

  for (int j = 0; j < n_tiles; ++j) {
    const int stage = j % kStages;
    const uint32_t phase = (j / kStages) & 1;
    const unsigned char* k_tile = smem + S::kK + stage * S::kTileBytes;
    const unsigned char* v_tile = smem + S::kV + stage * S::kTileBytes;
    mbarrier_wait(&k_full[stage], phase);

    //! [wgmma_scores]
    // S = Q K_j^T: kD / 16 wgmma of k = 16. Within a 128-byte swizzled row, the k-th 16-column
    // step starts 32 bytes further; column 64 and up live in the next box.
    float s[kBlockN / 2];
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kD / 16; ++ks) {
      const int box = ks / 4, step = ks % 4;
      const uint64_t a = make_desc_sw128(smem + S::kQ + box * kBoxBytes + wg * 64 * 128 + step * 32, 16, 1024);
      const uint64_t b = make_desc_sw128(k_tile + box * kBoxBytes + step * 32, 16, 1024);
      wgmma_m64n128k16_ss<0>(s, a, b, ks > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(s);
    //! [wgmma_scores]

    const int j0 = j * kBlockN;
    const bool needs_mask = (shape.causal && j0 + kBlockN > shape.visible_keys(i0)) || j0 + kBlockN > n_k || i0 + kBlockM > n_q;
    if (needs_mask) {
#pragma unroll
      for (int i = 0; i < kBlockN / 2; ++i) {
        const int row = row0 + 8 * ((i % 4) / 2), key = j0 + 8 * (i / 4) + 2 * t + (i & 1);
        if (!(row < n_q && key < n_k && shape.visible(row, key))) s[i] = -INFINITY;
      }
    }

    // Online softmax on raw scores, scale folded into the exponent (chapter 05, variant 5).
    float rescale[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int c = 0; c < kBlockN / 8; ++c) tile_max = fmaxf(tile_max, fmaxf(s[4 * c + 2 * h], s[4 * c + 2 * h + 1]));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xFFFFFFFFu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xFFFFFFFFu, tile_max, 2));
      const float m_new = fmaxf(m[h], tile_max * scale_log2);
      const bool seen = m_new != -INFINITY;
      rescale[h] = seen ? exp2f(m[h] - m_new) : 1.0f;
      const float m_use = seen ? m_new : 0.0f;
      float row_sum = 0.0f;
#pragma unroll
      for (int c = 0; c < kBlockN / 8; ++c) {
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; ++e) {
          s[4 * c + e] = exp2f(fmaf(s[4 * c + e], scale_log2, -m_use));
          row_sum += s[4 * c + e];
        }
      }
      l[h] = l[h] * rescale[h] + row_sum;
      m[h] = m_new;
    }
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) out[i] *= rescale[(i % 4) / 2];

    //! [wgmma_pv]
    // P as wgmma A fragments straight from the S accumulators (the mma.sync trick of chapter 05
    // holds for wgmma too): 16 keys = two 8-column blocks = one k-step.
    uint32_t p[kBlockN / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const __nv_bfloat162 pair = __floats2bfloat162_rn(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
        p[kk][r] = *reinterpret_cast<const uint32_t*>(&pair);
      }
    }
    mbarrier_wait(&v_full[stage], phase);
    // O += P V_j. V is [keys][d] with d contiguous: "MN-major" for B, hence kTransB = 1; 8 keys
    // are 8 rows of 128 bytes (1024 bytes per group of 8), the next 64 columns are the next box.
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      const uint64_t b = make_desc_sw128(v_tile + kk * 16 * 128, kBoxBytes, 1024);
      if constexpr (kD == 128) {
        wgmma_m64n128k16_rs<1>(out, p[kk], b, true);
      } else {
        wgmma_m64n64k16_rs<1>(out, p[kk], b, true);
      }
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(out);
    //! [wgmma_pv]

    __syncthreads();  // both warpgroups are done with this stage: refill it
    if (tid == 0 && j + kStages < n_tiles) load_kv(j + kStages, stage);
  }

  // Epilogue: l summed over the quad, O / l rounded to bf16, LSE.
  __nv_bfloat16* o_head = o + shape.q_head_offset(bh);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xFFFFFFFFu, l[h], 1);
    l[h] += __shfl_xor_sync(0xFFFFFFFFu, l[h], 2);
    const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
    const int row = row0 + 8 * h;
    if (row >= n_q) continue;
#pragma unroll
    for (int c = 0; c < kD / 8; ++c) {
      const __nv_bfloat162 pair = __floats2bfloat162_rn(out[4 * c + 2 * h] * inv, out[4 * c + 2 * h + 1] * inv);
      *reinterpret_cast<__nv_bfloat162*>(o_head + int64_t(row) * kD + 8 * c + 2 * t) = pair;
    }
    if (t == 0) lse[int64_t(bh) * n_q + row] = m[h] == -INFINITY ? -INFINITY : (m[h] + log2f(l[h])) * 0.6931471805599453f;
  }
}

template <int kD>
void launch_wgmma_dim(const ForwardParams& p) {
  const AttentionShape& s = p.shape;
  const CUtensorMap tm_q = make_tensor_map_sw128(p.q, 2, kD, s.seq_q, s.batch * s.heads_q, 128);
  const CUtensorMap tm_k = make_tensor_map_sw128(p.k, 2, kD, s.seq_kv, s.batch * s.heads_kv, 128);
  const CUtensorMap tm_v = make_tensor_map_sw128(p.v, 2, kD, s.seq_kv, s.batch * s.heads_kv, 128);
  auto kernel = flash3_wgmma_kernel<kD>;
  const int bytes = Smem<kD>::kBytes;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  dim3 grid(unsigned((s.seq_q + kBlockM - 1) / kBlockM), unsigned(s.batch * s.heads_q));
  kernel<<<grid, kThreads, bytes, p.stream>>>(tm_q, tm_k, tm_v, s, static_cast<__nv_bfloat16*>(p.o), p.lse);
  CUDA_CHECK_LAUNCH();
}

void launch_wgmma(const ForwardParams& p) {
  if (p.shape.head_dim == 64) {
    launch_wgmma_dim<64>(p);
  } else {
    launch_wgmma_dim<128>(p);
  }
}

ForwardKernel wgmma_kernel() {
  ForwardKernel k{"ch06_wgmma_bf16", 6, 2, "wgmma", DType::BF16,
                  "TMA into a 2-stage mbarrier ring; S and P*V with wgmma (2 warpgroups, 128 x 128 tiles)", launch_wgmma};
  k.supports = hopper_support;
  return k;
}

}  // namespace

FA_REGISTER_FORWARD_KERNEL(wgmma_kernel());

}  // namespace fa::flash3
