// Hopper's asynchronous instructions (sm_90a), each wrapped once in inline PTX with a comment on
// what it does. Used by chapter 06; include it only from code built for sm_90a
// (CMake: CUDA_ARCHITECTURES 90a-real), since wgmma and setmaxnreg exist nowhere else.
//
// The pieces, in the order a tile meets them:
//   mbarrier  a 64-bit shared-memory barrier that counts thread arrivals *and* bytes of
//             asynchronous copies; a wait on it finishes when both reach their targets;
//   TMA       the tensor memory accelerator: one thread hands it a tensor map (shape, strides,
//             box size, swizzle) and box coordinates, and it copies the box to shared memory,
//             zero-filling what lies outside the tensor, then adds the bytes to an mbarrier;
//   wgmma     a warpgroup (4 consecutive warps, 128 threads) multiplies a 64 x N tile: B always
//             from shared memory, A from shared memory or registers, the fp32 accumulators in
//             registers. It runs asynchronously: issue, commit a group, wait for groups;
//   fences    order ordinary memory accesses against the asynchronous proxy (TMA, wgmma).
#pragma once

#include <cuda.h>  // CUtensorMap (a 128-byte opaque struct); nothing from the driver library is linked
#include <cuda_bf16.h>

#include <cstdint>

namespace fa::hopper {

__device__ inline uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

/// The dynamic shared memory, aligned up to 1024 bytes (the 128-byte swizzle pattern's period);
/// kernels reserve 1024 bytes of slack for it.
__device__ inline unsigned char* aligned_smem(unsigned char* raw) {
  return raw + ((1024 - (smem_addr(raw) & 1023)) & 1023);
}

// ---- mbarrier ------------------------------------------------------------------------------
/// Sets the barrier's expected arrival count; its phase starts at 0.
__device__ inline void mbarrier_init(uint64_t* bar, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(arrivals));
}
/// Orders this thread's earlier mbarrier.init before later uses at cluster scope (a release fence);
/// inside one block the __syncthreads after it is what every arrive, wait and copy comes after.
__device__ inline void fence_barrier_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
/// One arrival that also announces `bytes` more to come from asynchronous copies in this phase.
__device__ inline void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
/// One plain arrival (a consumer saying "I am done with this stage").
__device__ inline void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
/// Waits until the barrier's phase with parity `phase` has completed (all arrivals and bytes).
__device__ inline void mbarrier_wait(uint64_t* bar, uint32_t phase) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(phase)
      : "memory");
}

/// The bookkeeping of a ring of kStages buffers that a producer fills and consumers drain in
/// order. Item j (the j-th tile through the ring) goes into stage j % kStages and is that
/// stage's use number u = j / kStages. Each stage has a "full" mbarrier (the producer's bytes
/// have landed) and, when the producer must wait for the consumers, an "empty" one (they are
/// done reading). An mbarrier's phase number starts at 0 and goes up by one each time the
/// barrier completes; a wait names the parity (0 or 1) of the phase it waits to see completed.
/// Use u of a stage completes the full barrier's phase u; before use u (u >= 1) the producer
/// waits for the empty barrier's phase u - 1, completed by the consumers' release of use u - 1.
//! [ring]
template <int kStages>
struct Ring {
  __device__ static int stage(int j) { return j % kStages; }
  /// The parity a consumer waits on, on stage(j)'s full barrier, for item j.
  __device__ static uint32_t full_parity(int j) { return uint32_t((j / kStages) & 1); }
  /// The parity the producer waits on, on stage(j)'s empty barrier, before loading item j
  /// (j >= kStages: the first kStages items go into fresh stages and wait for nothing).
  __device__ static uint32_t empty_parity(int j) { return full_parity(j) ^ 1u; }
};
//! [ring]

