// Chapter 06, variant 1 -- `tma`: chapter 05's best kernel (variant 5, `tuned`), with its loads
// handed to TMA (the Tensor Memory Accelerator). Nothing else changes: same 4 warps and 128-row
// Q tile, same mma.sync math (the per-tile code is chapter 05's tuned_tile.cuh, compiled here for
// another layout).
//
//   * One thread issues TMA copies of whole tiles; no thread computes a load address.
//   * Each K and V tile has two stages and a "full" mbarrier per stage: tile j + 2 loads while
//     tile j is used, and a warp waits on the barrier's phase instead of on its own copies.
//   * Tiles land in the 128-byte swizzled layout (chunk c of row r at c XOR r mod 8), which keeps
//     ldmatrix free of bank conflicts without padding; the ldmatrix addresses apply the same XOR.
// Run: build/bin/ch06_flash_attention_v3 --variant tma
#include <cuda_bf16.h>

#include <cstdint>

#include "../05_flash_attention_v2/tuned_tile.cuh"
#include "cuda_check.h"
#include "flash3_tile.cuh"
#include "flash_attention_v3.h"
#include "not_implemented.h"
#include "registry.h"
#include "static_switch.h"
#include "tma.h"

namespace fa::flash3 {
namespace {

using namespace fa::hopper;
using flash2::tuned_mask;
using flash2::tuned_pv;
using flash2::tuned_scores;
using flash2::tuned_softmax;

constexpr int kThreads = 128, kRows = 128, kStages = 2;

//! [swizzled_address]
/// Element (row, col) of a tile stored as TMA boxes of kBoxRows rows x 64 bf16 columns (128
/// bytes) with the 128-byte swizzle: 16-byte chunk c of row r sits at chunk c ^ (r % 8). Each
/// box starts on a 1024-byte boundary, so r % 8 is address bits 7-9 and the chunk is bits 4-6:
/// the swizzle is one XOR of the plain address with itself shifted. Returned as a 32-bit
/// shared-memory address, since 64-bit pointers kept live across the loop cost twice the registers.
template <int kBoxRows>
struct Swizzled128 {
  template <class T>
  __device__ static uint32_t at(const T* tile, int row, int col) {
    const uint32_t a = smem_addr(tile) + uint32_t((col / 64) * kBoxRows * 128 + row * 128 + (col % 64) * 2);
    return a ^ ((a >> 3) & 0x70);
  }
};
//! [swizzled_address]

__device__ inline int lane_id() {
  int lane;
  asm volatile("mov.u32 %0, %%laneid;\n" : "=r"(lane));
  return lane;
}

template <int kD>
constexpr int kTmaKeys = kD == 64 ? 128 : 64;  // chapter 05's tile sizes

template <int kD>
struct TmaLayout {
  static constexpr int kBoxes = kD / 64, kKeys = kTmaKeys<kD>;
  static constexpr int kQBytes = kBoxes * kRows * 128, kTileBytes = kBoxes * kKeys * 128;
  static constexpr int kQ = 0, kK = kQBytes, kV = kK + kStages * kTileBytes, kBars = kV + kStages * kTileBytes;
  static constexpr int kBytes = kBars + 8 * (1 + 2 * kStages) + 1024;
};

template <int kD>
__global__ void __launch_bounds__(kThreads, 2)
    flash3_tma_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                      const __grid_constant__ CUtensorMap tm_v, AttentionShape shape, StridedRows<__nv_bfloat16> o,
                      float* lse) {
  using L = TmaLayout<kD>;
  constexpr int kKeys = L::kKeys;
  using T = __nv_bfloat16;
  extern __shared__ unsigned char shared_raw[];
  unsigned char* smem = aligned_smem(shared_raw);
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + L::kBars);
  uint64_t* k_full = q_full + 1;
  uint64_t* v_full = k_full + kStages;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int bh = blockIdx.y;
  const int kv_plane = (bh / shape.heads_q) * shape.heads_kv + shape.kv_head(bh % shape.heads_q);
  const int i0 = (gridDim.x - 1 - blockIdx.x) * kRows;
  const int key_end = shape.causal ? shape.visible_keys(min(i0 + kRows, shape.seq_q) - 1) : shape.seq_kv;
  const int n_tiles = key_end > 0 ? (key_end + kKeys - 1) / kKeys : 0;
  const float scale_log2 = float(shape.softmax_scale()) * kLog2e;

