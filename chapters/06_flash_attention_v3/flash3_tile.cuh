// Chapter 06: the per-tile work every variant shares, as device functions. A warpgroup owns 64
// rows of the Q tile; one K/V tile is kN keys: 128 (kBlockN), or 64 at head_dim 256 in variant 4
// (kTileKeys). The variants differ only in who loads the tiles and in what order the warpgroups
// issue these steps.
//
// Shared memory holds tiles as TMA boxes of kN rows x 128 bytes (64 bf16 columns), written with
// the 128-byte swizzle; a tile of head_dim d is ceil(d / 64) boxes side by side. At d = 96 the
// second box's last 32 columns lie past the tensor's end, and TMA fills them with zeros: the
// kernels then run as at d = 128 (kPaddedDim), with a zero tail that changes no score and an O
// tail that is never stored.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda_check.h"
#include "device_utils.cuh"
#include "hopper.cuh"
#include "log2_units.h"
#include "mask.h"
#include "not_implemented.h"
#include "online_softmax.cuh"
#include "problem.h"
#include "registry.h"
#include "strides.h"
#include "tma.h"

namespace fa::flash3 {

constexpr int kBlockN = 128;          // keys per K/V tile
constexpr int kBoxBytes = 128 * 128;  // one TMA box of 128 rows

using hopper::kPaddedDim;  // the head_dim of the tiles and of O: whole 64-column boxes

/// Keys per K/V tile in variant 4: at head_dim 256 a 128-key tile's S (64 floats per thread)
/// next to O (128) and P (32) would leave too few of the 240 registers a consumer has, and two
/// stages of 128-key K and V tiles (256 KiB) would not fit in shared memory: 64 keys there.
template <int kD>
constexpr int kTileKeys = kD == 256 ? 64 : kBlockN;

/// Byte offsets of a block's shared memory: Q, then kStages K tiles, then kStages V tiles (kN
/// keys each), then the mbarriers (kBarriers of them), each tile 1024-byte aligned.
template <int kD, int kBlockM, int kStages, int kBarriers, int kN = kBlockN>
struct Smem {
  static constexpr int kBoxes = kPaddedDim<kD> / 64;
  static constexpr int kQBytes = kBoxes * kBlockM * 128;
  static constexpr int kKeyBoxBytes = kN * 128;             // one box of a K or V tile
  static constexpr int kTileBytes = kBoxes * kKeyBoxBytes;  // one kN-key K or V tile
  static constexpr int kQ = 0, kK = kQBytes, kV = kK + kStages * kTileBytes;
  static constexpr int kBars = kV + kStages * kTileBytes;
  static constexpr int kBytes = kBars + 8 * kBarriers + 1024;  // + slack to align the base to 1024
};

using hopper::aligned_smem;

/// Thread 0 sets up the copy ring's mbarriers, then the block waits for it. q_full and the
/// `stages` K and V "full" barriers take one arrival each (the issuing thread's expect_tx); the
/// "empty" barriers, when given, take one arrival per consumer thread.
__device__ inline void init_ring(uint64_t* q_full, uint64_t* k_full, uint64_t* v_full, int stages,
                                 uint64_t* k_empty = nullptr, uint64_t* v_empty = nullptr, int consumer_threads = 0) {
  //! [init_ring]
  if (threadIdx.x == 0) {
    hopper::mbarrier_init(q_full, 1);
    for (int s = 0; s < stages; ++s) {
      hopper::mbarrier_init(&k_full[s], 1);
      hopper::mbarrier_init(&v_full[s], 1);
      if (k_empty) hopper::mbarrier_init(&k_empty[s], consumer_threads);
      if (v_empty) hopper::mbarrier_init(&v_empty[s], consumer_threads);
    }
    hopper::fence_barrier_init();
  }
  __syncthreads();
  //! [init_ring]
}

/// A kernel cannot throw, so every launcher of a kernel whose producer runs produce_kv below
/// (variants 3-5 and chapter 09's Hopper kernel) calls this first: in a student copy it says
/// "not implemented" until produce_kv is written, where the kernel would wait forever for tiles.
inline void require_produce_kv() {
  // BEGIN SOLUTION ch06_producer: write produce_kv (the producer's loop on the mbarrier ring) just below, then delete this line
  // END SOLUTION
}

/// The producer's loop (variants 3-5): K/V tile j goes into stage j % kStages. Before refilling a
/// stage it waits on that stage's empty barrier for the consumers' arrivals from its previous use
/// (the first kStages tiles go into fresh stages and wait for nothing; see hopper::Ring).
/// load_k(j, stage) and load_v(j, stage) announce the bytes on the full barrier and issue the copies.
template <int kStages, class LoadK, class LoadV>
__device__ inline void produce_kv(int n_tiles, uint64_t* k_empty, uint64_t* v_empty, LoadK load_k, LoadV load_v) {
  using R = hopper::Ring<kStages>;
  //! [produce_kv]
  // BEGIN SOLUTION ch06_producer (device): for each tile j, in order: its stage (R::stage); from the second round of the ring on, wait on that stage's K "empty" barrier (the parity of the consumers' previous release, R::empty_parity) before load_k, and on its V "empty" barrier before load_v
  for (int j = 0; j < n_tiles; ++j) {
    const int stage = R::stage(j);
    if (j >= kStages) hopper::mbarrier_wait(&k_empty[stage], R::empty_parity(j));
    load_k(j, stage);
    if (j >= kStages) hopper::mbarrier_wait(&v_empty[stage], R::empty_parity(j));
    load_v(j, stage);
  }
  // END SOLUTION
  //! [produce_kv]
}

/// Issues S (64 x kN, this warpgroup's rows) = Q K^T as kD / 16 wgmma and commits them; the
/// caller waits. q_rows: the warpgroup's first Q row in box 0 (the same offset in every box).
template <int kD, int kQBoxBytes, int kN = kBlockN>
__device__ inline void issue_scores(float (&s)[kN / 2], const unsigned char* q_rows, const unsigned char* k_tile) {
  //! [wgmma_scores]
  // kD / 16 wgmma of k = 16. Within a 128-byte swizzled row, the k-th 16-column step starts 32
  // bytes further; columns 64 and up live in the next box. (At d = 96 the zero tail of the
  // second box is skipped: 6 steps, not 8.)
  hopper::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks) {
    const int box = ks / 4, step = ks % 4;
    const uint64_t a = hopper::make_desc_sw128(q_rows + box * kQBoxBytes + step * 32, 16, 1024);
    const uint64_t b = hopper::make_desc_sw128(k_tile + box * kN * 128 + step * 32, 16, 1024);
    if constexpr (kN == 128) {
      hopper::wgmma_m64n128k16_ss<0>(s, a, b, ks > 0);
    } else {
      static_assert(kN == 64, "K/V tiles are 64 or 128 keys");
      hopper::wgmma_m64n64k16_ss<0>(s, a, b, ks > 0);
    }
  }
  hopper::wgmma_commit();
  //! [wgmma_scores]
}

