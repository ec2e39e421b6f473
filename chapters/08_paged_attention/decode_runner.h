// Chapter 08's harness: running a paged-attention kernel against the fp64 oracle. A batch of
// sequences whose block tables come from the chapter's BlockManager (prompts shared by forked
// samples, copy-on-write), a cache filled on the GPU, one launch on poisoned outputs with its peak
// device memory, the comparison, and the timing with the effective K/V bandwidth. It lives in the
// chapter, not in common/, because it builds on the chapter's block manager. Used by chapter 08's
// program, its GPU tests and fa_bench --decode.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "compare.h"
#include "dtype.h"
#include "problem.h"
#include "reference.h"
#include "registry.h"
#include "tensor.h"

namespace fa {

/// What to build. Sequences come in groups of `samples`: the first of a group gets a prompt of
/// `shared_prompt` tokens, the others are forked from it (sharing its blocks), then every
/// sequence grows to its context length (copy-on-write of the prompt's last block when it is
/// not full). samples = 1, shared_prompt = 0: independent sequences.
struct DecodeSpec {
  int heads_q = 32, heads_kv = 8, head_dim = 128;
  int block_size = 16;
  int query_len = 1;
  std::vector<int> contexts;  // one per sequence, query tokens included
  int samples = 1;
  int shared_prompt = 0;
  int spare_blocks = 3;  // never-referenced blocks in the pool (filled with NaN)
  /// The oracle covers sequences [0, check_seqs); -1 = all. The rest are only checked to be
  /// written and finite.
  int check_seqs = -1;
};

/// The host side of a problem: the tables, Q rounded to the dtype, and the oracle's output.
/// The cache's values are a pure function of (seed, K or V, element index), multiples of 1/64
/// in [-1, 1) so fp16 and bf16 hold them exactly; slots nobody wrote are NaN, so a kernel that
/// reads outside a sequence's context (or through a wrong table entry) shows it.
struct DecodeProblem {
  DecodeShape shape;
  uint64_t seed = 0;
  DType dtype = DType::F16;
  std::vector<std::vector<int>> tables;  // physical block ids, shuffled
  std::vector<int> lens;
  std::vector<int> filled;  // per physical block: how many of its slots hold a token
  std::vector<float> q;     // [num_seqs][heads_q][query_len][head_dim]
  int checked_seqs = 0;
  DecodeReference ref;      // for sequences [0, checked_seqs)
  int blocks_used = 0;      // distinct physical blocks the tables reference
  int blocks_unshared = 0;  // what the same sequences would need without sharing
  double kv_bytes() const;  // K and V bytes a decode step must read: every sequence's context once
};

DecodeProblem make_decode_problem(const DecodeSpec& spec, uint64_t seed, DType dtype);

/// The problem's inputs on the GPU.
struct DecodeDeviceInputs {
  DeviceBuffer q, k_cache, v_cache, tables, lens;
  /// Device bytes of all five: Q, the whole K and V pools, the block tables, the context lengths.
  std::size_t bytes() const { return q.bytes() + k_cache.bytes() + v_cache.bytes() + tables.bytes() + lens.bytes(); }
};
DecodeDeviceInputs upload_decode_problem(const DecodeProblem& problem);
/// The launch parameters for the problem's inputs and the given outputs and workspace.
DecodeParams decode_params(const DecodeProblem& problem, const DecodeDeviceInputs& inputs, void* o, float* lse,
                           void* workspace);
/// The cache values of the problem, as the GPU holds them (host copies, for the tests).
float decode_cache_value(uint64_t seed, int which, int64_t element);

struct DecodeRunResult {
  bool ran = false;
  std::string skipped;  // unsupported shape, no GPU
  std::string error;
  CompareReport report;       // the checked sequences
  int64_t unchecked_bad = 0;  // outputs of the other sequences unwritten or not finite
  bool passed = false;
  bool repeat_identical = false;  // a second launch wrote the same bytes
  double time_ms = 0;
  double gbps = 0;  // kv_bytes / time
  /// Peak device memory of the launch: Q, the K/V pools, the block tables and context lengths,
  /// O, LSE and the workspace (MiB).
  double device_mib = 0;
  std::string summary() const;
};

/// One launch on poisoned outputs (its peak device memory counted over it, `inputs` included), the
/// comparison, a second launch for repeatability; then, when iters > 0, timing (time_launches: 2
/// warm-up launches, median of iters launches with CUDA events; flush_l2: the L2 evicted before
/// each).
DecodeRunResult run_decode(const DecodeKernel& kernel, const DecodeProblem& problem, const DecodeDeviceInputs& inputs,
                           int iters, bool flush_l2 = false);

}  // namespace fa
