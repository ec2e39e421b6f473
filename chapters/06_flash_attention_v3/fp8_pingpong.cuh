// Chapter 06, variant 5 at head_dim 64: variant 4's ping-pong kernel on e4m3 operands. A producer
// warpgroup and two consumer warpgroups of 64 Q rows each (a 128-row block), taking turns to issue
// their GEMMs (pingpong_schedule in flash3_tile.cuh, the same schedule as variant 4). What
// changes from variant 4 is only the operations the schedule calls: S and P V by e4m3 wgmma of
// k = 32, the softmax in FP8's units (fp8_tile.cuh), P packed to e4m3 in registers and fed to
// P V as its A operand. At head_dim 128 the three-consumer kernel runs instead
// (fp8_three_consumers.cuh).
// Run: build/bin/ch06_flash_attention_v3 --variant fp8 --dim 64
#pragma once

#include "fp8_tile.cuh"

namespace fa::flash3 {
namespace {

template <int kD>
using Fp8PingpongSmem = Fp8Smem<kD, 2>;

/// The e4m3 operations variant 4's schedule runs here. Both consumers take every tile of the
/// block (their turns alternate), so the mask test covers the block's 128 rows.
template <int kD>
struct Fp8PingpongOps : Fp8OpsBase<kD, Fp8PingpongSmem<kD>, 128> {
  static_assert(kD == 64, "P V takes P from registers here: wgmma.m64n64k32 (head_dim 128 runs fp8_three_consumers)");
  using Base = Fp8OpsBase<kD, Fp8PingpongSmem<kD>, 128>;
  using Base::Base;
  using Base::out;
  using Base::p;

  __device__ void softmax(int j, float (&s)[kBlockN / 2], float (&rescale)[2]) {
    Base::template softmax_tile</*kRowSums=*/true>(j, s, rescale);
  }
  __device__ void pack(const float (&s)[kBlockN / 2]) { pack_p_e4m3(s, p); }
  __device__ void pv(int j) {
    //! [fp8_pv]
    // O += P8 V8: A = P from registers, B = the V^T tile, K-major (keys contiguous in each of
    // its kD rows of 128 bytes); k = 32 keys per wgmma.
    const uint32_t v_lo = Base::v_lo(j);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 32; ++kk)
      wgmma_m64n64k32_e4m3_rs(out, p[kk], desc_join(v_lo + 2 * kk, Base::kKeysHi), true);
    wgmma_commit();
    //! [fp8_pv]
  }
  __device__ void rescale_out(const float (&rescale)[2]) { rescale_output<kD>(out, rescale); }
  __device__ void fence_out() { fence_operands(out); }
};

template <int kD>
__global__ void __launch_bounds__(128 * 3, 1)
    flash3_fp8_pingpong_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                               const __grid_constant__ CUtensorMap tm_vt, AttentionShape shape, Fp8Scales scales,
                               Fp8Grid grid, __nv_bfloat16* o, float* lse) {
  using L = Fp8PingpongSmem<kD>;
  constexpr int kConsumers = 2, kBlockM = 64 * kConsumers;
  extern __shared__ unsigned char shared_raw[];
  unsigned char* smem = aligned_smem(shared_raw);
  const Fp8Barriers bars(smem + L::kBars, L::kStages);

  const int tid = threadIdx.x, wg = tid / 128;
  const Piece work(grid, blockIdx.x);
  int q_block, bh;
  longest_first(/*causal order=*/false, work.item, grid.q_blocks, grid.planes, q_block, bh);  // plane by plane
  const int i0 = q_block * kBlockM;
  const PieceTiles tiles(shape, work, bh, i0, kBlockM);

  init_ring(bars.q_full, bars.k_full, bars.v_full, L::kStages, bars.k_empty, bars.v_empty, 128 * kConsumers);
  if (wg == 0) {  // the producer, as in variant 3
    setmaxnreg_dec<24>();
    if (tid == 0) produce_fp8<L>(smem, bars, tm_q, tm_k, tm_vt, i0, bh, tiles);
    return;
  }

  setmaxnreg_inc<240>();  // 128 x (24 + 2 x 240) <= 65536 registers
  // consumer and warp through a shuffle from lane 0: the compiler then knows they are the same in
  // every lane of a warp, and keeps what derives from them in uniform registers.
  const int consumer = __shfl_sync(0xFFFFFFFFu, wg - 1, 0), warp = __shfl_sync(0xFFFFFFFFu, (tid % 128) / 32, 0);
  Fp8ConsumerSetup setup(smem, bars, shape, scales, bh, tiles);
  setup.c0 = i0 + 64 * consumer;
  setup.mask_i0 = i0;
  setup.my_tiles = tiles.n_tiles;
  setup.consumer = consumer;
  setup.warp = warp;
  setup.lane = tid % 32;
  Fp8PingpongOps<kD> ops(setup);
  mbarrier_wait(bars.q_full, 0);
  pingpong_schedule(ops, tiles.n_tiles, consumer);
  ops.to_true_units();
  sum_over_quad(ops.l);
  finish_fp8<kD, kConsumers>(ops, work, grid, bh, consumer, warp, o, lse);
}

}  // namespace
}  // namespace fa::flash3
