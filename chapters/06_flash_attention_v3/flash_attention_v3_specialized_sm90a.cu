// Chapter 06, variants 3 and 4: warp specialization, then ping-pong and in-warpgroup overlap.
//
// Variant 3, `specialized`: 3 warpgroups. Warpgroup 0 is the producer: it gives most of its
// registers away (setmaxnreg.dec to 24) and one of its threads issues every TMA copy, waiting on
// an "empty" mbarrier per stage before it overwrites one. Warpgroups 1 and 2 are consumers
// (setmaxnreg.inc to 240): each owns 64 rows of the 128-row Q tile, waits on a stage's "full"
// barrier, computes, and arrives on its "empty" barrier. No __syncthreads in the loop: the two
// consumers drift apart, so one's softmax can run while the other's wgmma does.
//
// Variant 4, `pingpong`: the same roles, plus two schedules. It also takes head_dim 96 (as 128,
// the tail columns zero) and 256 (64-key K/V tiles; see kTileKeys in flash3_tile.cuh).
//   * Ping-pong: the consumers take turns issuing their GEMMs, handing the turn over with named
//     barriers, so while one warpgroup runs its softmax the tensor cores work for the other.
//   * In-warpgroup overlap: a consumer issues S_{j+1} = Q K_{j+1}^T and P_j V_j back to back, then
//     runs the softmax of tile j+1 while P_j V_j is still on the tensor cores.
// Variant 8, `lazy`: variant 4 with FlashAttention-4's softmax (lazy_softmax.cuh): a row's
// max moves only when its scores outgrow it by more than a factor 2^8. The other idea, part of the
// exponentials on the FMA pipe instead of MUFU, is the kFmaOfEight parameter, set to none.
// Run: build/bin/ch06_flash_attention_v3 --variant specialized   (or pingpong, lazy)
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda_check.h"
#include "flash3_tile.cuh"
#include "flash_attention_v3.h"
#include "not_implemented.h"
#include "pingpong_ops.cuh"
#include "registry.h"
#include "static_switch.h"
#include "tma.h"

namespace fa::flash3 {
namespace {

using namespace fa::hopper;

/// The share of each 8 exponentials variant 8 computes on the FMA pipe: none. Every share timed
/// on the H200 (1, 2 and 4 of 8) ran slower than none at all but one point of head_dim 64 and 128
/// (performance notes).
constexpr int kFmaOfEight = 0;

/// kSoftmax: -1 for variant 4's online softmax, else variant 8's with that many of each 8
/// exponentials on the FMA pipe (ping-pong only).
template <int kD, bool kPingPong, int kSoftmax = -1>
__global__ void __launch_bounds__(kThreads, 1)
    flash3_specialized_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                              const __grid_constant__ CUtensorMap tm_v, AttentionShape shape,
                              StridedRows<__nv_bfloat16> o, float* lse) {
  using S = Layout<kD>;
  constexpr int kN = kTileKeys<kD>;  // keys per K/V tile
  extern __shared__ unsigned char shared_raw[];
  unsigned char* smem = aligned_smem(shared_raw);
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + S::kBars);
  uint64_t* k_full = q_full + 1;
  uint64_t* v_full = k_full + kStages;
  uint64_t* k_empty = v_full + kStages;
  uint64_t* v_empty = k_empty + kStages;

  const int tid = threadIdx.x, wg = tid / 128;
  const int bh = blockIdx.y;
  const int i0 = (gridDim.x - 1 - blockIdx.x) * kBlockM;
  const int key_end = shape.causal ? shape.visible_keys(min(i0 + kBlockM, shape.seq_q) - 1) : shape.seq_kv;
  const int n_tiles = key_end > 0 ? (key_end + kN - 1) / kN : 0;

  init_ring(q_full, k_full, v_full, kStages, k_empty, v_empty, kConsumerThreads);

  if (wg == 0) {
    //! [producer]
    // The producer: registers handed back, one thread issuing copies. produce_kv (flash3_tile.cuh)
    // waits on a stage's empty barrier, the consumers' arrivals from its previous use, before
    // the refill (the first kStages tiles go into fresh stages and wait for nothing).
    setmaxnreg_dec<24>();
    if (tid == 0) {
      const int kv_plane = (bh / shape.heads_q) * shape.heads_kv + shape.kv_head(bh % shape.heads_q);
      mbarrier_arrive_expect_tx(q_full, S::kQBytes);
      for (int b = 0; b < S::kBoxes; ++b)
        tma_load_head(smem + S::kQ + b * kBlockM * 128, &tm_q, 64 * b, i0, bh, shape.heads_q, q_full);
      produce_kv<kStages>(
          n_tiles, k_empty, v_empty,
          [&](int j, int stage) {
            mbarrier_arrive_expect_tx(&k_full[stage], S::kTileBytes);
            for (int b = 0; b < S::kBoxes; ++b)
              tma_load_head(smem + S::kK + stage * S::kTileBytes + b * S::kKeyBoxBytes, &tm_k, 64 * b, j * kN, kv_plane,
                            shape.heads_kv, &k_full[stage]);
          },
          [&](int j, int stage) {
            mbarrier_arrive_expect_tx(&v_full[stage], S::kTileBytes);
            for (int b = 0; b < S::kBoxes; ++b)
              tma_load_head(smem + S::kV + stage * S::kTileBytes + b * S::kKeyBoxBytes, &tm_v, 64 * b, j * kN, kv_plane,
                            shape.heads_kv, &v_full[stage]);
          });
    }
    //! [producer]
    return;
  }

