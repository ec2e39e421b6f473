// Chapter 07, variants 5 and 6 -- `fused` and `fused_bulk`: variant 4's dK/dV kernel computes dQ
// as well, from the dS^T tile it already holds: five products per (K/V block, Q tile) where
// variant 4's two kernels run seven. bf16, sm_90a. Blocks add into one fp32 dQ in an order that
// varies from launch to launch, so dQ is not bitwise repeatable; variant 4 is.
//
// A block owns 128 keys (64 per consumer warpgroup) and loops over the Q tiles (kRows rows: 128
// at head_dim 64, 64 at 96 and 128) of every query head sharing its K/V head, as variant 4's
// dK/dV kernel does. Per Q tile, consumer c:
//   S^T, dP^T, P^T, dS^T; dV_c += P^T dO, dK_c += dS^T Q       as in variant 4
//   its 64 keys of dS^T into shared memory (stmatrix), next to the other consumer's: dS^T of the
//   block's 128 keys x kRows rows, one named barrier for both halves
//   its part of dQ_i = dS K, 128 keys deep      wgmma ss: A = the dS^T tile read transposed
//                                               (MN-major), B = K (MN-major); at head_dim 64
//                                               rows 64 c .. 64 c + 63, else half the columns
//   dQ32[its part] += scale * dQ_i              variant 5: fp32 atomics, two floats each, into a
//                                               row-major dQ32; variant 6: the 64 x 64 part into
//                                               shared memory, then one bulk reduction by the
//                                               TMA unit into dQ32 kept part by part (DqPath)
// and a last small kernel rounds dQ32 to bf16 (variant 6's puts the rows back in order). Head
// dims 64, 128, and 96 as 128 (kPaddedDim).
// Run: build/bin/ch07_backward --variant fused (or fused_bulk)
#include <cuda_bf16.h>

#include <cstdint>
#include <string>

#include "cuda_check.h"
#include "delta.cuh"
#include "device_utils.cuh"
#include "fused_tile.cuh"
#include "hopper.cuh"
#include "problem.h"
#include "registry.h"
#include "static_switch.h"
#include "tma.h"
#include "wgmma_backward.cuh"

namespace fa::backward {
namespace {

using namespace sm90;

/// Named barriers (0 is __syncthreads'): both consumers' halves of this Q tile's dS^T are
/// stored; consumer c's dQ part is in shared memory (kDqStored + c, the bulk way only).
enum FusedBarrier : int { kDsStored = 1, kDqStored = 2 };

template <int kD, DqPath kPath>
__global__ void __launch_bounds__(kThreads, 1)
    fused_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                 const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do, AttentionShape s,
                 const float* lse, const float* delta, float* dq32, StridedRows<__nv_bfloat16> dk,
                 StridedRows<__nv_bfloat16> dv) {
  constexpr int kRows = kRowsOf<kD>;
  using L = KvLayout<kD, kRows, kExtraOf<kD, kPath>>;
  using Split = DqSplit<kD>;
  extern __shared__ unsigned char shared_raw[];
  unsigned char* smem = aligned_smem(shared_raw);
  const auto [kv_full, full, empty, lse_s, delta_s] = dkdv_shared<L>(smem);

  // The warpgroup read through a shuffle from lane 0: the compiler then knows it is the same in
  // every lane, and keeps what derives from it (the descriptors below) in uniform registers.
  const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid / 128, 0), wg_tid = tid % 128;
  const int j0 = blockIdx.x * kKvKeys, kv_plane = blockIdx.y;
  const KvItems<kRows> items(s, kv_plane, j0);
  init_stages(kv_full, full, empty, 32, kConsumerThreads);

  if (wg == 0) {  // the producer warp, as in variant 4
    setmaxnreg_dec<40>();
    if (tid < 32)
      produce_dkdv<kD, kKvKeys, L, kRows>(smem, tm_q, tm_k, tm_v, tm_do, s, items, j0, kv_plane, lse, delta, tid);
    return;
  }

