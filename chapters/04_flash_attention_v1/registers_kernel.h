// Chapter 04's `registers` kernel (flash_attention_v1_registers.cu) for later chapters that run
// it themselves: chapter 07 computes the O and LSE its backward kernels start from with it.
// fp32 in and out; its `supports` says which shapes it takes.
// A program that includes this header links chapter 04's kernels: see FA_CHAPTER_<NN>_USES in
// the top-level CMakeLists.txt.
#pragma once

#include "registry.h"

namespace fa::flash1 {

/// The registered kernel "ch04_registers": its launcher, shape check and memory note.
ForwardKernel registers_kernel();

}  // namespace fa::flash1