/// -inf where (row, key) is masked or out of range. row0: this thread's first row (g), row0 + 8
/// its second; s[4c + e] is row row0 + 8 * (e / 2), key j0 + 8c + 2t + (e & 1). Each row's run
/// of visible keys is found once (mask.h), then two compares per score.
template <int kHalfN>
__device__ inline void mask_scores(float (&s)[kHalfN], const AttentionShape& shape, int row0, int j0, int t) {
  const KeyRun runs[2] = {shape_keys(shape, row0), shape_keys(shape, row0 + 8)};
  mask_fragment(s, runs, j0 + 2 * t);
}

/// Online softmax on the raw scores (the scale folded into the exponent), S replaced by P, for
/// this thread's two rows (row g: s[4c], s[4c + 1]; row g + 8: s[4c + 2], s[4c + 3]); returns
/// the factors the running O must be multiplied by, one per row.
template <int kHalfN>
__device__ inline void online_softmax(float (&s)[kHalfN], float (&m)[2], float (&l)[2], float (&rescale)[2],
                                      float scale_log2) {
#pragma unroll
  for (int h = 0; h < 2; ++h)
    rescale[h] = online_softmax_row<kHalfN / 2>([&](int i) -> float& { return s[4 * (i / 2) + 2 * h + i % 2]; }, m[h],
                                                l[h], scale_log2);
}