// ---- named barriers --------------------------------------------------------------------------
/// bar.sync on hardware barrier `id` (0 is __syncthreads' own; 16 exist) until kThreads threads
/// (a multiple of 32) have arrived; bar.arrive counts this thread's warp in without waiting. A
/// kernel names its ids in an enum.
template <int kThreads>
__device__ inline void named_barrier_sync(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}
template <int kThreads>
__device__ inline void named_barrier_arrive(int id) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}

// ---- TMA -----------------------------------------------------------------------------------
/// Copies the box at coordinates (c0, c1, c2) of a 3-D tensor map into shared memory (dst must be
/// 128-byte aligned, 1024 for the 128-byte swizzle) and reports its bytes to `bar`. The
/// instruction names its destination in the shared::cluster window, the form the PTX ISA gives
/// this copy; a block launched without a cluster is a cluster of one, and its own shared-memory
/// addresses are valid there.
__device__ inline void tma_load_3d(void* dst, const CUtensorMap* map, int c0, int c1, int c2, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::
          "r"(smem_addr(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar))
      : "memory");
}

/// The same for a 4-D tensor map (make_tensor_map_heads): the box at column c0, row `row` of head
/// `plane` (= batch * heads + head) of a [batch][heads][rows][cols] tensor with any strides.
__device__ inline void tma_load_head(void* dst, const CUtensorMap* map, int c0, int row, int plane, int heads,
                                     uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(smem_addr(dst)),
      "l"(map), "r"(c0), "r"(row), "r"(plane % heads), "r"(plane / heads), "r"(smem_addr(bar))
      : "memory");
}

/// dst[0 .. bytes / 4) += src[0 .. bytes / 4) in fp32, done by the TMA unit, no tensor map: one
/// contiguous run of global memory (both addresses 16-byte aligned, bytes a multiple of 16). It
/// reads src through the async proxy (fence_proxy_async_shared after writing it) and joins this
/// thread's bulk group, which bulk_commit closes.
__device__ inline void bulk_reduce_add_f32(float* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
               "r"(smem_addr(src)), "r"(bytes)
               : "memory");
}
__device__ inline void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
/// Waits until at most kPending of this thread's bulk groups still read their shared memory
/// (which may then be written again); bulk_wait waits until they have finished altogether.
template <int kPending>
__device__ inline void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
template <int kPending>
__device__ inline void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}

/// The head_dim a kernel's bf16 tiles and accumulators are laid out for: whole TMA boxes of 64
/// columns (the 128 bytes of a 128-byte-swizzled row). At head_dim 96 the second box runs past
/// the tensor's end and TMA fills the 32 columns there with zeros.
template <int kD>
constexpr int kPaddedDim = (kD + 63) / 64 * 64;

