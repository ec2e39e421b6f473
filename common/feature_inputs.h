// The harness's inputs for chapter 09's features: a packed batch's sequence boundaries, a random
// bias, and both gathered into AttentionExtras on the host or copied to the device. Only
// problems with features (the oracle's, chapter 09's, fa_bench's feature points) make them.
#pragma once

#include <cstdint>
#include <vector>

#include "attention_features.h"
#include "problem.h"
#include "tensor.h"

namespace fa {

/// Sequence boundaries of a packed batch: features.sequences + 1 entries each, 0 to the total.
struct Packing {
  std::vector<int> cu_q, cu_k;
};
/// Random sequence lengths for a packed batch, drawn from the seed: from 3 sequences on,
/// sequence 1 has no query and sequence 2 one query (the cases a varlen kernel gets wrong first).
Packing random_packing(const AttentionShape& shape, const AttentionFeatures& features, uint64_t seed);
/// Every sequence the same length (what a benchmark packs): seq_q / sequences queries each.
Packing equal_packing(const AttentionShape& shape, const AttentionFeatures& features);
/// Throws std::invalid_argument unless `packing` has sequences + 1 boundaries ending at seq_q and seq_kv.
void check_packing(const AttentionShape& shape, const AttentionFeatures& features, const Packing& packing);
/// A float bias [batch, heads_q, seq_q, seq_kv] of standard-normal values when features.bias
/// (stream 7 of `seed`), empty otherwise.
std::vector<float> random_bias(const AttentionShape& shape, const AttentionFeatures& features, uint64_t seed);

/// The extras of a problem on the host: the bias and a packing's boundaries, each only when the
/// features ask for it, and a packing's longest sequences.
AttentionExtras host_extras_of(const AttentionFeatures& features, const std::vector<float>& bias,
                               const Packing& packing);
/// The same copied to the device; owns the copies.
struct DeviceExtras {
  DeviceBuffer bias, cu_q, cu_k;
  AttentionExtras extras;
  DeviceExtras(const AttentionFeatures& features, const std::vector<float>& bias, const Packing& packing);
  std::size_t bytes() const { return bias.bytes() + cu_q.bytes() + cu_k.bytes(); }
};

}  // namespace fa
