// Helpers the test files share.
#pragma once

#include <cstdint>
#include <random>

#include "problem.h"

namespace fa {

inline AttentionShape shape_of(int batch, int heads_q, int heads_kv, int seq_q, int seq_kv, int dim, bool causal) {
  AttentionShape s;
  s.batch = batch;
  s.heads_q = heads_q;
  s.heads_kv = heads_kv;
  s.seq_q = seq_q;
  s.seq_kv = seq_kv;
  s.head_dim = dim;
  s.causal = causal;
  return s;
}

/// A fresh seed per test: inputs differ from run to run. Tests print it on failure.
inline uint64_t fresh_seed() { return std::random_device{}(); }

}  // namespace fa
