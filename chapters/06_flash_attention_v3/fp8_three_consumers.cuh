// Chapter 06, variant 5 at head_dim 128 (and 256): the FP8 ping-pong kernel (fp8_pingpong.cuh)
// refined in three steps, each for the same reason: FP8 halves the tensor cores' time per tile
// but not the softmax's, so the softmax becomes what the tensor cores wait for.
//   1. Three consumer warpgroups (192 Q rows per block) instead of two, issuing when ready (no
//      turns): a third warpgroup's GEMMs fill the time the other two spend in their softmax.
//   2. P through shared memory, in two buffers per warpgroup (the register file has no room for
//      P next to S and O at this size); P V reads it as an SS wgmma.
//   3. The softmax's row sums on the tensor cores: P8 times a tile of ones, in P V's group.
// The schedule (three_consumer_schedule) is variant 4's without the turns, with P_{j+1} packed
// while P_j V_j runs and V_j waited for only after S_{j+1} is issued. At head_dim 256 the same
// kernel runs with two consumers (kConsumers8), P still through shared memory.
// Run: build/bin/ch06_flash_attention_v3 --variant fp8 --dim 128
#pragma once

#include "fp8_tile.cuh"

namespace fa::flash3 {
namespace {

//! [three_consumers]
// Three consumer warpgroups at head_dim 128. The register file sets the terms: 4 warpgroups
// share 64K registers, so a consumer gets 160 (the producer keeps 24), and O (64) + S (64) fill
// most of them. P_j, which in variant 4 sits in 32 more registers while S_{j+1} is computed,
// goes to shared memory instead (wgmma reads A from there too), in two buffers per warpgroup,
// so that P_{j+1} can be stored while P_j V_j still reads P_j. Q is read from shared memory.
// At head_dim 256, O alone is 128 registers: two consumers of 240 registers each (kConsumers8),
// and P goes through shared memory for the same reason.
constexpr int kPTile = 64 * kBlockN;  // one warpgroup's P: 64 rows x 128 keys of e4m3
/// Extra shared memory: two P buffers per consumer, then 8 rows of 128 e4m3 ones (fp8_row_sums).
constexpr int p_buffers_bytes(int consumers) { return 2 * consumers * kPTile; }
constexpr int kOnesBytes = 1024;
template <int kD>
using Fp8ThreeSmem = Fp8Smem<kD, kConsumers8<kD>, p_buffers_bytes(kConsumers8<kD>) + kOnesBytes>;
/// Registers per consumer thread: 128 x (24 + kConsumers x this) <= 65536.
template <int kD>
constexpr int kConsumerRegs8 = kConsumers8<kD> == 3 ? 160 : 240;
//! [three_consumers]

/// Byte offset in a P buffer of the row that lane gives stmatrix (matrix i = lane / 8 is rows
/// 16 warp + 8 (i % 2) + 0..7, chunk i / 2 of k-step 0; see pack), swizzled.
__device__ inline uint32_t p_matrix_row(int warp, int lane) {
  const int i = lane / 8, row = 16 * warp + 8 * (i % 2) + lane % 8;
  return row * 128 + ((i / 2) ^ (lane % 8)) * 16;
}

/// The e4m3 operations of the three-consumer schedule. Each consumer decides alone whether a
/// tile needs the mask for its 64 rows.
template <int kD>
struct Fp8ThreeConsumerOps : Fp8OpsBase<kD, Fp8ThreeSmem<kD>, 64> {
  using L = Fp8ThreeSmem<kD>;
  using Base = Fp8OpsBase<kD, L, 64>;
  using Base::kKeysHi;
  using Base::l;
  using Base::out;
  using Base::p;
  using Base::smem;
  using Base::smem_lo;
  static constexpr int kConsumers = kConsumers8<kD>;
  static constexpr int kP = L::kExtraAt, kOnes = kP + p_buffers_bytes(kConsumers);
  unsigned char* p_tile;             // this warpgroup's first P buffer
  uint32_t p_store;                  // this lane's stmatrix row address in it, for k-step 0 (see pack)
  uint32_t p_cur = 1;                // the buffer pack wrote last, which pv reads
  float sums[4] = {};                // row sums of the P that pv issued last (see fp8_row_sums)
  float w_soft = 0.0f, w_pv = 0.0f;  // l's weight 1 / r for the P that softmax made last / pv issued last