  setmaxnreg_inc<240>();
  const int consumer = wg - 1, warp = (tid % 128) / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int row0 = i0 + 64 * consumer + 16 * warp + g;
  const unsigned char* q_rows = smem + S::kQ + consumer * 64 * 128;
  const float scale_log2 = float(shape.softmax_scale()) * kLog2e;
  mbarrier_wait(q_full, 0);

  if constexpr (!kPingPong) {
    float out[kPaddedDim<kD> / 2] = {};
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    using R = Ring<kStages>;
    //! [consumer_loop]
    for (int j = 0; j < n_tiles; ++j) {
      mbarrier_wait(&k_full[R::stage(j)], R::full_parity(j));
      float s[kN / 2];
      issue_scores<kD, kBlockM * 128, kN>(s, q_rows, smem + S::kK + R::stage(j) * S::kTileBytes);
      wgmma_wait<0>();
      fence_operands(s);
      mbarrier_arrive(&k_empty[R::stage(j)]);  // this warpgroup is done with K_j

      if (tile_needs_mask(shape, i0, kBlockM, j * kN, kN)) mask_scores(s, shape, row0, j * kN, t);
      float rescale[2];
      online_softmax(s, m, l, rescale, scale_log2);
      rescale_output<kD>(out, rescale);
      uint32_t p[kN / 16][4];
      pack_p(s, p);

      mbarrier_wait(&v_full[R::stage(j)], R::full_parity(j));
      issue_pv<kD, kN>(out, p, smem + S::kV + R::stage(j) * S::kTileBytes);
      wgmma_wait<0>();
      fence_operands(out);
      mbarrier_arrive(&v_empty[R::stage(j)]);
    }
    //! [consumer_loop]
    write_output<kD>(out, m, l, shape, bh, row0, t, o, lse);
  } else {
    Bf16Ops<kD, kSoftmax> ops{smem, q_rows, k_full, v_full, k_empty, v_empty, shape, i0, row0, t, scale_log2};
    pingpong_schedule(ops, n_tiles, consumer);
    write_output<kD>(ops.out, ops.m, ops.l, shape, bh, row0, t, o, lse);
  }
}

template <int kD, bool kPingPong, int kSoftmax = -1>
void launch_specialized_dim(const ForwardParams& p) {
  require_produce_kv();  // the producer's loop is this chapter's exercise
  launch_bf16_tiles(flash3_specialized_kernel<kD, kPingPong, kSoftmax>, p, kD, kBlockM, kTileKeys<kD>, kThreads,
                    Layout<kD>::kBytes);
}

template <bool kPingPong, int kSoftmax = -1>
void launch_specialized(const ForwardParams& p) {
  if constexpr (kPingPong) {
    with_head_dim<64, 96, 128, 256>(p.shape.head_dim,
                                    [&](auto d) { launch_specialized_dim<d.value, true, kSoftmax>(p); });
  } else {
    with_head_dim<64, 128>(p.shape.head_dim, [&](auto d) { launch_specialized_dim<d.value, false>(p); });
  }
}

ForwardKernel specialized_kernel(const char* name, int number, const char* variant, const char* summary,
                                 void (*launch)(const ForwardParams&), ShapeCheck supports) {
  ForwardKernel k{name, 6, number, variant, DType::BF16, summary, launch};
  k.supports = std::move(supports);
  k.strided = true;  // launch_bf16_tiles: strides in the tensor maps and O's rows
  return k;
}

}  // namespace

FA_REGISTER_FORWARD_KERNEL(
    specialized_kernel("ch06_specialized_bf16", 3, "specialized",
                       "producer warpgroup (TMA, setmaxnreg.dec) + 2 consumer warpgroups, full/empty mbarriers",
                       launch_specialized<false>, [](const AttentionShape& s) { return hopper_support(s); }));
FA_REGISTER_FORWARD_KERNEL(
    specialized_kernel("ch06_pingpong_bf16", 4, "pingpong",
                       "variant 3 + consumers take turns issuing GEMMs; softmax of j+1 overlaps P_j V_j",
                       launch_specialized<true>, [](const AttentionShape& s) {
                         return hopper_support(s, {64, 96, 128, 256});
                       }));
FA_REGISTER_FORWARD_KERNEL(specialized_kernel(
    "ch06_lazy_bf16", 8, "lazy",
    "variant 4 with FlashAttention-4's lazy max: a row's max moves only past a factor 2^8, O rescaled only then",
    launch_specialized<true, kFmaOfEight>, [](const AttentionShape& s) {
      return hopper_support(s, {64, 96, 128, 256});
    }));

}  // namespace fa::flash3