/// O times the per-row factors. Once the first tiles have been seen a row's running max seldom
/// moves, and then its factor is exactly 1: when that holds for all 16 rows of the warp, the
/// warp skips the kD / 2 multiplies (the result is the same bit for bit).
template <int kD>
__device__ inline void rescale_output(float (&out)[kPaddedDim<kD> / 2], const float (&rescale)[2]) {
  //! [skip_rescale]
  if (__all_sync(0xFFFFFFFFu, rescale[0] == 1.0f && rescale[1] == 1.0f)) {
    return;
  }
  //! [skip_rescale]
#pragma unroll
  for (int i = 0; i < kPaddedDim<kD> / 2; ++i) out[i] *= rescale[(i % 4) / 2];
}

/// P as wgmma A fragments, straight from the S accumulators: 16 keys (two 8-column blocks) are
/// one k-step, and the accumulator layout of two blocks is the A layout of one step.
template <int kHalfN>
__device__ inline void pack_p(const float (&s)[kHalfN], uint32_t (&p)[kHalfN / 8][4]) {
  hopper::pack_a_bf16(s, p);
}

/// Issues O += P V_j and commits; the caller waits.
template <int kD, int kN = kBlockN>
__device__ inline void issue_pv(float (&out)[kPaddedDim<kD> / 2], const uint32_t (&p)[kN / 16][4],
                                const unsigned char* v_tile) {
  //! [wgmma_pv]
  // V is [keys][d] with d contiguous: "MN-major" for B, hence kTransB = 1. 8 keys are 8 rows of
  // 128 bytes (1024 bytes per group of 8); the next 64 columns of d are the next box, kN * 128
  // bytes on. At d = 256 O is two n = 128 halves, each over two boxes.
  hopper::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kN / 16; ++kk) {
    const uint64_t b = hopper::make_desc_sw128(v_tile + kk * 16 * 128, kN * 128, 1024);
    if constexpr (kPaddedDim<kD> == 256) {
      const uint64_t b_hi = hopper::make_desc_sw128(v_tile + 2 * kN * 128 + kk * 16 * 128, kN * 128, 1024);
      hopper::wgmma_m64n128k16_rs<1>(*reinterpret_cast<float(*)[64]>(&out[0]), p[kk], b, true);
      hopper::wgmma_m64n128k16_rs<1>(*reinterpret_cast<float(*)[64]>(&out[64]), p[kk], b_hi, true);
    } else if constexpr (kPaddedDim<kD> == 128) {
      hopper::wgmma_m64n128k16_rs<1>(out, p[kk], b, true);
    } else {
      hopper::wgmma_m64n64k16_rs<1>(out, p[kk], b, true);
    }
  }
  hopper::wgmma_commit();
  //! [wgmma_pv]
}

/// A row's totals from its running max m and its whole sum l (callers that keep a thread's
/// partial sum add the quad's first: sum_over_quad): 1 / l (0 for a row that saw no key), and the
/// row's LSE in log2 units (-inf for such a row).
__device__ inline void row_totals(const float (&m)[2], const float (&l)[2], float (&inv)[2], float (&lse_log2)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    inv[h] = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
    lse_log2[h] = m[h] == -INFINITY ? -INFINITY : m[h] + log2f(l[h]);
  }
}

