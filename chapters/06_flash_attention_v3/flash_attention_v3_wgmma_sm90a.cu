// Chapter 06, variant 2 -- `wgmma`: TMA loads into a two-stage shared-memory ring guarded by
// mbarriers, and both products on Hopper's warpgroup tensor-core instruction.
//
// Block: 2 warpgroups (256 threads), a 128-row Q tile; warpgroup w owns rows 64w .. 64w + 63.
// Thread 0 also drives TMA (the Tensor Memory Accelerator): it announces the bytes of each tile
// on the tile's mbarrier and issues the TMA copies; everyone else waits on the barrier's phase.
// K and V tiles (128 keys) each have two stages, so tile j + 2 loads while tile j is used.
//   S (64 x 128 per warpgroup) = Q K_j^T   wgmma.m64n128k16, A = Q and B = K from shared memory
//   softmax on the S accumulators, in registers (each row sits in one quad, as in chapter 05)
//   O (64 x d) += P V_j                    wgmma.m64n{d}k16, A = P from registers, B = V (MN-major)
// The tiles arrive in the 128-byte-swizzled layout TMA writes for 128-byte box rows; the wgmma
// descriptors describe exactly that layout, so nothing is rearranged by hand. The per-tile steps
// are in flash3_tile.cuh, shared with variants 3 and 4.
// Run: build/bin/ch06_flash_attention_v3 --variant wgmma
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda_check.h"
#include "flash3_tile.cuh"
#include "flash_attention_v3.h"
#include "registry.h"
#include "static_switch.h"
#include "tma.h"

namespace fa::flash3 {
namespace {

using namespace fa::hopper;

constexpr int kWarpgroups = 2, kThreads = 128 * kWarpgroups, kBlockM = 64 * kWarpgroups, kStages = 2;

template <int kD>
using Layout = Smem<kD, kBlockM, kStages, 1 + 2 * kStages>;  // barriers: q_full, k_full[2], v_full[2]

template <int kD>
__global__ void __launch_bounds__(kThreads, 1)
    flash3_wgmma_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                        const __grid_constant__ CUtensorMap tm_v, AttentionShape shape, StridedRows<__nv_bfloat16> o,
                        float* lse) {
  using S = Layout<kD>;
  extern __shared__ unsigned char shared_raw[];
  unsigned char* smem = aligned_smem(shared_raw);
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + S::kBars);
  uint64_t* k_full = q_full + 1;
  uint64_t* v_full = k_full + kStages;

  const int tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int bh = blockIdx.y;
  const int kv_plane = (bh / shape.heads_q) * shape.heads_kv + shape.kv_head(bh % shape.heads_q);
  const int i0 = (gridDim.x - 1 - blockIdx.x) * kBlockM;  // last Q tile first (causal: the longest)
  const int key_end = shape.causal ? shape.visible_keys(min(i0 + kBlockM, shape.seq_q) - 1) : shape.seq_kv;
  const int n_tiles = key_end > 0 ? (key_end + kBlockN - 1) / kBlockN : 0;
  const float scale_log2 = float(shape.softmax_scale()) * kLog2e;

  //! [tma_ring]
  // One thread drives TMA: it tells each tile's barrier how many bytes to expect, then hands TMA
  // the box coordinates (column, row, plane). The barrier's phase completes when the bytes have
  // landed; the consumers wait on that phase.
  auto load_kv = [&](int tile, int stage) {
    mbarrier_arrive_expect_tx(&k_full[stage], S::kTileBytes);
    for (int b = 0; b < S::kBoxes; ++b)
      tma_load_head(smem + S::kK + stage * S::kTileBytes + b * kBoxBytes, &tm_k, 64 * b, tile * kBlockN, kv_plane,
                    shape.heads_kv, &k_full[stage]);
    mbarrier_arrive_expect_tx(&v_full[stage], S::kTileBytes);
    for (int b = 0; b < S::kBoxes; ++b)
      tma_load_head(smem + S::kV + stage * S::kTileBytes + b * kBoxBytes, &tm_v, 64 * b, tile * kBlockN, kv_plane,
                    shape.heads_kv, &v_full[stage]);
  };
  //! [tma_ring]

  init_ring(q_full, k_full, v_full, kStages);
  if (tid == 0) {
    mbarrier_arrive_expect_tx(q_full, S::kQBytes);
    for (int b = 0; b < S::kBoxes; ++b)
      tma_load_head(smem + S::kQ + b * kBlockM * 128, &tm_q, 64 * b, i0, bh, shape.heads_q, q_full);
    for (int j = 0; j < kStages && j < n_tiles; ++j) load_kv(j, j);
  }

  float out[kD / 2] = {};  // O accumulators: 64 x d per warpgroup, d / 2 per thread
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int row0 = i0 + 64 * wg + 16 * warp + g;  // this thread's rows: row0 and row0 + 8
  const unsigned char* q_rows = smem + S::kQ + wg * 64 * 128;
  mbarrier_wait(q_full, 0);

  for (int j = 0; j < n_tiles; ++j) {
    const int stage = Ring<kStages>::stage(j);
    const uint32_t phase = Ring<kStages>::full_parity(j);
    mbarrier_wait(&k_full[stage], phase);
    float s[kBlockN / 2];
    issue_scores<kD, kBlockM * 128>(s, q_rows, smem + S::kK + stage * S::kTileBytes);
    wgmma_wait<0>();
    fence_operands(s);

    if (tile_needs_mask(shape, i0, kBlockM, j * kBlockN)) mask_scores(s, shape, row0, j * kBlockN, t);
    float rescale[2];
    online_softmax(s, m, l, rescale, scale_log2);
    rescale_output<kD>(out, rescale);
    uint32_t p[kBlockN / 16][4];
    pack_p(s, p);

    mbarrier_wait(&v_full[stage], phase);
    issue_pv<kD>(out, p, smem + S::kV + stage * S::kTileBytes);
    wgmma_wait<0>();
    fence_operands(out);

    __syncthreads();  // both warpgroups are done with this stage: refill it
    if (tid == 0 && j + kStages < n_tiles) load_kv(j + kStages, stage);
  }
  write_output<kD>(out, m, l, shape, bh, row0, t, o, lse);
}

template <int kD>
void launch_wgmma_dim(const ForwardParams& p) {
  launch_bf16_tiles(flash3_wgmma_kernel<kD>, p, kD, kBlockM, kBlockN, kThreads, Layout<kD>::kBytes);
}

void launch_wgmma(const ForwardParams& p) {
  with_head_dim<64, 128>(p.shape.head_dim, [&](auto d) { launch_wgmma_dim<d.value>(p); });
}

ForwardKernel wgmma_kernel() {
  const char* summary = "TMA into a 2-stage mbarrier ring; S and P*V with wgmma (2 warpgroups, 128 x 128 tiles)";
  ForwardKernel k{"ch06_wgmma_bf16", 6, 2, "wgmma", DType::BF16, summary, launch_wgmma};
  k.supports = [](const AttentionShape& s) { return hopper_support(s); };
  k.strided = true;  // launch_bf16_tiles: strides in the tensor maps and O's rows
  return k;
}

}  // namespace

FA_REGISTER_FORWARD_KERNEL(wgmma_kernel());

}  // namespace fa::flash3
