// Bring your own kernel: the example (README, "Add your own kernel").
//
// This file is what a learner adds to a chapter: one kernel, one launcher, one registration
// line. Nothing else in the build names it. Every .cu file of the chapter's folder is built into
// the chapter, and the registration puts the kernel into the GPU tests (all shapes, the large-
// logit and determinism checks), the program (`ch03_online_softmax --variant example`) and
// `fa_bench --kernels example`. It is kept in the tree, and the tests run it, so that path
// keeps working.
//
// To write your own: copy this file to, say, my_attention.cu, rename the kernel, the launcher
// and the registration's name and variant ("ch03_mine", "mine"), and change the kernel.
//
// The kernel: one thread per query row, chapter 03's online softmax over the keys one at a
// time, the output row kept in a per-thread array. It is short, not fast.
#include "cuda_check.h"
#include "registry.h"

namespace fa::example {

constexpr int kMaxHeadDim = 128;  // the per-thread output row

__global__ void one_thread_per_row_kernel(AttentionShape s, const float* q, const float* k, const float* v, float* o,
                                          float* lse) {
  const int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // over batch x heads_q x seq_q
  if (row >= s.lse_elems()) return;
  const int i = int(row % s.seq_q), bh = int(row / s.seq_q), d = s.head_dim;
  const float* q_row = q + s.q_head_offset(bh) + int64_t(i) * d;
  const float* k_head = k + s.kv_head_offset(bh);
  const float* v_head = v + s.kv_head_offset(bh);
  const float scale = float(s.softmax_scale());
  float m = -INFINITY, l = 0.0f, acc[kMaxHeadDim];
  for (int c = 0; c < d; ++c) acc[c] = 0.0f;
  for (int j = 0; j < s.visible_keys(i); ++j) {
    float score = 0.0f;
    for (int c = 0; c < d; ++c) score += q_row[c] * k_head[int64_t(j) * d + c];
    score *= scale;
    const float m_new = fmaxf(m, score);
    const float rescale = expf(m - m_new);  // 0 for the first key (m = -inf)
    const float p = expf(score - m_new);
    l = l * rescale + p;
    for (int c = 0; c < d; ++c) acc[c] = acc[c] * rescale + p * v_head[int64_t(j) * d + c];
    m = m_new;
  }
  float* o_row = o + s.q_head_offset(bh) + int64_t(i) * d;
  // A row that sees no key has l = 0: O = 0, LSE = -inf. (Not `l > 0`: a NaN input makes l NaN,
  // and then O and LSE must be NaN, not zero.)
  for (int c = 0; c < d; ++c) o_row[c] = l == 0.0f ? 0.0f : acc[c] / l;
  lse[row] = l == 0.0f ? -INFINITY : m + logf(l);
}

void launch_example(const ForwardParams& p) {
  const int threads = 128;
  const int64_t rows = p.shape.lse_elems();
  one_thread_per_row_kernel<<<unsigned((rows + threads - 1) / threads), threads, 0, p.stream>>>(
      p.shape, static_cast<const float*>(p.q), static_cast<const float*>(p.k), static_cast<const float*>(p.v),
      static_cast<float*>(p.o), p.lse);
  CUDA_CHECK_LAUNCH();
}

// The one registration line (name, chapter, variant number, --variant name, dtype, summary,
// launcher); `supports` is optional and says which shapes the kernel cannot take, and why.
FA_REGISTER_FORWARD_KERNEL([] {
  const char* summary = "bring-your-own-kernel example: one thread per row";
  ForwardKernel k{"ch03_example", 3, 9, "example", DType::F32, summary, launch_example};
  k.supports = [](const AttentionShape& s) {
    return s.head_dim <= kMaxHeadDim ? std::string()
                                     : "head_dim must be at most 128, got " + std::to_string(s.head_dim);
  };
  return k;
}());

}  // namespace fa::example
