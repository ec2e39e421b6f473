// Chapter 06, variants 3, 4, 7 and 8: the block shape, the shared-memory layout and the bf16
// operations of variant 4's schedule (pingpong_schedule in flash3_tile.cuh), shared by variant 4
// (flash_attention_v3_specialized_sm90a.cu), its persistent form, variant 7
// (flash_attention_v3_persistent_sm90a.cu), and variant 8, its softmax FlashAttention-4's
// (lazy_softmax.cuh).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "flash3_tile.cuh"
#include "lazy_softmax.cuh"

namespace fa::flash3 {
namespace {

using namespace fa::hopper;

constexpr int kConsumers = 2, kThreads = 128 * (1 + kConsumers), kBlockM = 64 * kConsumers, kStages = 2;
constexpr int kConsumerThreads = 128 * kConsumers;

// Barriers: q_full, k_full[2], v_full[2], k_empty[2], v_empty[2], and q_empty (variant 7 only).
// K/V tiles of kTileKeys<kD> keys.
template <int kD>
using Layout = Smem<kD, kBlockM, kStages, 2 + 4 * kStages, kTileKeys<kD>>;

/// The bf16 operations variant 4's schedule (pingpong_schedule in flash3_tile.cuh) runs. With
/// kFmaOfEight >= 0 the softmax is variant 8's: the lazy max, and kFmaOfEight of every 8
/// exponentials on the FMA pipe (lazy_online_softmax).
template <int kD, int kFmaOfEight = -1>
struct Bf16Ops {
  using S = Layout<kD>;
  static constexpr int kKeys = kTileKeys<kD>;
  unsigned char* smem;
  const unsigned char* q_rows;
  uint64_t *k_full, *v_full, *k_empty, *v_empty;
  AttentionShape shape;
  int i0, row0, t;
  float scale_log2;
  float out[kPaddedDim<kD> / 2] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  uint32_t p[kKeys / 16][4] = {};
  int ring0 = 0;  // the ring item of tile 0 (variant 7: the tiles of earlier work items came first)

  using R = Ring<kStages>;
  __device__ void wait_k(int j) { mbarrier_wait(&k_full[R::stage(ring0 + j)], R::full_parity(ring0 + j)); }
  __device__ void wait_v(int j) { mbarrier_wait(&v_full[R::stage(ring0 + j)], R::full_parity(ring0 + j)); }
  __device__ void release_k(int j) { mbarrier_arrive(&k_empty[R::stage(ring0 + j)]); }
  __device__ void release_v(int j) { mbarrier_arrive(&v_empty[R::stage(ring0 + j)]); }
  __device__ void scores(int j, float (&s)[kKeys / 2]) {
    issue_scores<kD, kBlockM * 128, kKeys>(s, q_rows, smem + S::kK + R::stage(ring0 + j) * S::kTileBytes);
  }
  __device__ void pv(int j) { issue_pv<kD, kKeys>(out, p, smem + S::kV + R::stage(ring0 + j) * S::kTileBytes); }
  __device__ void softmax(int j, float (&s)[kKeys / 2], float (&rescale)[2]) {
    if (tile_needs_mask(shape, i0, kBlockM, j * kKeys, kKeys)) mask_scores(s, shape, row0, j * kKeys, t);
    if constexpr (kFmaOfEight >= 0) lazy_online_softmax<kFmaOfEight>(s, m, l, rescale, scale_log2);
    else online_softmax(s, m, l, rescale, scale_log2);
  }
  __device__ void rescale_out(const float (&rescale)[2]) { rescale_output<kD>(out, rescale); }
  __device__ void pack(const float (&s)[kKeys / 2]) { pack_p(s, p); }
  __device__ void fence_out() { fence_operands(out); }
};

}  // namespace
}  // namespace fa::flash3