  auto load_kv = [&](int tile, int stage) {
    mbarrier_arrive_expect_tx(&k_full[stage], L::kTileBytes);
    for (int b = 0; b < L::kBoxes; ++b)
      tma_load_head(smem + L::kK + stage * L::kTileBytes + b * kKeys * 128, &tm_k, 64 * b, tile * kKeys, kv_plane,
                    shape.heads_kv, &k_full[stage]);
    mbarrier_arrive_expect_tx(&v_full[stage], L::kTileBytes);
    for (int b = 0; b < L::kBoxes; ++b)
      tma_load_head(smem + L::kV + stage * L::kTileBytes + b * kKeys * 128, &tm_v, 64 * b, tile * kKeys, kv_plane,
                    shape.heads_kv, &v_full[stage]);
  };
  init_ring(q_full, k_full, v_full, kStages);
  if (tid == 0) {
    mbarrier_arrive_expect_tx(q_full, L::kQBytes);
    for (int b = 0; b < L::kBoxes; ++b)
      tma_load_head(smem + L::kQ + b * kRows * 128, &tm_q, 64 * b, i0, bh, shape.heads_q, q_full);
    for (int j = 0; j < kStages && j < n_tiles; ++j) load_kv(j, j);
  }

  float out[2][kD / 8][4] = {};
  float m[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, l[4] = {};
  const T* q_s = reinterpret_cast<const T*>(smem + L::kQ);
  mbarrier_wait(q_full, 0);
  for (int j = 0; j < n_tiles; ++j) {
    const int stage = Ring<kStages>::stage(j);
    const uint32_t phase = Ring<kStages>::full_parity(j);
    const T* k_s = reinterpret_cast<const T*>(smem + L::kK + stage * L::kTileBytes);
    const T* v_s = reinterpret_cast<const T*>(smem + L::kV + stage * L::kTileBytes);
    mbarrier_wait(&k_full[stage], phase);
    // The lane index re-read each tile: otherwise the compiler computes every swizzled ldmatrix
    // address once, before the loop, and keeps them all in registers (and spills).
    const int lane_j = lane_id();
    float s[2][kKeys / 8][4] = {};
    tuned_scores<T, kD, kKeys, Swizzled128<kRows>, Swizzled128<kKeys>>(s, q_s, k_s, warp, lane_j);
    const int j0 = j * kKeys;
    if ((shape.causal && j0 + kKeys > shape.visible_keys(i0)) || j0 + kKeys > shape.seq_kv || i0 + kRows > shape.seq_q)
      tuned_mask<kKeys>(s, shape, i0 + 32 * warp, j0, g, t);
    tuned_softmax<kD, kKeys>(s, out, m, l, scale_log2);
    mbarrier_wait(&v_full[stage], phase);
    tuned_pv<T, kD, kKeys, Swizzled128<kKeys>>(out, s, v_s, lane_j);
    __syncthreads();  // every warp is done with this stage: refill it
    if (tid == 0 && j + kStages < n_tiles) load_kv(j + kStages, stage);
  }

  // O / l rounded to bf16, straight from the registers; LSE.
  T* o_head = o.head_start(bh);
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int mt = r / 2, h = r % 2, row = i0 + 32 * warp + 16 * mt + 8 * h + g;
    l[r] = quad_sum(l[r]);
    if (row >= shape.seq_q) continue;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
#pragma unroll
    for (int db = 0; db < kD / 8; ++db)
      *reinterpret_cast<__nv_bfloat162*>(o_head + int64_t(row) * o.strides.row + db * 8 + 2 * t) =
          __floats2bfloat162_rn(out[mt][db][2 * h] * inv, out[mt][db][2 * h + 1] * inv);
    if (t == 0) lse[int64_t(bh) * shape.seq_q + row] = m[r] == -INFINITY ? -INFINITY : (m[r] + log2f(l[r])) * kLn2;
  }
}

template <int kD>
void launch_tma_dim(const ForwardParams& p) {
  flash2::require_tuned_pv();  // chapter 05's tuned_pv, which this variant runs
  launch_bf16_tiles(flash3_tma_kernel<kD>, p, kD, kRows, kTmaKeys<kD>, kThreads, TmaLayout<kD>::kBytes);
}

void launch_tma(const ForwardParams& p) {
  with_head_dim<64, 128>(p.shape.head_dim, [&](auto d) { launch_tma_dim<d.value>(p); });
}

ForwardKernel tma_kernel() {
  const char* summary = "chapter 05's tuned kernel fed by TMA into a 2-stage mbarrier ring, swizzled tiles";
  ForwardKernel k{"ch06_tma_bf16", 6, 1, "tma", DType::BF16, summary, launch_tma};
  k.supports = [](const AttentionShape& s) { return hopper_support(s); };
  k.strided = true;  // launch_bf16_tiles: strides in the tensor maps and O's rows
  return k;
}

}  // namespace

FA_REGISTER_FORWARD_KERNEL(tma_kernel());

}  // namespace fa::flash3
