// Chapter 06, variant 5 -- `fp8`: variant 4's warp-specialized ping-pong kernel on e4m3
// operands, with FlashAttention-3's two accuracy tricks (block quantization and incoherent
// processing). bf16 in and out; head_dim 64, 128 and 256. This file is the host side; the device
// side is read in this order:
//   fp8_quantize.cuh         the preprocessing: Hadamard rotation, block scales, V transposed;
//   fp8_tile.cuh             the per-tile e4m3 work both attention kernels share;
//   fp8_pingpong.cuh         the attention kernel at head_dim 64: variant 4's schedule on e4m3;
//   fp8_three_consumers.cuh  the attention kernel at head_dim 128: three consumer warpgroups,
//                            P through shared memory, row sums on the tensor cores (and at
//                            256 with two consumers);
//   fp8_scheduler.cuh        which block takes which Q block, and the split last wave.
// Variant 6, `fp8_plain`, is the control: the same kernels without the rotation.
// The CPU model of all this, and its accuracy experiment, is algorithm.h / tests/cpu/test_fp8.cpp.
// Run: build/bin/ch06_flash_attention_v3 --variant fp8
#include <cuda_bf16.h>

#include <cstdint>

#include "algorithm.h"
#include "compare.h"
#include "cuda_check.h"
#include "flash_attention_v3.h"
#include "fp8_pingpong.cuh"
#include "fp8_three_consumers.cuh"
#include "not_implemented.h"
#include "phase_timer.h"
#include "registry.h"
#include "static_switch.h"
#include "tma.h"

namespace fa::flash3 {
namespace {

/// The attention kernel that runs at head_dim kD, and its shared memory.
template <int kD>
auto fp8_attention_kernel() {
  if constexpr (kD == 64) {
    return flash3_fp8_pingpong_kernel<64>;
  } else {
    return flash3_fp8_three_consumers_kernel<kD>;
  }
}
template <int kD>
constexpr int kFp8SmemBytes = kD == 64 ? Fp8PingpongSmem<64>::kBytes : Fp8ThreeSmem<kD>::kBytes;
static_assert(kFp8SmemBytes<256> <= 232448, "head_dim 256: Q, two K and V^T stages and the P buffers fit a block");

/// The attention kernel's compile-time sizes at this shape's head_dim, for the host.
struct Fp8Dims {
  int consumers;      // consumer warpgroups per block (kConsumers8)
  int record_floats;  // floats of one warp's record in the split tail (kRecordFloats)
};
Fp8Dims fp8_dims(const AttentionShape& s) {
  Fp8Dims dims{};
  with_head_dim<64, 128, 256>(s.head_dim, [&](auto d) { dims = {kConsumers8<d.value>, kRecordFloats<d.value>}; });
  return dims;
}

/// Q blocks per plane for the attention kernel: 64-row groups, kConsumers8 of them per block.
int fp8_q_blocks(const AttentionShape& s) {
  const int consumers = fp8_dims(s).consumers;
  return ((s.seq_q + 63) / 64 + consumers - 1) / consumers;
}

/// Block slots on the current GPU for the attention kernel at head_dim kD (SMs x blocks per SM),
/// or 0 when there is no GPU to ask.
template <int kD>
int fp8_block_slots() {
  int device = 0, sms = 0, per_sm = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  auto kernel = fp8_attention_kernel<kD>();
  constexpr int kBytes = kFp8SmemBytes<kD>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes));
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 128 * (1 + kConsumers8<kD>), kBytes));
  return sms * per_sm;
}

struct Fp8Workspace {
  uint8_t *q8, *k8, *vt8;
  float *q_scales, *k_scales, *v_scales;
  float* records;  // the split tail's partial results (Fp8Grid)
  int* counters;
  int q_blocks, kv_blocks, kv_padded, counter_count;
  Fp8TailSplit split;
  std::size_t bytes;  // all of it, each part 256-byte aligned
};