/// O times inv rounded to bf16, and the LSE (given in log2 units), for this thread's two rows.
template <int kD>
__device__ inline void store_output(const float (&out)[kPaddedDim<kD> / 2], const float (&inv)[2],
                                    const float (&lse_log2)[2], const AttentionShape& shape, int bh, int row0, int t,
                                    StridedRows<__nv_bfloat16> o, float* lse) {
  hopper::store_rows_bf16<kPaddedDim<kD> / 2, kD>(out, o.head_start(bh), row0, shape.seq_q, t, inv, o.strides.row);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + 8 * h;
    if (t == 0 && row < shape.seq_q) lse[int64_t(bh) * shape.seq_q + row] = lse_log2[h] * kLn2;
  }
}

/// Each thread summed the quarter of every tile's keys it holds: l over the quad that shares the
/// row is the row's whole sum.
__device__ inline void sum_over_quad(float (&l)[2]) {
  l[0] = quad_sum(l[0]);
  l[1] = quad_sum(l[1]);
}

/// O / l rounded to bf16, and LSE, for this thread's two rows; l is this thread's partial sum.
template <int kD>
__device__ inline void write_output(const float (&out)[kPaddedDim<kD> / 2], const float (&m)[2], float (&l)[2],
                                    const AttentionShape& shape, int bh, int row0, int t, StridedRows<__nv_bfloat16> o,
                                    float* lse) {
  float inv[2], lse_log2[2];
  sum_over_quad(l);
  row_totals(m, l, inv, lse_log2);
  store_output<kD>(out, inv, lse_log2, shape, bh, row0, t, o, lse);
}

/// Does the K/V tile of keys [j0, j0 + n) need the mask for some row of the block [i0, i0 + block_m)?
__device__ inline bool tile_needs_mask(const AttentionShape& shape, int i0, int block_m, int j0, int n = kBlockN) {
  return (shape.causal && j0 + n > shape.visible_keys(i0)) || j0 + n > shape.seq_kv || i0 + block_m > shape.seq_q;
}

//! [turns]
/// The named barriers of the ping-pong schedule (hardware barrier 0 is __syncthreads'). Both
/// consumer warpgroups (256 threads) take part in each: the one whose turn it is waits with
/// bar.sync, the other arrives with bar.arrive.
enum NamedBarrier : int {
  kTurnOfConsumer0 = 1,  // "consumer 0 may issue its GEMMs"
  kTurnOfConsumer1 = 2,  // "consumer 1 may issue its GEMMs"
};
constexpr int kTurnThreads = 256;
/// The id as a sum, not a select between the two: ptxas then schedules the softmax around the
/// turns as it should (see the chapter's performance notes).
__device__ inline int turn_of(int consumer) { return kTurnOfConsumer0 + consumer; }
__device__ inline void turn_wait(int consumer) { hopper::named_barrier_sync<kTurnThreads>(turn_of(consumer)); }
__device__ inline void turn_give(int consumer) { hopper::named_barrier_arrive<kTurnThreads>(turn_of(consumer)); }
//! [turns]