// ---- wgmma ---------------------------------------------------------------------------------
/// A shared-memory matrix descriptor for the 128-byte swizzle, the layout TMA writes for a box
/// whose rows are 128 bytes. Fields (PTX ISA, "matrix descriptor"): start address, leading and
/// stride byte offsets, all in 16-byte units; bits 62-63 = 1 selects the 128-byte swizzle.
///   K-major operand (Q, K: the reduction dimension contiguous): rows of 128 bytes, 8-row groups
///     `stride_bytes` = 1024 apart; `leading_bytes` unused.
///   MN-major operand (V for P V: the output dimension contiguous): 8 rows of the reduction
///     dimension 128 bytes apart, groups of 8 `stride_bytes` = 1024 apart, and the next 64
///     output columns (the next TMA box) `leading_bytes` apart.
__device__ inline uint64_t make_desc_sw128(const void* smem, uint32_t leading_bytes, uint32_t stride_bytes) {
  uint64_t desc = 0;
  desc |= uint64_t((smem_addr(smem) & 0x3FFFF) >> 4);
  desc |= uint64_t((leading_bytes >> 4) & 0x3FFF) << 16;
  desc |= uint64_t((stride_bytes >> 4) & 0x3FFF) << 32;
  desc |= uint64_t(1) << 62;
  return desc;
}
/// A descriptor as two 32-bit words, for loops that step through shared memory. The low word
/// holds the start address and the leading offset; the high word (stride offset, swizzle) is a
/// constant of the layout. Shared addresses stay below 2^18, so moving the start by b bytes (b a
/// multiple of 16) adds b / 16 to the low word without a carry into the leading offset: one
/// 32-bit add per step, where recomputing the whole descriptor takes several instructions.
__device__ inline uint32_t desc_lo(const void* smem, uint32_t leading_bytes) {
  return uint32_t(make_desc_sw128(smem, leading_bytes, 0));
}
/// The high word for the 128-byte swizzle (swizzle_code 1) or the 64-byte one (2: rows of 64
/// bytes, e.g. e4m3 at head_dim 64, 8-row groups 512 bytes apart).
constexpr uint32_t desc_hi(uint32_t stride_bytes, uint32_t swizzle_code) {
  return ((stride_bytes >> 4) & 0x3FFF) | (swizzle_code << 30);
}
__device__ inline uint64_t desc_join(uint32_t lo, uint32_t hi) { return (uint64_t(hi) << 32) | lo; }
/// Orders this thread's earlier accesses to the registers the wgmma that follow read or write
/// (the accumulators, an A operand in registers) before them. It does not order ordinary
/// shared-memory stores: an operand written with st.shared needs fence_proxy_async() first.
__device__ inline void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
/// Closes the group of wgmma issued since the last commit.
__device__ inline void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
/// Waits until at most kPending committed groups are still running.
template <int kPending>
__device__ inline void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
/// Makes this thread's ordinary shared-memory stores visible to the asynchronous proxy, which
/// wgmma and TMA read through: needed between writing an operand with st.shared and a wgmma
/// that reads it from shared memory.
__device__ inline void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
/// Keeps the compiler from moving reads or writes of an accumulator across a wgmma boundary.
template <int kN>
__device__ inline void fence_operands(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// clang-format off: the operand lists below keep eight accumulators to a line.
// D (64 x N, fp32) = A (64 x 16, bf16) * B (16 x N, bf16) + (accumulate ? D : 0).
// _ss: A from shared memory (descriptor); _rs: A from registers, laid out as mma.m16n8k16's A
// fragment for the warp's 16 rows. kTransB = 1 when B is MN-major (V in P V).
// Accumulator layout: warp w of the warpgroup holds rows 16w..16w+15; for each 8-column block j,
// d[4j..4j+3] = (row g, col 8j+2t), (g, 8j+2t+1), (g+8, 8j+2t), (g+8, 8j+2t+1), g = lane/4, t = lane%4.
template <int kTransB>
__device__ inline void wgmma_m64n128k16_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %67, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
      "}, %64, %65, p, 1, 1, 0, %66;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "n"(kTransB), "r"(int(accumulate)));
}

template <int kTransB>
__device__ inline void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %70, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
      "}, {%64,%65,%66,%67}, %68, p, 1, 1, %69;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(kTransB), "r"(int(accumulate)));
}

/// The same with N = 64 and both operands in shared memory (chapter 07's S^T = K Q^T, a tile of
/// 64 keys by 64 query rows). kTransA = 1 when A is MN-major: its M dimension contiguous, as
/// chapter 07's dS^T tile is when it serves as the A = dS of dQ = dS K.
template <int kTransB, int kTransA = 0>
__device__ inline void wgmma_m64n64k16_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %35, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
      "}, %32, %33, p, 1, 1, %36, %34;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "n"(kTransB), "r"(int(accumulate)), "n"(kTransA));
}

template <int kTransB>
__device__ inline void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %38, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
      "}, {%32,%33,%34,%35}, %36, p, 1, 1, %37;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(kTransB), "r"(int(accumulate)));
}

