// Chapter 06, variant 7, `persistent`: variant 4's kernel, made persistent. Variant 4 launches
// one block per (Q block, plane); every block pays a start (Q's copy, the ring's first K and V
// tiles) and an end (O stored through registers) while its tensor cores wait. Here the grid is
// one block per SM slot, and each block takes work items (Q block, plane) one after another from
// a counter in global memory, until none is left. The producer runs ahead: it takes the next
// item and loads its first K/V tiles while the consumers still finish this item's last tiles,
// and its Q while they store this item's O. What that needs:
//   * the ring counts on across items (Bf16Ops::ring0: tile j of an item is ring item ring0 + j);
//   * one more barrier, q_empty: the consumers arrive when their GEMMs that read Q are done, and
//     the producer waits on it before it overwrites Q;
//   * q_full waited for with the item's parity (n & 1), as the ring's barriers are, and the
//     item's number handed to the consumers in shared memory under it.
// The schedule inside an item is variant 4's, unchanged (pingpong_schedule).
// Run: build/bin/ch06_flash_attention_v3 --variant persistent
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "cuda_check.h"
#include "flash3_tile.cuh"
#include "flash_attention_v3.h"
#include "fp8_scheduler.cuh"
#include "pingpong_ops.cuh"
#include "registry.h"
#include "static_switch.h"
#include "tma.h"

namespace fa::flash3 {
namespace {

//! [persistent_items]
/// One work item: its rows [i0, i0 + kBlockM) of plane bh, its K/V plane, and its K/V tiles.
struct WorkItem {
  int i0, bh, kv_plane, n_tiles;
  __device__ WorkItem(const AttentionShape& shape, int item, int q_blocks, int planes, int keys_per_tile) {
    int q_block;
    // Items in longest_first's order (the FP8 kernel's): without the mask plane by plane, so that
    // the blocks running at once share K and V in L2; with it, the longest Q blocks first, so that
    // the grid ends on short items.
    longest_first(shape.causal, item, q_blocks, planes, q_block, bh);
    i0 = q_block * kBlockM;
    kv_plane = (bh / shape.heads_q) * shape.heads_kv + shape.kv_head(bh % shape.heads_q);
    const int key_end = shape.causal ? shape.visible_keys(min(i0 + kBlockM, shape.seq_q) - 1) : shape.seq_kv;
    n_tiles = key_end > 0 ? (key_end + keys_per_tile - 1) / keys_per_tile : 0;
  }
};
//! [persistent_items]

template <int kD>
__global__ void __launch_bounds__(kThreads, 1)
    flash3_persistent_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                             const __grid_constant__ CUtensorMap tm_v, AttentionShape shape,
                             StridedRows<__nv_bfloat16> o, float* lse, int* next_item) {
  using S = Layout<kD>;
  using R = Ring<kStages>;
  constexpr int kN = kTileKeys<kD>;
  extern __shared__ unsigned char shared_raw[];
  unsigned char* smem = aligned_smem(shared_raw);
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + S::kBars);
  uint64_t* k_full = q_full + 1;
  uint64_t* v_full = k_full + kStages;
  uint64_t* k_empty = v_full + kStages;
  uint64_t* v_empty = k_empty + kStages;
  uint64_t* q_empty = v_empty + kStages;
  __shared__ int item_of;  // the item whose Q the q_full barrier's current phase brings
  const int tid = threadIdx.x, wg = tid / 128;
  const int q_blocks = (shape.seq_q + kBlockM - 1) / kBlockM, planes = shape.batch * shape.heads_q;
  const int items = q_blocks * planes;

  init_ring(q_full, k_full, v_full, kStages, k_empty, v_empty, kConsumerThreads);
  if (tid == 0) {
    mbarrier_init(q_empty, kConsumerThreads);
    fence_barrier_init();
  }
  __syncthreads();

  if (wg == 0) {
    // 40 registers, not variant 4's 24: with 24, ptxas spills the producer's loop over work items
    // to local memory. The consumers give up 8 each: 128 x (40 + 2 x 232) = 64,512 registers, as
    // 128 x (24 + 2 x 240).
    setmaxnreg_dec<40>();
    if (tid != 0) return;
    //! [persistent_producer]
    // Block b's first item is b; every later one is taken from the counter (which the host zeroes
    // before the launch), so a block that finishes early takes more. ring: the ring items issued
    // so far, over all work items. An item's first kStages K/V tiles go before its Q: they wait
    // only for stages that the previous item's last tiles free, while Q waits until the
    // consumers are done with the previous item's Q (q_empty).
    auto load_tile = [&](const WorkItem& w, int j, int r) {
      const int stage = R::stage(r);
      if (r >= kStages) mbarrier_wait(&k_empty[stage], R::empty_parity(r));
      mbarrier_arrive_expect_tx(&k_full[stage], S::kTileBytes);
      for (int b = 0; b < S::kBoxes; ++b)
        tma_load_head(smem + S::kK + stage * S::kTileBytes + b * S::kKeyBoxBytes, &tm_k, 64 * b, j * kN, w.kv_plane,
                      shape.heads_kv, &k_full[stage]);
      if (r >= kStages) mbarrier_wait(&v_empty[stage], R::empty_parity(r));
      mbarrier_arrive_expect_tx(&v_full[stage], S::kTileBytes);
      for (int b = 0; b < S::kBoxes; ++b)
        tma_load_head(smem + S::kV + stage * S::kTileBytes + b * S::kKeyBoxBytes, &tm_v, 64 * b, j * kN, w.kv_plane,
                      shape.heads_kv, &v_full[stage]);
    };
    int ring = 0;
    for (int n = 0;; ++n) {
      const int item = n == 0 ? int(blockIdx.x) : int(gridDim.x) + atomicAdd(next_item, 1);
      if (item >= items) {  // none left: say so to the consumers, through q_full with no bytes
        if (n > 0) mbarrier_wait(q_empty, (n - 1) & 1);  // they have read item_of
        item_of = items;
        mbarrier_arrive(q_full);
        break;
      }
      const WorkItem w(shape, item, q_blocks, planes, kN);
      const int early = min(kStages, w.n_tiles);
      for (int j = 0; j < early; ++j) load_tile(w, j, ring + j);
      if (n > 0) mbarrier_wait(q_empty, (n - 1) & 1);  // Q and item_of are free again
      item_of = item;
      mbarrier_arrive_expect_tx(q_full, S::kQBytes);
      for (int b = 0; b < S::kBoxes; ++b)
        tma_load_head(smem + S::kQ + b * kBlockM * 128, &tm_q, 64 * b, w.i0, w.bh, shape.heads_q, q_full);
      for (int j = early; j < w.n_tiles; ++j) load_tile(w, j, ring + j);
      ring += w.n_tiles;
    }
    //! [persistent_producer]
    return;
  }