/// Variant 4's schedule for one of the two consumer warpgroups, written once for any operand
/// type (bf16 in variant 4, e4m3 in variant 5 at head_dim 64). `ops` provides kKeys (keys per
/// K/V tile), wait_k(j),
/// wait_v(j), release_k(j), release_v(j); scores(j, s) and pv(j), each issuing and committing
/// one wgmma group; softmax(j, s, rescale) (mask, online softmax, P left in s);
/// rescale_out(rescale); pack(s) (P into the A fragments pv reads); fence_out().
template <class Ops>
__device__ inline void pingpong_schedule(Ops& ops, int n_tiles, int consumer) {
  //! [pingpong]
  // Tile 0's scores and softmax first; then per step: [my turn] issue S_{j+1} and P_j V_j,
  // [hand the turn over], softmax of S_{j+1} while P_j V_j runs, then rescale O.
  // Each consumer takes n_tiles + 1 turns, alternating, consumer 0 first: consumer 1 gives it
  // the first one, and does not give back after its own last turn (nobody would take it).
  constexpr int kHalfN = Ops::kKeys / 2;
  if (n_tiles == 0) return;
  if (consumer == 1) turn_give(0);
  {
    float s[kHalfN];
    float rescale[2];
    ops.wait_k(0);
    turn_wait(consumer);
    ops.scores(0, s);
    turn_give(1 - consumer);
    hopper::wgmma_wait<0>();
    hopper::fence_operands(s);
    ops.release_k(0);
    ops.softmax(0, s, rescale);  // O is still zero: nothing to rescale
    ops.pack(s);
  }
  for (int j = 0; j + 1 < n_tiles; ++j) {
    float s[kHalfN];
    float rescale[2];
    ops.wait_k(j + 1);
    ops.wait_v(j);
    turn_wait(consumer);
    ops.scores(j + 1, s);
    ops.pv(j);
    turn_give(1 - consumer);
    hopper::wgmma_wait<1>();  // S_{j+1} is done; P_j V_j may still run
    hopper::fence_operands(s);
    ops.release_k(j + 1);
    ops.softmax(j + 1, s, rescale);
    hopper::wgmma_wait<0>();
    ops.fence_out();
    ops.release_v(j);
    ops.rescale_out(rescale);  // O now holds P_j V_j too: bring it to the new max
    ops.pack(s);
  }
  ops.wait_v(n_tiles - 1);  // the last tile's P V, in the last turn
  turn_wait(consumer);
  ops.pv(n_tiles - 1);
  if (consumer == 0) turn_give(1);
  hopper::wgmma_wait<0>();
  ops.fence_out();
  ops.release_v(n_tiles - 1);
  //! [pingpong]
}

/// The host side of variants 1-4 and 7: tensor maps over the bf16 Q (boxes of block_m rows), K and
/// V (boxes of key_rows), the shared-memory limit raised to smem_bytes, one block per (Q tile,
/// batch * head), or `persistent_blocks` blocks when given (variant 7). `kernel` takes (tm_q,
/// tm_k, tm_v, shape, o, lse, extra...). The tensors may have any strides (p.strides, strides.h):
/// the tensor maps and O's rows carry them, so the kernels never assume the packed layout.
template <class Kernel, class... Extra>
void launch_bf16_tiles(Kernel kernel, const ForwardParams& p, int head_dim, int block_m, int key_rows, int threads,
                       int smem_bytes, int persistent_blocks = 0, Extra... extra) {
  const AttentionShape& s = p.shape;
  const ForwardStrides st = p.strides ? *p.strides : ForwardStrides::packed(s);
  //! [tensor_maps]
  const CUtensorMap tm_q = make_tensor_map_heads(p.q, head_dim, s.seq_q, s.heads_q, s.batch, st.q, block_m);
  const CUtensorMap tm_k = make_tensor_map_heads(p.k, head_dim, s.seq_kv, s.heads_kv, s.batch, st.k, key_rows);
  const CUtensorMap tm_v = make_tensor_map_heads(p.v, head_dim, s.seq_kv, s.heads_kv, s.batch, st.v, key_rows);
  //! [tensor_maps]
  const StridedRows<__nv_bfloat16> o{static_cast<__nv_bfloat16*>(p.o), st.o, s.heads_q};
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  const dim3 grid = persistent_blocks > 0
                        ? dim3(unsigned(persistent_blocks))
                        : dim3(unsigned((s.seq_q + block_m - 1) / block_m), unsigned(s.batch * s.heads_q));
  kernel<<<grid, threads, smem_bytes, p.stream>>>(tm_q, tm_k, tm_v, s, o, p.lse, extra...);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fa::flash3
