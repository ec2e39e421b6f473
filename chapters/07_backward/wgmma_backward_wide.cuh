// Chapter 07, variant 4 at head_dim 256: the dK/dV and dQ kernels with the work of a block split
// another way (the comment below says how). Included by backward_wgmma_sm90a.cu only, whose
// launcher picks these kernels at head_dim 256. bf16, sm_90a.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "device_utils.cuh"
#include "hopper.cuh"
#include "log2_units.h"
#include "problem.h"
#include "tma.h"
#include "wgmma_backward.cuh"

namespace fa::backward {
namespace {

using namespace sm90;

// ---- head_dim 256 --------------------------------------------------------------------------
// At d = 256 a dK/dV consumer of the kernels above would hold 64 keys x 256 columns of both dK
// and dV, 256 floats per thread, and a dQ block's Q, dO and two stages of K and V would take
// 256 KiB of shared memory. The work of a block is split differently instead:
//   dK/dV: a block owns 64 keys, and both consumers work on all of them: consumer 0 computes
//   S^T and P^T and keeps dV += P^T dO, consumer 1 computes dP^T and keeps dK += dS^T Q. dS^T
//   needs P^T: consumer 0 hands it over through shared memory, thread to thread (both hold the
//   same (key, row) elements of their 64 x 64 accumulators), with two named barriers per buffer.
//   Each consumer runs two of the four products, and holds one 128-float accumulator.
//   dQ: a block owns 64 query rows; the consumers take the K/V tiles in turn (consumer c the tiles
//   j with j % 2 == c, in stage c of the ring), each keeping a partial dQ over its tiles; at the
//   end consumer 1 passes its partial to consumer 0 through its own stage's shared memory.

constexpr int kWideKeys = 64;  // keys per dK/dV block at d = 256
constexpr int kWideRows = 64;  // query rows per dQ block at d = 256
/// Named barriers of the wide kernels (0 is __syncthreads'): P^T buffer b is full / empty.
enum WideBarrier : int { kPFull = 1, kPEmpty = 3, kDqPartial = 1 };

template <int kD>
struct WideKvLayout {
  static constexpr int kK = 0, kV = kK + tile_bytes<kD>(kWideKeys);
  static constexpr int kQ = kV + tile_bytes<kD>(kWideKeys);             // kStages Q tiles
  static constexpr int kDo = kQ + kStages * tile_bytes<kD>(kKvRows);    // kStages dO tiles
  static constexpr int kLse = kDo + kStages * tile_bytes<kD>(kKvRows);  // kStages x 64 floats, log2 units
  static constexpr int kDelta = kLse + kStages * kKvRows * 4;           // kStages x 64 floats
  static constexpr int kP = kDelta + kStages * kKvRows * 4;             // 2 P^T buffers, 32 x 128 floats each
  static constexpr int kBars = kP + 2 * 32 * 128 * 4;                   // kv_full, full[2], empty[2]
  static constexpr int kBytes = kBars + 8 * (1 + 2 * kStages) + 1024;
};

static_assert(WideKvLayout<256>::kBytes <= 227 * 1024, "a block may have 227 KiB of shared memory");

//! [wgmma_wide_dkdv]
template <int kD>
__global__ void __launch_bounds__(kThreads, 1)
    dkdv_wide_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                     const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
                     AttentionShape s, const float* lse, const float* delta, StridedRows<__nv_bfloat16> dk,
                     StridedRows<__nv_bfloat16> dv) {
  using L = WideKvLayout<kD>;
  extern __shared__ unsigned char shared_raw[];
  unsigned char* smem = aligned_smem(shared_raw);
  const auto [kv_full, full, empty, lse_s, delta_s] = dkdv_shared<L>(smem);
  float* p_buf = reinterpret_cast<float*>(smem + L::kP);

  const int tid = threadIdx.x, wg = tid / 128;
  const int j0 = blockIdx.x * kWideKeys, kv_plane = blockIdx.y;
  const KvItems<> items(s, kv_plane, j0);
  init_stages(kv_full, full, empty, 32, kConsumerThreads);

  if (wg == 0) {  // the producer, as in dkdv_kernel, with 64 keys
    setmaxnreg_dec<40>();
    if (tid < 32)
      produce_dkdv<kD, kWideKeys, L>(smem, tm_q, tm_k, tm_v, tm_do, s, items, j0, kv_plane, lse, delta, tid);
    return;
  }

  setmaxnreg_inc<232>();
  const int c = wg - 1, ct = tid % 128, warp = ct / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int key_a = j0 + 16 * warp + g;  // this thread's keys in both consumers: key_a, key_a + 8
  const float scale = float(s.softmax_scale()), scale_log2 = scale * kLog2e;
  const KeyRows runs{s, key_a};
  float acc[kPaddedDim<kD> / 2] = {};  // consumer 0: dV, consumer 1: dK
  mbarrier_wait(kv_full, 0);

  int handed = 0;  // P^T tiles handed from consumer 0 to consumer 1 so far; buffer handed % 2
  for (int it = 0; it < items.n; ++it) {
    const int st = StageRing::stage(it), i0 = items.i0(it);
    mbarrier_wait(&full[st], StageRing::full_parity(it));
    if (j0 < s.visible_keys(min(i0 + kKvRows, s.seq_q) - 1)) {
      const unsigned char* q_s = smem + L::kQ + st * tile_bytes<kD>(kKvRows);
      const unsigned char* do_s = smem + L::kDo + st * tile_bytes<kD>(kKvRows);
      const ColumnStats stats{lse_s + st * kKvRows, delta_s + st * kKvRows, t};
      float* p_t = p_buf + (handed % 2) * 32 * 128;
      float x[32];  // consumer 0: S^T, then P^T; consumer 1: dP^T, then dS^T (element i as in dkdv_kernel)
      // The operands are selected, not the wgmma: a wgmma under a branch that ptxas cannot prove
      // uniform is serialized (warning C7520).
      wgmma_fence();
      issue_abt<kD>(x, smem + (c == 0 ? L::kK : L::kV), tile_bytes<64>(kWideKeys), c == 0 ? q_s : do_s,
                    tile_bytes<64>(kKvRows));
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(x);
      // The dS step split between the consumers: P^T here, dS^T = P^T (dP^T - D) in consumer 1.
      if (c == 0) {
        probabilities(x, stats, scale_log2, j0 + kWideKeys > s.visible_keys(i0), runs, i0 + 2 * t);
        if (handed >= 2) named_barrier_sync<kConsumerThreads>(kPEmpty + handed % 2);  // consumer 1 read it
#pragma unroll
        for (int i = 0; i < 32; ++i) p_t[i * 128 + ct] = x[i];
        named_barrier_arrive<kConsumerThreads>(kPFull + handed % 2);
      } else {
        named_barrier_sync<kConsumerThreads>(kPFull + handed % 2);
        float p[32];
#pragma unroll
        for (int i = 0; i < 32; ++i) p[i] = p_t[i * 128 + ct];
        score_gradients(x, p, stats);
        named_barrier_arrive<kConsumerThreads>(kPEmpty + handed % 2);
      }
      uint32_t a[4][4];
      pack_a_bf16(x, a);
      wgmma_fence();
      issue_a_regs_b<kD>(acc, a, c == 0 ? do_s : q_s);  // dV += P^T dO, or dK += dS^T Q
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(acc);
      ++handed;
    }
    mbarrier_arrive(&empty[st]);
  }
  // Consumer 1's last two hand-backs have no write after them to wait for: take them here, so
  // that no barrier is left half arrived.
  if (c == 0)
    for (int h = max(handed, 2); h < handed + 2; ++h) named_barrier_sync<kConsumerThreads>(kPEmpty + h % 2);

  const float acc_scale[2] = {c == 0 ? 1.0f : scale, c == 0 ? 1.0f : scale};
  const StridedRows<__nv_bfloat16>& out = c == 0 ? dv : dk;
  store_rows_bf16<kPaddedDim<kD> / 2, kD>(acc, out.head_start(kv_plane), key_a, s.seq_kv, t, acc_scale,
                                          out.strides.row);
}
//! [wgmma_wide_dkdv]

template <int kD>
struct WideQLayout {
  static constexpr int kQ = 0, kDo = kQ + tile_bytes<kD>(kWideRows);
  static constexpr int kK = kDo + tile_bytes<kD>(kWideRows);           // kStages K tiles: stage c is consumer c's
  static constexpr int kV = kK + kStages * tile_bytes<kD>(kQKeys);     // kStages V tiles
  static constexpr int kBars = kV + kStages * tile_bytes<kD>(kQKeys);  // q_full, full[2], empty[2]
  static constexpr int kBytes = kBars + 8 * (1 + 2 * kStages) + 1024;
};

static_assert(WideQLayout<256>::kBytes <= 227 * 1024, "a block may have 227 KiB of shared memory");

//! [wgmma_wide_dq]
template <int kD>
__global__ void __launch_bounds__(kThreads, 1)
    dq_wide_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                   const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
                   AttentionShape s, const float* lse, const float* delta, StridedRows<__nv_bfloat16> dq) {
  static_assert(kStages == 2, "one stage per consumer");
  using L = WideQLayout<kD>;
  extern __shared__ unsigned char shared_raw[];
  unsigned char* smem = aligned_smem(shared_raw);
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + L::kBars);
  uint64_t* full = q_full + 1;
  uint64_t* empty = full + kStages;

  const int tid = threadIdx.x, wg = tid / 128;
  const int bh = blockIdx.y;
  const int i0 = (gridDim.x - 1 - blockIdx.x) * kWideRows;
  const int kv_plane = (bh / s.heads_q) * s.heads_kv + s.kv_head(bh % s.heads_q);
  const int key_end = s.visible_keys(min(i0 + kWideRows, s.seq_q) - 1);
  const int n_tiles = (key_end + kQKeys - 1) / kQKeys;
  init_stages(q_full, full, empty, 1, 128);  // empty: one consumer uses each stage

  if (wg == 0) {
    setmaxnreg_dec<40>();
    if (tid == 0)
      produce_dq<kD, kWideRows, L>(smem, tm_q, tm_k, tm_v, tm_do, s, i0, bh, kv_plane, n_tiles, q_full, full, empty);
    return;
  }

  setmaxnreg_inc<232>();
  const int c = wg - 1, ct = tid % 128, warp = ct / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int row_a = i0 + 16 * warp + g;  // this thread's rows in both consumers: row_a, row_a + 8
  const float scale = float(s.softmax_scale()), scale_log2 = scale * kLog2e;
  const RowStats stats = row_stats(s, lse, delta, bh, row_a);
  const RowKeys runs{s, row_a};
  const int full_until = i0 < s.seq_q ? s.visible_keys(i0) : 0;
  float dq_acc[kPaddedDim<kD> / 2] = {};
  mbarrier_wait(q_full, 0);

  // Consumer c takes tiles c, c + 2, ...: all of them in stage c.
  for (int jt = c; jt < n_tiles; jt += kStages) {
    const int j0 = jt * kQKeys;
    const unsigned char* k_s = smem + L::kK + c * tile_bytes<kD>(kQKeys);
    const unsigned char* v_s = smem + L::kV + c * tile_bytes<kD>(kQKeys);
    mbarrier_wait(&full[c], StageRing::full_parity(jt));
    float sc[32], dp[32];
    wgmma_fence();
    issue_abt<kD>(sc, smem + L::kQ, tile_bytes<64>(kWideRows), k_s, tile_bytes<64>(kQKeys));
    issue_abt<kD>(dp, smem + L::kDo, tile_bytes<64>(kWideRows), v_s, tile_bytes<64>(kQKeys));
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(sc);
    fence_operands(dp);
    ds_step(sc, dp, stats, scale_log2, j0 + kQKeys > full_until, runs, j0 + 2 * t);  // dp is now dS
    uint32_t a_ds[4][4];
    pack_a_bf16(dp, a_ds);
    wgmma_fence();
    issue_a_regs_b<kD>(dq_acc, a_ds, k_s);  // dQ_c += dS K
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(dq_acc);
    mbarrier_arrive(&empty[c]);
  }

  // Consumer 1's partial dQ to consumer 0, through stage 1's K and V tiles (64 floats of each
  // thread in each): consumer 1 has waited for every copy into stage 1, and no more come.
  float* part_k = reinterpret_cast<float*>(smem + L::kK + tile_bytes<kD>(kQKeys));
  float* part_v = reinterpret_cast<float*>(smem + L::kV + tile_bytes<kD>(kQKeys));
  constexpr int kHalf = kPaddedDim<kD> / 4;
  if (c == 1) {
#pragma unroll
    for (int i = 0; i < kPaddedDim<kD> / 2; ++i) (i < kHalf ? part_k : part_v)[(i % kHalf) * 128 + ct] = dq_acc[i];
    named_barrier_arrive<kConsumerThreads>(kDqPartial);
    return;
  }
  named_barrier_sync<kConsumerThreads>(kDqPartial);
#pragma unroll
  for (int i = 0; i < kPaddedDim<kD> / 2; ++i) dq_acc[i] += (i < kHalf ? part_k : part_v)[(i % kHalf) * 128 + ct];
  const float dq_scale[2] = {scale, scale};
  store_rows_bf16<kPaddedDim<kD> / 2, kD>(dq_acc, dq.head_start(bh), row_a, s.seq_q, t, dq_scale, dq.strides.row);
}
//! [wgmma_wide_dq]

}  // namespace
}  // namespace fa::backward