// D (64 x 128, fp32) = A (64 x 32, e4m3) * B (32 x 128, e4m3) + D: FP8 takes k = 32 per
// instruction, and both operands must be K-major (no transpose for 8-bit types), so V has to be
// stored transposed for P V.
__device__ inline void wgmma_m64n128k32_e4m3_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
      "}, %64, %65, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
}

/// The same with N = 64 and A from registers (P V at head_dim 64): a[0] = row g, k 4t..4t+3 (one
/// byte each, lowest k in the lowest byte), a[1] = row g + 8, same k; a[2], a[3] = the same rows,
/// k 16 + 4t..19 + 4t.
__device__ inline void wgmma_m64n64k32_e4m3_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b,
                                               bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
      "}, {%32,%33,%34,%35}, %36, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)));
}

/// The same with N = 8 and A from shared memory: 4 floats per thread (row g: d[0], d[1]; row g + 8:
/// d[2], d[3]). With B all ones, d[0] and d[2] are the sums of A's rows g and g + 8 over k.
__device__ inline void wgmma_m64n8k32_e4m3_ss(float (&d)[4], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0,%1,%2,%3}, %4, %5, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
}

// clang-format on

/// stmatrix.x4: the warp stores four 8 x 8 matrices of 16-bit elements (8 rows of 16 bytes each)
/// into shared memory. Thread 4 g + t holds, in r[i], row g's bytes 4t .. 4t + 3 of matrix i --
/// the layout of an mma accumulator or A fragment -- and lane 8 i + k gives the shared address of
/// row k of matrix i, so each row may sit anywhere (a swizzled tile). One instruction in place of
/// four 32-bit stores per thread.
__device__ inline void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
}

/// This thread's two rows of a wgmma accumulator (64 rows x 2 kN columns, kN floats per thread),
/// row r0 times scale[0] and row r0 + 8 times scale[1], rounded to bf16 and stored into a
/// row-major matrix of kCols columns (2 kN unless given: fewer drops the accumulator's last
/// columns) that starts at `base`. Rows at or past `rows` are skipped. The thread's columns are
/// 8n + 2t and 8n + 2t + 1 (see the accumulator layout above).
template <int kN, int kCols = 2 * kN>
__device__ inline void store_rows_bf16(const float (&acc)[kN], __nv_bfloat16* base, int r0, int rows, int t,
                                       const float (&scale)[2], int64_t row_stride = kCols) {
  static_assert(kCols % 8 == 0 && kCols <= 2 * kN, "whole 8-column blocks of the accumulator");
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = r0 + 8 * h;
    if (row >= rows) continue;
#pragma unroll
    for (int n = 0; n < kCols / 8; ++n)
      *reinterpret_cast<__nv_bfloat162*>(base + int64_t(row) * row_stride + 8 * n + 2 * t) =
          __floats2bfloat162_rn(acc[4 * n + 2 * h] * scale[h], acc[4 * n + 2 * h + 1] * scale[h]);
  }
}

/// A wgmma accumulator (64 rows x 2 kN columns, kN floats per thread) as bf16 A fragments for a
/// _rs wgmma: two 8-column blocks of the accumulator layout are one 16-column k-step of the A
/// layout, so the values stay in the thread that holds them (P in P V, dS in dS K, ...).
template <int kN>
__device__ inline void pack_a_bf16(const float (&c)[kN], uint32_t (&a)[kN / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < kN / 8; ++kk) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const __nv_bfloat162 pair = __floats2bfloat162_rn(c[8 * kk + 2 * r], c[8 * kk + 2 * r + 1]);
      a[kk][r] = *reinterpret_cast<const uint32_t*>(&pair);
    }
  }
}

// ---- registers -----------------------------------------------------------------------------
/// setmaxnreg: hand registers back (dec) or take them (inc) for the calling warpgroup; the
/// producer gives up what the consumers need. Only honoured in a kernel with a register cap.
template <int kRegs>
__device__ inline void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ inline void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

}  // namespace fa::hopper
