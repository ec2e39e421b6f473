// Chapter 07, variant 4 -- `wgmma`: variant 3's two kernels (dK/dV per K/V tile, dQ per Q tile,
// no atomics, bitwise repeatable) rebuilt with chapter 06's Hopper machinery. bf16, sm_90a.
//
// Why it pays: in variants 2 and 3 every warp reads the whole Q and dO tile from shared memory
// with ldmatrix for its own 16 keys, so shared memory, not the tensor cores, sets the pace. A
// wgmma is issued by a warpgroup (4 warps) for 64 rows at once and reads its B operand from
// shared memory itself, once for the 64 rows.
//
// Both kernels have 3 warpgroups: warpgroup 0 is the producer (one warp issues TMA copies into a
// two-stage ring of full/empty mbarriers, as in chapter 06's variant 3), warpgroups 1 and 2 are
// consumers, each owning 64 rows of the M side:
//
//   dK/dV kernel: a block owns 128 keys (64 per consumer), K and V stay in shared memory; it
//   loops over the 64-row Q tiles of every query head sharing its K/V head.
//     S^T  (64 keys x 64 rows) = K_c Q^T          wgmma ss   (both K-major, like Q K^T)
//     dP^T (64 keys x 64 rows) = V_c dO^T         wgmma ss
//     P^T = exp(S^T scale - LSE), dS^T = P^T (dP^T - D)          in registers
//     dV_c += P^T dO,  dK_c += dS^T Q             wgmma rs   (A = P^T, dS^T from the
//                                                 accumulators, B = dO, Q "MN-major", like V in P V)
//   dQ kernel: a block owns 128 query rows (64 per consumer) and loops over 64-key K/V tiles.
//     S (64 rows x 64 keys) = Q_c K^T,  dP = dO_c V^T             wgmma ss
//     dS = P (dP - D)                                            in registers
//     dQ_c += dS K                                               wgmma rs (B = K, MN-major)
// The dQ kernel is chapter 06's forward with dP in place of the online softmax: no max to track,
// since the LSE is known. The two kernels are independent (both need only D) and run on two
// streams, as in variant 3. Head dims 64, 128, 96 as 128 with zero-filled columns (kPaddedDim), and
// 256 with the work of a block split another way (dkdv_wide_kernel, dq_wide_kernel, in
// wgmma_backward_wide.cuh).
// Run: build/bin/ch07_backward --variant wgmma
#include <cuda_bf16.h>

#include <cstdint>
#include <string>

#include "cuda_check.h"
#include "delta.cuh"
#include "device_utils.cuh"
#include "hopper.cuh"
#include "log2_units.h"
#include "problem.h"
#include "registry.h"
#include "static_switch.h"
#include "tma.h"
#include "wgmma_backward.cuh"
#include "wgmma_backward_wide.cuh"

