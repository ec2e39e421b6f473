// Chapter 07, variant 2 -- `mma`: the backward on tensor cores (mma.sync m16n8k16, fp16/bf16 in,
// fp32 accumulate), K/V tile resident, dK and dV in registers.
//
// Block: 4 warps and one 64-key K/V tile; warp w owns keys 16w .. 16w + 15. Working with the
// *transposed* scores keeps every warp's dK/dV rows its own:
//   S^T  (16 keys x 64 rows) = K_w Q_i^T      A = K rows, B = Q rows    (ldmatrix)
//   dP^T (16 keys x 64 rows) = V_w dO_i^T     A = V rows, B = dO rows
//   P^T = exp(S^T scale - LSE), dS^T = P^T (dP^T - D)        (LSE and D per column = per row)
//   dV_w += P^T dO_i,  dK_w += dS^T Q_i         A = P^T, dS^T from registers (the C->A trick of
//                                              chapter 05), B = dO, Q by ldmatrix.trans
//   dQ_i += dS K_j: dS goes through shared memory (transposed back), each warp then computes 16
//   rows of dS K_j on the tensor cores and adds them to an fp32 dQ with atomics; a last small
//   kernel rounds dQ to the output type.
// Run: build/bin/ch07_backward --variant mma
#include "backward_mma.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>

#include "cuda_check.h"
#include "delta.cuh"
#include "registry.h"
#include "static_switch.h"

namespace fa::backward {
namespace {

template <class T, int kD>
void launch_dim(const BackwardParams& p) {
  const AttentionShape& s = p.shape;
  float* delta = static_cast<float*>(p.workspace);
  float* dq32 = delta + s.lse_elems();
  CUDA_CHECK(cudaMemsetAsync(dq32, 0, std::size_t(s.q_elems()) * sizeof(float), p.stream));
  launch_delta<T>(p, delta);
  const int bytes = backward_mma_smem_bytes<T, kD, true>();
  dim3 grid(unsigned((s.seq_kv + kKeys - 1) / kKeys), unsigned(s.batch * s.heads_kv));
  const auto q = static_cast<const T*>(p.q), k = static_cast<const T*>(p.k), v = static_cast<const T*>(p.v),
             d_o = static_cast<const T*>(p.d_o);
  const auto dk = static_cast<T*>(p.dk), dv = static_cast<T*>(p.dv);
  if (p.strides)  // strided tensors: the same kernel with the rows' strides
    launch_with_smem(backward_mma_strided_kernel<T, kD, true>, grid, bytes, p.stream, s, q, k, v, d_o, p.lse, delta,
                     dq32, dk, dv, *p.strides);
  else
    launch_with_smem(backward_mma_kernel<T, kD, true>, grid, bytes, p.stream, s, q, k, v, d_o, p.lse, delta, dq32, dk,
                     dv);
  launch_round_dq<T>(dq32, p);
}

template <class T>
void launch_mma(const BackwardParams& p) {
  with_head_dim<64, 128>(p.shape.head_dim, [&](auto d) { launch_dim<T, d.value>(p); });
}

BackwardKernel mma_kernel(const char* name, DType dtype, void (*launch)(const BackwardParams&)) {
  const char* summary =
      "tensor cores (mma.sync): S^T and dP^T per warp's 16 keys, dK/dV in registers, dQ via fp32 atomics";
  BackwardKernel k{name, 7, 2, "mma", dtype, summary, launch};
  k.supports = [](const AttentionShape& s) { return backward_mma_support(s, false); };
  k.workspace_bytes = [](const AttentionShape& s) {
    return std::size_t(s.lse_elems()) * sizeof(float) + std::size_t(s.q_elems()) * sizeof(float);
  };
  k.strided = true;  // backward_mma_strided_kernel, D's rows and dQ's rounding take any strides
  return k;
}

}  // namespace

FA_REGISTER_BACKWARD_KERNEL(mma_kernel("ch07_mma_fp16", DType::F16, launch_mma<__half>));
FA_REGISTER_BACKWARD_KERNEL(mma_kernel("ch07_mma_bf16", DType::BF16, launch_mma<__nv_bfloat16>));

}  // namespace fa::backward
