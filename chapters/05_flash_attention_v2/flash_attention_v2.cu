// Chapter 05 -- FlashAttention-2 (Dao, 2023): fp16 and bf16 in and out, fp32 inside.
//
// Variant 1, `deferred`: chapter 04's variant 3 kernel (register_tiles.cuh: one block per 64-row
// Q tile, K/V tiles inside, 4 x 4 register patches, O in registers) with this chapter's row
// update as its policy (DeferredRows), that is FlashAttention-2's two algorithmic changes:
//   * the loop order is Q outer, K/V inner, which chapter 04's variants 2 and 3 already use;
//   * the output stays unnormalized between tiles: O <- e^(m_old - m_new) O + P V_j with
//     P = e^(S - m_new), and O is divided by l once at the end; LSE = m + log l is written
//     for the backward pass (chapter 07).
// Inputs and outputs are 16-bit (fp16 or bf16); loads convert to fp32, the math and the shared
// memory are fp32, the output is rounded once.
// Run: build/bin/ch05_flash_attention_v2 --variant deferred
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../04_flash_attention_v1/register_tiles.cuh"
#include "algorithm.h"

namespace fa::flash2 {

/// A kernel cannot throw, so the deferred kernel's launcher calls this first: in a student copy
/// it says "not implemented" until flash2_row_softmax (algorithm.h) is written.
inline void require_row_softmax() {
  // BEGIN SOLUTION ch05_tile_cpu: write flash2_row_softmax and flash2_row_step in algorithm.h, then delete this line
  // END SOLUTION
}

/// This chapter's row update for chapter 04's register-tile kernel (its RowUpdate policy): the
/// softmax of algorithm.h, and the output left unnormalized (alpha = the rescale, beta = 1),
/// divided by l once at the end.
//! [deferred_rows]
struct DeferredRows {
  static constexpr bool kNormalized = false;
  static void require() { require_row_softmax(); }
  __device__ static flash1::RowFactors update(float* p, int stride, int keys, float tile_max, float& m, float& l) {
    flash1::RowFactors f;
    f.alpha = flash2_row_softmax(p, stride, keys, tile_max, m, l);
    f.beta = 1.0f;
    return f;
  }
};
//! [deferred_rows]

ForwardKernel deferred_kernel(const char* name, DType dtype, void (*launch)(const ForwardParams&)) {
  const char* summary = "Q tiles outer, deferred normalization (one division by l at the end), 16-bit in and out";
  ForwardKernel k{name, 5, 1, "deferred", dtype, summary, launch};
  k.supports = flash1::register_tiles_support;
  return k;
}
FA_REGISTER_FORWARD_KERNEL(deferred_kernel("ch05_deferred_fp16", DType::F16,
                                           flash1::launch_register_tiles<__half, DeferredRows>));
FA_REGISTER_FORWARD_KERNEL(deferred_kernel("ch05_deferred_bf16", DType::BF16,
                                           flash1::launch_register_tiles<__nv_bfloat16, DeferredRows>));

FA_REGISTER_CPU_ALGORITHM(CpuAlgorithm{"ch05_deferred_cpu", 5, 1, "deferred",
                                       "algorithm.h: Q tiles outer, unnormalized O, one division at the end (float)",
                                       flash_attention_v2_cpu});

}  // namespace fa::flash2