  setmaxnreg_inc<232>();
  const int c = wg - 1, warp = wg_tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int jc = j0 + 64 * c;            // this consumer's first key
  const int key_a = jc + 16 * warp + g;  // this thread's keys: key_a, key_a + 8
  const float scale = float(s.softmax_scale()), scale_log2 = scale * kLog2e;
  // The rows that see each of the thread's keys. Keys past the end of the sequence (the last
  // block) see none: TMA reads their K rows as zeros, but P^T there is exp(-LSE), which may be
  // infinite, and inf * 0 in dS K would be NaN.
  const KeyRows runs{s, key_a};
  float dk_acc[kPaddedDim<kD> / 2] = {}, dv_acc[kPaddedDim<kD> / 2] = {};
  mbarrier_wait(kv_full, 0);

  // The descriptors' low words (desc_lo) of shared memory's first byte, for the three leading
  // offsets the products use: 16 (K-major operands: S^T and dP^T), a Q/dO box (Q and dO read
  // MN-major by dV and dK) and a 128-key box (dS^T and K read MN-major by dQ). Every operand is
  // then one of these plus a constant, or plus a stage's or a dS^T buffer's offset: one add.
  const uint32_t lo16 = desc_lo(smem, 16), lo_q = desc_lo(smem, tile_bytes<64>(kRows)),
                 lo_keys = desc_lo(smem, kKeyBoxBytes);
  const uint32_t k_lo = lo16 + (L::kK + 64 * c * kBoxRowBytes) / 16, v_lo = lo16 + (L::kV + 64 * c * kBoxRowBytes) / 16;