namespace fa::backward {
namespace {

using namespace sm90;

// ---- the dK/dV kernel ----------------------------------------------------------------------

//! [wgmma_dkdv_kernel]
template <int kD>
__global__ void __launch_bounds__(kThreads, 1)
    dkdv_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do, AttentionShape s,
                const float* lse, const float* delta, StridedRows<__nv_bfloat16> dk, StridedRows<__nv_bfloat16> dv) {
  using L = KvLayout<kD>;
  extern __shared__ unsigned char shared_raw[];
  unsigned char* smem = aligned_smem(shared_raw);
  const auto [kv_full, full, empty, lse_s, delta_s] = dkdv_shared<L>(smem);

  const int tid = threadIdx.x, wg = tid / 128;
  const int j0 = blockIdx.x * kKvKeys, kv_plane = blockIdx.y;
  const KvItems<> items(s, kv_plane, j0);
  // Full: the producer warp (lane 0's expect_tx + 31 plain arrivals); empty: both consumers.
  init_stages(kv_full, full, empty, 32, kConsumerThreads);

  if (wg == 0) {
    setmaxnreg_dec<40>();
    if (tid < 32) produce_dkdv<kD, kKvKeys, L>(smem, tm_q, tm_k, tm_v, tm_do, s, items, j0, kv_plane, lse, delta, tid);
    return;
  }

  setmaxnreg_inc<232>();
  const int c = wg - 1, warp = (tid % 128) / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int jc = j0 + 64 * c;            // this consumer's first key
  const int key_a = jc + 16 * warp + g;  // this thread's keys: key_a, key_a + 8
  const float scale = float(s.softmax_scale()), scale_log2 = scale * kLog2e;
  const unsigned char* k_rows = smem + L::kK + 64 * c * kBoxRowBytes;
  const unsigned char* v_rows = smem + L::kV + 64 * c * kBoxRowBytes;
  const KeyRows runs{s, key_a};  // the rows that see each of the thread's keys
  float dk_acc[kPaddedDim<kD> / 2] = {}, dv_acc[kPaddedDim<kD> / 2] = {};
  mbarrier_wait(kv_full, 0);

  for (int it = 0; it < items.n; ++it) {
    const int st = StageRing::stage(it), i0 = items.i0(it);
    mbarrier_wait(&full[st], StageRing::full_parity(it));
    // With the causal mask, a Q tile may end before the first row that sees this consumer's keys.
    if (jc < s.visible_keys(min(i0 + kKvRows, s.seq_q) - 1)) {
      const unsigned char* q_s = smem + L::kQ + st * tile_bytes<kD>(kKvRows);
      const unsigned char* do_s = smem + L::kDo + st * tile_bytes<kD>(kKvRows);
      //! [wgmma_dkdv_scores]
      float st_acc[32], dpt[32];  // S^T, dP^T; element 4 n + e: key key_a + 8 (e / 2), row i0 + 8 n + 2 t + (e & 1)
      wgmma_fence();
      issue_abt<kD>(st_acc, k_rows, tile_bytes<64>(kKvKeys), q_s, tile_bytes<64>(kKvRows));
      issue_abt<kD>(dpt, v_rows, tile_bytes<64>(kKvKeys), do_s, tile_bytes<64>(kKvRows));
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(st_acc);
      fence_operands(dpt);
      // Some (row, key) of the tile is hidden when this consumer's last key is past what the
      // tile's first row sees.
      const bool masked = s.causal && jc + 64 > s.visible_keys(i0);
      const ColumnStats stats{lse_s + st * kKvRows, delta_s + st * kKvRows, t};
      ds_step(st_acc, dpt, stats, scale_log2, masked, runs, i0 + 2 * t);  // now P^T and dS^T
      //! [wgmma_dkdv_scores]
      uint32_t a_p[4][4], a_ds[4][4];
      pack_a_bf16(st_acc, a_p);
      pack_a_bf16(dpt, a_ds);
      //! [wgmma_dkdv_update]
      wgmma_fence();
      issue_a_regs_b<kD>(dv_acc, a_p, do_s);  // dV_c += P^T dO
      issue_a_regs_b<kD>(dk_acc, a_ds, q_s);  // dK_c += dS^T Q
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(dv_acc);
      fence_operands(dk_acc);
      //! [wgmma_dkdv_update]
    }
    mbarrier_arrive(&empty[st]);
  }

  // dK = dS^T Q * scale and dV for this thread's two keys, rounded once.
  const float dk_scale[2] = {scale, scale}, dv_scale[2] = {1.0f, 1.0f};
  store_rows_bf16<kPaddedDim<kD> / 2, kD>(dk_acc, dk.head_start(kv_plane), key_a, s.seq_kv, t, dk_scale,
                                          dk.strides.row);
  store_rows_bf16<kPaddedDim<kD> / 2, kD>(dv_acc, dv.head_start(kv_plane), key_a, s.seq_kv, t, dv_scale,
                                          dv.strides.row);
}
//! [wgmma_dkdv_kernel]

// ---- the dQ kernel -------------------------------------------------------------------------

constexpr int kQRows = 64 * kConsumers;  // query rows per block

template <int kD>
struct QLayout {
  static constexpr int kQ = 0, kDo = kQ + tile_bytes<kD>(kQRows);
  static constexpr int kK = kDo + tile_bytes<kD>(kQRows);              // kStages K tiles
  static constexpr int kV = kK + kStages * tile_bytes<kD>(kQKeys);     // kStages V tiles
  static constexpr int kBars = kV + kStages * tile_bytes<kD>(kQKeys);  // q_full, full[2], empty[2]
  static constexpr int kBytes = kBars + 8 * (1 + 2 * kStages) + 1024;
};

//! [wgmma_dq_kernel]
template <int kD>
__global__ void __launch_bounds__(kThreads, 1)
    dq_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
              const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do, AttentionShape s,
              const float* lse, const float* delta, StridedRows<__nv_bfloat16> dq) {
  using L = QLayout<kD>;
  extern __shared__ unsigned char shared_raw[];
  unsigned char* smem = aligned_smem(shared_raw);
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + L::kBars);
  uint64_t* full = q_full + 1;
  uint64_t* empty = full + kStages;

  const int tid = threadIdx.x, wg = tid / 128;
  const int bh = blockIdx.y;
  const int i0 = (gridDim.x - 1 - blockIdx.x) * kQRows;  // the longest rows (causal) first
  const int kv_plane = (bh / s.heads_q) * s.heads_kv + s.kv_head(bh % s.heads_q);
  const int key_end = s.visible_keys(min(i0 + kQRows, s.seq_q) - 1);
  const int n_tiles = (key_end + kQKeys - 1) / kQKeys;
  init_stages(q_full, full, empty, 1, kConsumerThreads);

  if (wg == 0) {
    setmaxnreg_dec<40>();
    if (tid == 0)
      produce_dq<kD, kQRows, L>(smem, tm_q, tm_k, tm_v, tm_do, s, i0, bh, kv_plane, n_tiles, q_full, full, empty);
    return;
  }

  setmaxnreg_inc<232>();
  const int c = wg - 1, warp = (tid % 128) / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int ic = i0 + 64 * c;            // this consumer's first row
  const int row_a = ic + 16 * warp + g;  // this thread's rows: row_a, row_a + 8
  const float scale = float(s.softmax_scale()), scale_log2 = scale * kLog2e;
  const RowStats stats = row_stats(s, lse, delta, bh, row_a);
  const RowKeys runs{s, row_a};
  // Keys this consumer's rows see at most, and from which key on some of its rows see less.
  const int my_end = ic < s.seq_q ? s.visible_keys(min(ic + 64, s.seq_q) - 1) : 0;
  const int full_until = ic < s.seq_q ? s.visible_keys(ic) : 0;
  const unsigned char* q_rows = smem + L::kQ + 64 * c * kBoxRowBytes;
  const unsigned char* do_rows = smem + L::kDo + 64 * c * kBoxRowBytes;
  float dq_acc[kPaddedDim<kD> / 2] = {};
  mbarrier_wait(q_full, 0);

  for (int jt = 0; jt < n_tiles; ++jt) {
    const int st = StageRing::stage(jt), j0 = jt * kQKeys;
    mbarrier_wait(&full[st], StageRing::full_parity(jt));
    if (j0 < my_end) {
      const unsigned char* k_s = smem + L::kK + st * tile_bytes<kD>(kQKeys);
      const unsigned char* v_s = smem + L::kV + st * tile_bytes<kD>(kQKeys);
      float sc[32], dp[32];  // element 4 n + e: row row_a + 8 (e / 2), key j0 + 8 n + 2 t + (e & 1)
      wgmma_fence();
      issue_abt<kD>(sc, q_rows, tile_bytes<64>(kQRows), k_s, tile_bytes<64>(kQKeys));
      issue_abt<kD>(dp, do_rows, tile_bytes<64>(kQRows), v_s, tile_bytes<64>(kQKeys));
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(sc);
      fence_operands(dp);
      // Keys past the end, or hidden from some row, only in the last tiles.
      ds_step(sc, dp, stats, scale_log2, j0 + kQKeys > full_until, runs, j0 + 2 * t);  // dp is now dS
      uint32_t a_ds[4][4];
      pack_a_bf16(dp, a_ds);
      wgmma_fence();
      issue_a_regs_b<kD>(dq_acc, a_ds, k_s);  // dQ_c += dS K
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(dq_acc);
    }
    mbarrier_arrive(&empty[st]);
  }

  const float dq_scale[2] = {scale, scale};
  store_rows_bf16<kPaddedDim<kD> / 2, kD>(dq_acc, dq.head_start(bh), row_a, s.seq_q, t, dq_scale, dq.strides.row);
}
//! [wgmma_dq_kernel]