Fp8Workspace carve_workspace(const AttentionShape& s, void* base) {
  auto align = [](std::size_t x) { return (x + 255) / 256 * 256; };
  Fp8Workspace w{};
  w.q_blocks = (s.seq_q + kRows8 - 1) / kRows8;
  w.kv_blocks = (s.seq_kv + kRows8 - 1) / kRows8;
  w.kv_padded = w.kv_blocks * kRows8;
  w.split = fp8_tail_split(s);
  const int64_t planes_q = int64_t(s.batch) * s.heads_q, planes_kv = int64_t(s.batch) * s.heads_kv;
  auto* p = static_cast<unsigned char*>(base);
  std::size_t at = 0;
  auto take = [&](std::size_t bytes) {
    unsigned char* r = p ? p + at : nullptr;
    at += align(bytes);
    return r;
  };
  const std::size_t d = std::size_t(s.head_dim);
  w.q8 = take(std::size_t(planes_q) * s.seq_q * d);
  w.k8 = take(std::size_t(planes_kv) * s.seq_kv * d);
  w.vt8 = take(std::size_t(planes_kv) * d * w.kv_padded);
  w.q_scales = reinterpret_cast<float*>(take(std::size_t(planes_q) * w.q_blocks * sizeof(float)));
  w.k_scales = reinterpret_cast<float*>(take(std::size_t(planes_kv) * w.kv_blocks * sizeof(float)));
  w.v_scales = reinterpret_cast<float*>(take(std::size_t(planes_kv) * w.kv_blocks * sizeof(float)));
  // One record per warp of every piece of every tail block; one counter per warp of every tail block.
  const Fp8Dims dims = fp8_dims(s);
  const int warps = 4 * dims.consumers, record = dims.record_floats;
  const int split_warps = w.split.pieces > 1 ? w.split.tail * warps : 0;
  w.counter_count = split_warps;
  w.records = reinterpret_cast<float*>(take(std::size_t(split_warps) * w.split.pieces * record * sizeof(float)));
  w.counters = reinterpret_cast<int*>(take(std::size_t(split_warps) * sizeof(int)));
  w.bytes = at;
  return w;
}

/// Sizes only (base = nullptr) or lays the parts out in `base`.
std::size_t fp8_workspace_bytes(const AttentionShape& s) { return carve_workspace(s, nullptr).bytes; }

template <int kD, bool kRotate>
void launch_fp8_dim(const ForwardParams& p) {
  require_produce_kv();  // the producer's loop is this chapter's exercise
  const AttentionShape& s = p.shape;
  const Fp8Workspace w = carve_workspace(s, p.workspace);
  const int planes_q = s.batch * s.heads_q, planes_kv = s.batch * s.heads_kv;
  const auto* q = static_cast<const __nv_bfloat16*>(p.q);
  const auto* k = static_cast<const __nv_bfloat16*>(p.k);
  const auto* v = static_cast<const __nv_bfloat16*>(p.v);
  quantize_rotated_kernel<kD, kRotate><<<dim3(w.q_blocks, planes_q), kPrepThreads, 0, p.stream>>>(
      q, s.seq_q, w.q8, w.q_scales, w.counters, w.counter_count);
  CUDA_CHECK_LAUNCH();
  quantize_rotated_kernel<kD, kRotate>
      <<<dim3(w.kv_blocks, planes_kv), kPrepThreads, 0, p.stream>>>(k, s.seq_kv, w.k8, w.k_scales, nullptr, 0);
  CUDA_CHECK_LAUNCH();
  quantize_v_kernel<kD>
      <<<dim3(w.kv_blocks, planes_kv), kPrepThreads, 0, p.stream>>>(v, s.seq_kv, w.kv_padded, w.vt8, w.v_scales);
  CUDA_CHECK_LAUNCH();
  mark_phase(p.stream, "quantize");

  // Q and K rows are kD bytes, in boxes of up to 128 (64- or 128-byte swizzle; two boxes per row
  // at 256); V^T rows are 128 keys = 128 bytes. A Q box is 64 rows per consumer warpgroup.
  constexpr int kC = kConsumers8<kD>;
  const CUtensorMap tm_q = make_tensor_map_swizzled(w.q8, 1, kD, s.seq_q, planes_q, 64 * kC, kBoxBytes8<kD>);
  const CUtensorMap tm_k = make_tensor_map_swizzled(w.k8, 1, kD, s.seq_kv, planes_kv, kRows8, kBoxBytes8<kD>);
  const CUtensorMap tm_vt = make_tensor_map_swizzled(w.vt8, 1, w.kv_padded, kD, planes_kv, kD, 128);
  const Fp8Scales scales{w.q_scales, w.k_scales, w.v_scales, w.q_blocks, w.kv_blocks};
  auto kernel = fp8_attention_kernel<kD>();
  constexpr int kBytes = kFp8SmemBytes<kD>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes));
  const int q_blocks = fp8_q_blocks(s);
  const Fp8TailSplit& split = w.split;
  const int split_from = split.blocks - (split.pieces > 1 ? split.tail : 0);
  const Fp8Grid grid{q_blocks, planes_q, split_from, split.pieces, w.records, w.counters};
  const unsigned blocks = unsigned(split_from + (split.blocks - split_from) * split.pieces);
  kernel<<<blocks, 128 * (1 + kC), kBytes, p.stream>>>(tm_q, tm_k, tm_vt, s, scales, grid,
                                                       static_cast<__nv_bfloat16*>(p.o), p.lse);
  CUDA_CHECK_LAUNCH();
  mark_phase(p.stream, "attention");
}