  int tiles = 0;  // Q tiles computed so far; this one's dS^T goes into buffer tiles % 2
  for (int it = 0, bh = items.head0, i0 = items.first_tile * kRows; it < items.n; ++it, items.next(bh, i0)) {
    const int st = StageRing::stage(it);
    mbarrier_wait(&full[st], StageRing::full_parity(it));
    // The block's first key against the tile's last row: the same answer in both consumers,
    // which meet at a barrier below.
    if (j0 >= s.visible_keys(min(i0 + kRows, s.seq_q) - 1)) {
      mbarrier_arrive(&empty[st]);
      continue;
    }
    const int q_at = L::kQ + st * tile_bytes<kD>(kRows), do_at = L::kDo + st * tile_bytes<kD>(kRows);
    const int ds_at = L::kExtra + (tiles % 2) * kDsBytes<kD>;
    //! [fused_scores]
    // S^T, dP^T (64 keys x kRows rows); element 4 n + e: key key_a + 8 (e / 2), row i0 + 8 n + 2 t + (e & 1).
    // Two commit groups: P^T = exp2(...) is computed as soon as S^T is done, while the tensor
    // cores still work on dP^T.
    float st_acc[kRows / 2], dpt[kRows / 2];
    wgmma_fence();
    issue_abt<kD, kRows>(st_acc, k_lo, tile_bytes<64>(kKvKeys), lo16 + q_at / 16, tile_bytes<64>(kRows));
    wgmma_commit();
    issue_abt<kD, kRows>(dpt, v_lo, tile_bytes<64>(kKvKeys), lo16 + do_at / 16, tile_bytes<64>(kRows));
    wgmma_commit();
    // Masked when the tile's first row misses a key of this consumer's, or a key is past the end.
    const bool masked = jc + 64 > s.visible_keys(i0);
    const ColumnStats stats{lse_s + st * kRows, delta_s + st * kRows, t};
    wgmma_wait<1>();
    fence_operands(st_acc);
    probabilities(st_acc, stats, scale_log2, masked, runs, i0 + 2 * t);  // P^T
    wgmma_wait<0>();
    fence_operands(dpt);
    score_gradients(dpt, st_acc, stats);  // dS^T
    uint32_t a_p[kRows / 16][4], a_ds[kRows / 16][4];
    pack_a_bf16(st_acc, a_p);
    pack_a_bf16(dpt, a_ds);
    //! [fused_scores]
    //! [fused_update]
    // dS^T into shared memory for the dQ product (made visible to wgmma, which reads through the
    // async proxy); dV goes to the tensor cores meanwhile.
    unsigned char* ds_tile = smem + ds_at;
    store_ds_t<kRows>(ds_tile, a_ds, 64 * c + 16 * warp, lane);
    fence_proxy_async_shared();
    wgmma_fence();
    issue_a_regs_b<kD, kRows>(dv_acc, a_p, lo_q + do_at / 16);  // dV_c += P^T dO
    wgmma_commit();
    // Both halves of dS^T stored. The buffer is written again two tiles later, after the next
    // tile's barrier, which each consumer reaches only once its dQ product here has finished.
    // With kBulk the thread that hands the dQ part over waits first until the last bulk
    // reduction has read it, so no thread writes the part again before that.
    if (kPath == DqPath::kBulk && wg_tid == 0) bulk_wait_read<0>();
    named_barrier_sync<kConsumerThreads>(kDsStored);
    // dQ, then dK: dQ's part is written out (below) while dK is still on the tensor cores.
    float dq_acc[Split::kCols / 2];
    wgmma_fence();
    issue_dq<kD>(dq_acc, lo_keys + ds_at / 16, lo_keys + L::kK / 16, c);
    wgmma_commit();
    issue_a_regs_b<kD, kRows>(dk_acc, a_ds, lo_q + q_at / 16);  // dK_c += dS^T Q
    wgmma_commit();
    wgmma_wait<1>();  // dV and dQ done
    fence_operands(dq_acc);
    //! [fused_update]
    if constexpr (kPath == DqPath::kAtomics) {
      //! [fused_atomics]
      // dQ32 += scale * dQ_i for this thread's rows row0 + 16 warp + g (+ 8) and columns
      // col0 + 8 n + 2 t (+ 1), two floats per atomic.
      const int row0 = i0 + (Split::kByRows ? 64 * c : 0), col0 = Split::kByRows ? 0 : c * Split::kCols;
      float* dq_head = dq32 + int64_t(bh) * s.seq_q * kD;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row0 + 16 * warp + g + 8 * h;
        if (row >= s.seq_q) continue;
#pragma unroll
        for (int n = 0; n < Split::kCols / 8; ++n) {
          const int col = col0 + 8 * n + 2 * t;
          if (col < kD)
            atomicAdd(reinterpret_cast<float2*>(dq_head + int64_t(row) * kD + col),
                      make_float2(dq_acc[4 * n + 2 * h] * scale, dq_acc[4 * n + 2 * h + 1] * scale));
        }
      }
      //! [fused_atomics]
    } else {
      // dQ_i into this consumer's part in shared memory, then one bulk reduction into dQ32's part
      // (fused_tile.cuh's add_dq_part).
      float* part_s = reinterpret_cast<float*>(smem + L::kExtra + 2 * kDsBytes<kD> + c * kDqPartBytes);
      add_dq_part<kD, kDqStored>(dq_acc, part_s, dq32, bh, (s.seq_q + kRows - 1) / kRows, i0 / kRows, c, wg_tid);
    }
    wgmma_wait<0>();  // dK done: the stage's Q and dO are free
    fence_operands(dv_acc);
    fence_operands(dk_acc);
    mbarrier_arrive(&empty[st]);
    ++tiles;
  }

  if (kPath == DqPath::kBulk && wg_tid == 0) bulk_wait<0>();  // the shared memory stays until it is read
  const float dk_scale[2] = {scale, scale}, dv_scale[2] = {1.0f, 1.0f};
  store_rows_bf16<kPaddedDim<kD> / 2, kD>(dk_acc, dk.head_start(kv_plane), key_a, s.seq_kv, t, dk_scale,
                                          dk.strides.row);
  store_rows_bf16<kPaddedDim<kD> / 2, kD>(dv_acc, dv.head_start(kv_plane), key_a, s.seq_kv, t, dv_scale,
                                          dv.strides.row);
}

