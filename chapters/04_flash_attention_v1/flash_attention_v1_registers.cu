// Chapter 04, variant 3 -- `registers`: variant 2's loop order and update rule, with the work
// inside a tile arranged the way chapter 01's tiled products arrange it.
//
// Variant 2 computes each score and each output element with a thread that reads two shared
// memory values per multiply-add, on 24 x 24 tiles (d = 128). This variant:
//   * uses 64 x 64 tiles (B_r = B_c = 64): K and V are re-read 2.7x less often than at 24;
//   * gives each of the 256 threads a 4 x 4 patch of S and ceil(d / 64) of O: per step of the inner
//     dimension a thread loads 4 + 4 values and does 16 multiply-adds (chapter 01's pattern);
//   * keeps O_i in registers for the whole K/V loop (d / 4 floats per thread);
//   * stores Q and K transposed ([dim][row], rows padded to 65) so both products read them
//     along their inner dimension without bank conflicts.
// The update per tile is exactly variant 2's: O <- alpha * O + beta * P~ V_j.
// The kernel itself is in register_tiles.cuh (chapter 05 reuses it).
// Run: build/bin/ch04_flash_attention_v1 --variant registers
#include "algorithm.h"
#include "register_tiles.cuh"
#include "tiles.h"

namespace fa::flash1 {

ForwardKernel registers_kernel() {
  const char* summary = "q_outer with 64 x 64 tiles, 4 x 4 register patches per thread and O in registers";
  ForwardKernel k{"ch04_registers", 4, 3, "registers", DType::F32, summary, launch_register_tiles<float, PerStepRows>};
  k.supports = register_tiles_support;
  k.memory_note = [](const AttentionShape& s) {
    return traffic_note(s, LoopOrder::QOuter, kRegisterTiles, register_shared_floats(s.head_dim) * sizeof(float));
  };
  return k;
}
FA_REGISTER_FORWARD_KERNEL(registers_kernel());

FA_REGISTER_CPU_ALGORITHM(CpuAlgorithm{
    "ch04_registers_cpu", 4, 3, "registers", "algorithm.h: q_outer with 64 x 64 tiles (float)",
    [](const AttentionShape& s, const float* q, const float* k, const float* v, float* o, float* lse) {
      flash_attention_v1_cpu(s, q, k, v, o, lse, LoopOrder::QOuter, kRegisterTiles);
    }});

}  // namespace fa::flash1