  setmaxnreg_inc<232>();
  // consumer and warp through a shuffle from lane 0, as in variant 5: Q's wgmma descriptors, which
  // derive from them, are then built in uniform registers, not moved there before every wgmma.
  const int consumer = __shfl_sync(0xFFFFFFFFu, wg - 1, 0), warp = __shfl_sync(0xFFFFFFFFu, (tid % 128) / 32, 0);
  const int lane = tid % 32, g = lane / 4, t = lane % 4;
  const unsigned char* q_rows = smem + S::kQ + consumer * 64 * 128;
  const float scale_log2 = float(shape.softmax_scale()) * kLog2e;
  //! [persistent_consumer]
  int ring = 0;
  for (int n = 0;; ++n) {
    mbarrier_wait(q_full, n & 1);
    // Through a shuffle from lane 0, as `consumer` and `warp` above: the compiler then knows that
    // the item, and the ring position that follows from it, are the same in every lane.
    const int item = __shfl_sync(0xFFFFFFFFu, item_of, 0);
    if (item >= items) break;
    const WorkItem w(shape, item, q_blocks, planes, kN);
    const int row0 = w.i0 + 64 * consumer + 16 * warp + g;
    Bf16Ops<kD> ops{smem, q_rows, k_full, v_full, k_empty, v_empty, shape, w.i0, row0, t, scale_log2};
    ops.ring0 = ring;
    pingpong_schedule(ops, w.n_tiles, consumer);
    mbarrier_arrive(q_empty);  // every GEMM of this item is done, item_of read: the next Q may come
    write_output<kD>(ops.out, ops.m, ops.l, shape, w.bh, row0, t, o, lse);
    ring += w.n_tiles;
  }
  //! [persistent_consumer]
}

/// Blocks of the head_dim-kD kernel that run at once on the current GPU (SMs x blocks per SM),
/// asked once per device.
template <int kD, class Kernel>
int resident_blocks(Kernel kernel, int threads, int smem_bytes) {
  static int cached[64] = {};  // one array per kD: the kernels differ in shared memory
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  if (device < 64 && cached[device] > 0) return cached[device];
  int sms = 0, per_sm = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem_bytes));
  const int slots = sms * per_sm;
  if (device < 64) cached[device] = slots;
  return slots;
}

template <int kD>
void launch_persistent_dim(const ForwardParams& p) {
  const AttentionShape& s = p.shape;
  auto kernel = flash3_persistent_kernel<kD>;
  const int64_t items = int64_t((s.seq_q + kBlockM - 1) / kBlockM) * s.batch * s.heads_q;
  const int blocks = int(std::min<int64_t>(items, resident_blocks<kD>(kernel, kThreads, Layout<kD>::kBytes)));
  int* next_item = static_cast<int*>(p.workspace);  // the work counter, zeroed for this launch
  CUDA_CHECK(cudaMemsetAsync(next_item, 0, sizeof(int), p.stream));
  launch_bf16_tiles(kernel, p, kD, kBlockM, kTileKeys<kD>, kThreads, Layout<kD>::kBytes, blocks, next_item);
}

void launch_persistent(const ForwardParams& p) {
  with_head_dim<64, 96, 128, 256>(p.shape.head_dim, [&](auto d) { launch_persistent_dim<d.value>(p); });
}

ForwardKernel persistent_kernel() {
  ForwardKernel k{"ch06_persistent_bf16",
                  6,
                  7,
                  "persistent",
                  DType::BF16,
                  "variant 4 in a persistent grid: one block per SM takes work items from a counter; the next "
                  "item's K/V and Q load while this one finishes and stores O",
                  launch_persistent,
                  [](const AttentionShape& s) {
                    return hopper_support(s, {64, 96, 128, 256});
                  }};
  k.workspace_bytes = [](const AttentionShape&) { return sizeof(int); };
  k.strided = true;  // launch_bf16_tiles: strides in the tensor maps and O's rows
  return k;
}

}  // namespace

FA_REGISTER_FORWARD_KERNEL(persistent_kernel());

}  // namespace fa::flash3