template <int kD, DqPath kPath>
void launch_dim(const BackwardParams& p) {
  const AttentionShape& s = p.shape;
  float* delta = static_cast<float*>(p.workspace);
  float* dq32 = delta + dq32_offset(s);
  const std::size_t dq_floats = dq32_floats(s, kPath);
  CUDA_CHECK(cudaMemsetAsync(dq32, 0, dq_floats * sizeof(float), p.stream));
  launch_delta<__nv_bfloat16>(p, delta);
  const int kv_planes = s.batch * s.heads_kv;
  const BackwardStrides st = p.strides ? *p.strides : BackwardStrides::packed(s);
  const CUtensorMap tm_q = make_tensor_map_heads(p.q, kD, s.seq_q, s.heads_q, s.batch, st.q, kRowsOf<kD>);
  const CUtensorMap tm_do = make_tensor_map_heads(p.d_o, kD, s.seq_q, s.heads_q, s.batch, st.d_o, kRowsOf<kD>);
  const CUtensorMap tm_k = make_tensor_map_heads(p.k, kD, s.seq_kv, s.heads_kv, s.batch, st.k, kKvKeys);
  const CUtensorMap tm_v = make_tensor_map_heads(p.v, kD, s.seq_kv, s.heads_kv, s.batch, st.v, kKvKeys);
  const StridedRows<__nv_bfloat16> dq{static_cast<__nv_bfloat16*>(p.dq), st.dq, s.heads_q},
      dk{static_cast<__nv_bfloat16*>(p.dk), st.dk, s.heads_kv},
      dv{static_cast<__nv_bfloat16*>(p.dv), st.dv, s.heads_kv};
  constexpr int kBytes = KvLayout<kD, kRowsOf<kD>, kExtraOf<kD, kPath>>::kBytes;
  static_assert(kBytes <= 227 * 1024, "a block may have 227 KiB of shared memory");
  CUDA_CHECK(cudaFuncSetAttribute(fused_kernel<kD, kPath>, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes));
  const dim3 grid(unsigned((s.seq_kv + kKvKeys - 1) / kKvKeys), unsigned(kv_planes));
  fused_kernel<kD, kPath><<<grid, kThreads, kBytes, p.stream>>>(tm_q, tm_k, tm_v, tm_do, s, p.lse, delta, dq32, dk, dv);
  CUDA_CHECK_LAUNCH();
  if constexpr (kPath == DqPath::kAtomics) {
    launch_round_dq<__nv_bfloat16>(dq32, p);
  } else {
    const int64_t n4 = int64_t(dq_floats / 4);
    const int q_tiles = (s.seq_q + kRowsOf<kD> - 1) / kRowsOf<kD>;
    round_dq_parts_kernel<kD><<<unsigned((n4 + 255) / 256), 256, 0, p.stream>>>(
        reinterpret_cast<const float4*>(dq32), dq, s.seq_q, q_tiles, n4, float(s.softmax_scale()));
    CUDA_CHECK_LAUNCH();
  }
}

template <DqPath kPath>
void launch_fused(const BackwardParams& p) {
  with_head_dim<64, 96, 128>(p.shape.head_dim, [&](auto d) { launch_dim<d.value, kPath>(p); });
}

template <DqPath kPath>
BackwardKernel fused_kernel_entry(const char* name, int number, const char* variant, const char* summary) {
  BackwardKernel k{name, 7, number, variant, DType::BF16, summary, launch_fused<kPath>};
  k.supports = [](const AttentionShape& s) {
    return hopper_support(s, kPath == DqPath::kBulk ? "variant 6" : "variant 5", {64, 96, 128});
  };
  k.workspace_bytes = [](const AttentionShape& s) { return (dq32_offset(s) + dq32_floats(s, kPath)) * sizeof(float); };
  k.strided = true;  // the tensor maps, D's rows and the dQ/dK/dV stores take any strides
  return k;
}

}  // namespace

FA_REGISTER_BACKWARD_KERNEL(fused_kernel_entry<DqPath::kAtomics>(
    "ch07_fused_bf16", 5, "fused",
    "variant 4's dK/dV kernel also computes dQ = dS K from dS^T in shared memory, fp32 atomics: 5 products, not 7"));
FA_REGISTER_BACKWARD_KERNEL(fused_kernel_entry<DqPath::kBulk>(
    "ch07_fused_bulk_bf16", 6, "fused_bulk",
    "variant 5 with dQ handed to the TMA unit: each consumer's 64 x 64 part through shared memory, one bulk "
    "reduction per part and tile in place of 16 atomics per thread"));

}  // namespace fa::backward