  __device__ explicit Fp8ThreeConsumerOps(const Fp8ConsumerSetup& c)
      : Base(c),
        p_tile(c.smem + kP + c.consumer * kPTile),
        p_store(smem_addr(c.smem + kP + c.consumer * kPTile) + p_matrix_row(c.warp, c.lane)) {}

  __device__ void softmax(int j, float (&s)[kBlockN / 2], float (&rescale)[2]) {
    w_soft = Base::template softmax_tile</*kRowSums=*/false>(j, s, rescale);
  }
  __device__ void pack(const float (&s)[kBlockN / 2]) {
    pack_p_e4m3(s, p);
    //! [p_to_smem]
    // The A fragments' bytes, stored where an SS wgmma reads them, in the buffer pv(j - 1) is not
    // reading: row r of 128 bytes, 16-byte chunk c at chunk c ^ (r % 8) (the 128-byte swizzle).
    // p[kk][i] is row 16 warp + g + 8 (i % 2), chunk 2 kk + i / 2, bytes 4t .. 4t + 3 of it:
    // exactly what stmatrix takes as matrix i of an x4 (8 rows of 16 bytes, thread g t holding
    // row g's bytes 4t .. 4t + 3), so one stmatrix per k-step stores all four. Each lane gives
    // one row's address (p_store, for k-step 0); k-step kk moves the chunk by 2 kk, an XOR.
    p_cur ^= 1u;
    const uint32_t base = p_store + p_cur * kConsumers * kPTile;
#pragma unroll
    for (int kk = 0; kk < kBlockN / 32; ++kk) stmatrix_x4(base ^ uint32_t(32 * kk), p[kk]);
    // (The fence that makes these stores visible to wgmma is in pv.)
    //! [p_to_smem]
  }
  __device__ void pv(int j) {
    //! [fp8_pv_smem]
    // O += P8 V8 with both operands in shared memory: A = this warpgroup's P buffer, B = the V^T
    // tile (keys contiguous in each of its kD rows of 128 bytes). At head_dim 256, as two n = 128
    // halves: O's columns 128.. (out[64..]) from V^T's rows 128.., 16 KiB further.
    const uint32_t v_lo = Base::v_lo(j);
    const uint32_t p_lo = smem_lo + uint32_t(p_tile - smem) / 16 + p_cur * (kConsumers * kPTile / 16);
    // wgmma reads shared memory through the async proxy: pack's stores must be made visible to
    // it. The fence waits for those stores to land, so it sits here, after S_{j+1} is issued,
    // not right after the stores. Each warp's 16 rows of P feed only its own 16 rows of O, so the
    // warp's own stores are all that must be visible: no warpgroup barrier.
    fence_proxy_async_shared();
    __syncwarp();
    wgmma_fence();
#pragma unroll
    for (int half = 0; half < kD / 128; ++half)
#pragma unroll
      for (int kk = 0; kk < kBlockN / 32; ++kk)
        wgmma_m64n128k32_e4m3_ss(*reinterpret_cast<float(*)[64]>(&out[64 * half]), desc_join(p_lo + 2 * kk, kKeysHi),
                                 desc_join(v_lo + half * (128 * 128 / 16) + 2 * kk, kKeysHi), true);
    issue_row_sums(p_lo);
    wgmma_commit();
    //! [fp8_pv_smem]
  }
  //! [fp8_row_sums]
  // l from the tensor cores. The softmax's row sums cost an FADD per score; a wgmma of P against
  // 8 columns of ones (m64n8k32, B a constant tile of e4m3 1.0) gives the same sums from the P8
  // that P V uses, in the same commit group. They are read once that group is done
  // (rescale_out), and enter l as O's columns do: l = (l + sums / r) * rescale. Summing the
  // rounded P8 also makes l the exact total of the weights O was built from.
  __device__ void issue_row_sums(uint32_t p_lo) {
    const uint32_t ones_lo = smem_lo + kOnes / 16;
    w_pv = w_soft;
#pragma unroll
    for (int kk = 0; kk < kBlockN / 32; ++kk)
      wgmma_m64n8k32_e4m3_ss(sums, desc_join(p_lo + 2 * kk, kKeysHi), desc_join(ones_lo + 2 * kk, kKeysHi), kk > 0);
  }
  /// The row sums of the P V just finished into l (after the last tile, the kernel calls it too).
  __device__ void add_sums() {
    l[0] += sums[0] * w_pv;
    l[1] += sums[2] * w_pv;
  }
  __device__ void rescale_out(const float (&rescale)[2]) {
    add_sums();
    l[0] *= rescale[0];
    l[1] *= rescale[1];
    rescale_output<kD>(out, rescale);
  }
  //! [fp8_row_sums]
  __device__ void fence_out() {
    fence_operands(out);
    fence_operands(sums);
  }
  /// The all-ones B of the row-sum wgmma (e4m3 1.0 = 0x38), written by the block's first 256
  /// threads before the ring's barrier makes it visible.
  __device__ static void write_ones(unsigned char* smem_base, int tid) {
    if (tid < 256) reinterpret_cast<uint32_t*>(smem_base + kOnes)[tid] = 0x38383838u;
    fence_proxy_async_shared();  // seen by wgmma after init_ring's __syncthreads
  }
};

/// The three-consumer schedule: variant 4's (pingpong_schedule) without turns, with P_{j+1}
/// packed into the other P buffer while P_j V_j still reads its own, and V_j waited for only after
/// S_{j+1} (which needs K alone) is issued.
template <class Ops>
__device__ inline void three_consumer_schedule(Ops& ops, int n_tiles) {
  //! [three_consumer_schedule]
  if (n_tiles == 0) return;
  {
    float s[kBlockN / 2];
    float rescale[2];
    ops.wait_k(0);
    ops.scores(0, s);
    wgmma_wait<0>();
    fence_operands(s);
    ops.release_k(0);
    ops.softmax(0, s, rescale);  // O is still zero: nothing to rescale
    ops.pack(s);
  }
  for (int j = 0; j + 1 < n_tiles; ++j) {
    float s[kBlockN / 2];
    float rescale[2];
    ops.wait_k(j + 1);
    ops.scores(j + 1, s);
    ops.wait_v(j);
    ops.pv(j);
    wgmma_wait<1>();  // S_{j+1} is done; P_j V_j may still run
    fence_operands(s);
    ops.release_k(j + 1);
    ops.softmax(j + 1, s, rescale);
    ops.pack(s);  // into the other P buffer, while P_j V_j still reads its own
    wgmma_wait<0>();
    ops.fence_out();
    ops.release_v(j);
    ops.rescale_out(rescale);  // O now holds P_j V_j too: bring it to the new max
  }
  ops.wait_v(n_tiles - 1);
  ops.pv(n_tiles - 1);
  wgmma_wait<0>();
  ops.fence_out();
  ops.release_v(n_tiles - 1);
  //! [three_consumer_schedule]
}

template <int kD>
__global__ void __launch_bounds__(128 * (1 + kConsumers8<kD>), 1)
    flash3_fp8_three_consumers_kernel(const __grid_constant__ CUtensorMap tm_q,
                                      const __grid_constant__ CUtensorMap tm_k,
                                      const __grid_constant__ CUtensorMap tm_vt, AttentionShape shape, Fp8Scales scales,
                                      Fp8Grid grid, __nv_bfloat16* o, float* lse) {
  using L = Fp8ThreeSmem<kD>;
  using Ops = Fp8ThreeConsumerOps<kD>;
  constexpr int kConsumers = kConsumers8<kD>, kBlockM = 64 * kConsumers;
  extern __shared__ unsigned char shared_raw[];
  unsigned char* smem = aligned_smem(shared_raw);
  const Fp8Barriers bars(smem + L::kBars, L::kStages);

  const int tid = threadIdx.x, wg = tid / 128;
  const Piece work(grid, blockIdx.x);
  int q_block, bh;
  longest_first(shape.causal, work.item, grid.q_blocks, grid.planes, q_block, bh);
  //! [short_block]
  // When the 64-row groups do not fill the last block, the first block is the short one (under
  // the causal mask the cheapest), not the last: its first consumers have no rows (TMA fills Q
  // rows above 0 with zeros) and only keep the ring's counts.
  const int empty_groups = (kConsumers - (shape.seq_q + 63) / 64 % kConsumers) % kConsumers;
  const int i0 = q_block * kBlockM - 64 * empty_groups;
  //! [short_block]
  const PieceTiles tiles(shape, work, bh, i0, kBlockM);
  const int tile0 = tiles.tile0, n_tiles = tiles.n_tiles;

  Ops::write_ones(smem, tid);
  init_ring(bars.q_full, bars.k_full, bars.v_full, L::kStages, bars.k_empty, bars.v_empty, 128 * kConsumers);
  if (wg == 0) {  // the producer, as in variant 3
    setmaxnreg_dec<24>();
    if (tid == 0) produce_fp8<L>(smem, bars, tm_q, tm_k, tm_vt, i0, bh, tiles);
    return;
  }

  //! [uniform_consumer]
  setmaxnreg_inc<kConsumerRegs8<kD>>();  // 160 with three consumers, 240 with two
  // consumer and warp through a shuffle from lane 0: the compiler then knows they are the same in
  // every lane of a warp, and keeps what derives from them in uniform registers.
  const int consumer = __shfl_sync(0xFFFFFFFFu, wg - 1, 0), warp = __shfl_sync(0xFFFFFFFFu, (tid % 128) / 32, 0);
  //! [uniform_consumer]
  const int c0 = i0 + 64 * consumer;
  // A consumer stops at its own last visible tile (under the causal mask the first one's rows see
  // up to 128 keys fewer) and only waits for and releases the rest, so the ring's counts stay the
  // same for all consumers.
  const int my_end = c0 >= shape.seq_q || c0 < 0 ? 0
                     : shape.causal              ? shape.visible_keys(min(c0 + 64, shape.seq_q) - 1)
                                                 : shape.seq_kv;
  const int my_tiles = my_end > 0 ? max(0, min(tile0 + n_tiles, (my_end + kBlockN - 1) / kBlockN) - tile0) : 0;
  Fp8ConsumerSetup setup(smem, bars, shape, scales, bh, tiles);
  setup.c0 = c0;
  setup.mask_i0 = c0;
  setup.my_tiles = my_tiles;
  setup.consumer = consumer;
  setup.warp = warp;
  setup.lane = tid % 32;
  Ops ops(setup);
  mbarrier_wait(bars.q_full, 0);
  three_consumer_schedule(ops, my_tiles);
  ops.add_sums();  // the last tile's row sums (no rescale follows it)
  for (int j = my_tiles; j < n_tiles; ++j) {
    ops.wait_k(j);
    ops.release_k(j);
    ops.wait_v(j);
    ops.release_v(j);
  }
  ops.to_true_units();
  if (c0 < 0) return;                                                       // an empty group of the short block
  finish_fp8<kD, kConsumers>(ops, work, grid, bh, consumer, warp, o, lse);  // l: whole rows already
}

}  // namespace
}  // namespace fa::flash3