// ---- host ----------------------------------------------------------------------------------

/// The kernels that run at head_dim kD, and their shared memory: the wide ones at 256 only.
template <int kD>
auto dkdv_kernel_for() {
  if constexpr (kD == 256) {
    return dkdv_wide_kernel<kD>;
  } else {
    return dkdv_kernel<kD>;
  }
}
template <int kD>
auto dq_kernel_for() {
  if constexpr (kD == 256) {
    return dq_wide_kernel<kD>;
  } else {
    return dq_kernel<kD>;
  }
}

template <int kD>
void launch_dim(const BackwardParams& p) {
  const AttentionShape& s = p.shape;
  float* delta = static_cast<float*>(p.workspace);
  launch_delta<__nv_bfloat16>(p, delta);
  const cudaStream_t side = fork_side_stream(p.stream);
  const int q_planes = s.batch * s.heads_q, kv_planes = s.batch * s.heads_kv;
  const BackwardStrides st = p.strides ? *p.strides : BackwardStrides::packed(s);
  const StridedRows<__nv_bfloat16> dq{static_cast<__nv_bfloat16*>(p.dq), st.dq, s.heads_q},
      dk{static_cast<__nv_bfloat16*>(p.dk), st.dk, s.heads_kv},
      dv{static_cast<__nv_bfloat16*>(p.dv), st.dv, s.heads_kv};
  // At d = 256 the wide kernels: 64 keys per dK/dV block, 64 rows per dQ block, all boxes 64 rows.
  constexpr bool kWide = kD == 256;
  constexpr int kKeysPerBlock = kWide ? kWideKeys : kKvKeys, kRowsPerBlock = kWide ? kWideRows : kQRows;
  {
    // dK, dV: Q and dO in boxes of 64 rows, K and V in boxes of a block's keys.
    const CUtensorMap tm_q = make_tensor_map_heads(p.q, kD, s.seq_q, s.heads_q, s.batch, st.q, kKvRows);
    const CUtensorMap tm_do = make_tensor_map_heads(p.d_o, kD, s.seq_q, s.heads_q, s.batch, st.d_o, kKvRows);
    const CUtensorMap tm_k = make_tensor_map_heads(p.k, kD, s.seq_kv, s.heads_kv, s.batch, st.k, kKeysPerBlock);
    const CUtensorMap tm_v = make_tensor_map_heads(p.v, kD, s.seq_kv, s.heads_kv, s.batch, st.v, kKeysPerBlock);
    auto kernel = dkdv_kernel_for<kD>();
    constexpr int kBytes = kWide ? WideKvLayout<kD>::kBytes : KvLayout<kD>::kBytes;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes));
    const dim3 grid(unsigned((s.seq_kv + kKeysPerBlock - 1) / kKeysPerBlock), unsigned(kv_planes));
    kernel<<<grid, kThreads, kBytes, p.stream>>>(tm_q, tm_k, tm_v, tm_do, s, p.lse, delta, dk, dv);
    CUDA_CHECK_LAUNCH();
  }
  {
    // dQ on the side stream: Q and dO in boxes of a block's rows, K and V in boxes of 64.
    const CUtensorMap tm_q = make_tensor_map_heads(p.q, kD, s.seq_q, s.heads_q, s.batch, st.q, kRowsPerBlock);
    const CUtensorMap tm_do = make_tensor_map_heads(p.d_o, kD, s.seq_q, s.heads_q, s.batch, st.d_o, kRowsPerBlock);
    const CUtensorMap tm_k = make_tensor_map_heads(p.k, kD, s.seq_kv, s.heads_kv, s.batch, st.k, kQKeys);
    const CUtensorMap tm_v = make_tensor_map_heads(p.v, kD, s.seq_kv, s.heads_kv, s.batch, st.v, kQKeys);
    auto kernel = dq_kernel_for<kD>();
    constexpr int kBytes = kWide ? WideQLayout<kD>::kBytes : QLayout<kD>::kBytes;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes));
    const dim3 grid(unsigned((s.seq_q + kRowsPerBlock - 1) / kRowsPerBlock), unsigned(q_planes));
    kernel<<<grid, kThreads, kBytes, side>>>(tm_q, tm_k, tm_v, tm_do, s, p.lse, delta, dq);
    CUDA_CHECK_LAUNCH();
  }
  join_side_stream(p.stream);
}

void launch_wgmma(const BackwardParams& p) {
  with_head_dim<64, 96, 128, 256>(p.shape.head_dim, [&](auto d) { launch_dim<d.value>(p); });
}

BackwardKernel wgmma_kernel() {
  const char* summary =
      "variant 3 on Hopper: TMA ring + producer warpgroup, S^T/dP^T/dV/dK and S/dP/dQ by wgmma; no atomics";
  BackwardKernel k{"ch07_wgmma_bf16", 7, 4, "wgmma", DType::BF16, summary, launch_wgmma};
  k.supports = [](const AttentionShape& s) { return hopper_support(s, "variant 4", {64, 96, 128, 256}); };
  k.workspace_bytes = [](const AttentionShape& s) { return std::size_t(s.lse_elems()) * sizeof(float); };
  k.deterministic = true;
  k.strided = true;  // the tensor maps, D's rows and the dQ/dK/dV stores take any strides
  return k;
}

}  // namespace

FA_REGISTER_BACKWARD_KERNEL(wgmma_kernel());

}  // namespace fa::backward