template <bool kRotate>
void launch_fp8(const ForwardParams& p) {
  with_head_dim<64, 128, 256>(p.shape.head_dim, [&](auto d) { launch_fp8_dim<d.value, kRotate>(p); });
}

ForwardKernel fp8_kernel(const char* name, int number, const char* variant, const char* summary,
                         void (*launch)(const ForwardParams&)) {
  ForwardKernel k{name, 6, number, variant, DType::BF16, summary, launch};
  k.supports = [](const AttentionShape& s) { return hopper_support(s, {64, 128, 256}); };
  k.workspace_bytes = fp8_workspace_bytes;
  k.tolerance = fp8_tolerance();
  return k;
}

}  // namespace

Fp8TailSplit fp8_tail_split(const AttentionShape& s) {
  Fp8TailSplit split;
  if (s.head_dim != 64 && s.head_dim != 128 && s.head_dim != 256) return split;
  split.blocks = fp8_q_blocks(s) * s.batch * s.heads_q;
  if (s.causal) return split;  // causal blocks differ in length: longest first instead
  // The block slots, asked once per device (the answer does not change).
  static int cached[64][3] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device >= 64) {
    (void)cudaGetLastError();
    return split;
  }
  int& slots = cached[device][s.head_dim == 64 ? 0 : s.head_dim == 128 ? 1 : 2];
  if (slots == 0) with_head_dim<64, 128, 256>(s.head_dim, [&](auto d) { slots = fp8_block_slots<d.value>(); });
  split.slots = slots;
  if (split.slots == 0) return split;
  split.tail = split.blocks % split.slots;
  split.pieces = tail_pieces(split.blocks, split.slots, (s.seq_kv + kBlockN - 1) / kBlockN);
  return split;
}

FA_REGISTER_FORWARD_KERNEL(
    fp8_kernel("ch06_fp8", 5, "fp8",
               "variant 4 on e4m3: Hadamard-rotated, block-scaled Q/K/V (quantized on the GPU), P in e4m3, bf16 out",
               launch_fp8<true>));
FA_REGISTER_FORWARD_KERNEL(fp8_kernel(
    "ch06_fp8_plain", 6, "fp8_plain",
    "control for variant 5: the same kernel without the Hadamard rotation (block scales only)", launch_fp8<false>));
}  // namespace fa::flash3
