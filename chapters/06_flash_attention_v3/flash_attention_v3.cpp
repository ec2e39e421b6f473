// Chapter 06 host side: which shapes and GPUs the Hopper kernels take.
#include "flash_attention_v3.h"

#include "tma.h"

namespace fa::flash3 {

std::string hopper_support(const AttentionShape& s, std::initializer_list<int> head_dims) {
  return fa::hopper_support(s, "chapter 06", head_dims);
}

}  // namespace fa::flash3
