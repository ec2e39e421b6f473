// Chapter 06 host side: which shapes and GPUs the Hopper kernels take.
#include "flash_attention_v3.h"

#include "cuda_check.h"

namespace fa::flash3 {

std::string hopper_support(const AttentionShape& s) {
  const GpuInfo& gpu = detect_gpu();
  if (gpu.available && gpu.sm_major != 9)
    return "chapter 06 needs an sm_90 GPU (Hopper: TMA and wgmma), this one is sm_" + std::to_string(gpu.sm_major * 10 + gpu.sm_minor);
  if (s.head_dim != 64 && s.head_dim != 128) return "head_dim must be 64 or 128, got " + std::to_string(s.head_dim);
  const int64_t heads = int64_t(s.batch) * s.heads_q;
  if (heads > 65535) return "batch*heads_q must be at most 65535, got " + std::to_string(heads);
  return "";
}

}  // namespace fa::flash3
