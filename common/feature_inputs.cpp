#include "feature_inputs.h"

#include <algorithm>
#include <random>
#include <stdexcept>

#include "random.h"

namespace fa {

namespace {

/// `total` split into `parts` lengths at random cut points (so some may be 0).
std::vector<int> random_lengths(int total, int parts, std::mt19937_64& rng) {
  std::vector<int> cuts(parts - 1);
  for (int& c : cuts) c = std::uniform_int_distribution<int>(0, total)(rng);
  std::sort(cuts.begin(), cuts.end());
  std::vector<int> lengths(parts);
  int previous = 0;
  for (int i = 0; i < parts - 1; ++i) {
    lengths[i] = cuts[i] - previous;
    previous = cuts[i];
  }
  lengths[parts - 1] = total - previous;
  return lengths;
}

std::vector<int> prefix_sums(const std::vector<int>& lengths) {
  std::vector<int> cu(lengths.size() + 1, 0);
  for (size_t i = 0; i < lengths.size(); ++i) cu[i + 1] = cu[i] + lengths[i];
  return cu;
}

}  // namespace

Packing random_packing(const AttentionShape& shape, const AttentionFeatures& features, uint64_t seed) {
  std::mt19937_64 rng(splitmix64(seed ^ 0x5EC1E7ull));
  const int n = features.sequences;
  std::vector<int> q = random_lengths(shape.seq_q, n, rng), k = random_lengths(shape.seq_kv, n, rng);
  if (n >= 3 && shape.seq_q >= 1) {
    // Sequence 1 gives its queries to sequence 0; sequence 2 keeps exactly one, taking it from
    // the longest sequence when it had none.
    q[0] += q[1];
    q[1] = 0;
    if (q[2] == 0) {
      --*std::max_element(q.begin(), q.end());
      q[2] = 1;
    } else {
      q[0] += q[2] - 1;
      q[2] = 1;
    }
  }
  // The sequence with the most queries keeps at least one key, so that every packed problem
  // reaches the attention step somewhere (the empty cases above stay).
  const auto most_q = std::max_element(q.begin(), q.end()) - q.begin();
  if (n >= 1 && shape.seq_kv >= 1 && q[most_q] > 0 && k[most_q] == 0) {
    --*std::max_element(k.begin(), k.end());
    k[most_q] = 1;
  }
  return {prefix_sums(q), prefix_sums(k)};
}

Packing equal_packing(const AttentionShape& shape, const AttentionFeatures& features) {
  const int n = features.sequences;
  std::vector<int> q(n, shape.seq_q / n), k(n, shape.seq_kv / n);
  q.back() += shape.seq_q % n;
  k.back() += shape.seq_kv % n;
  return {prefix_sums(q), prefix_sums(k)};
}

void check_packing(const AttentionShape& shape, const AttentionFeatures& features, const Packing& packing) {
  const int n = features.sequences;
  if (int(packing.cu_q.size()) != n + 1 || int(packing.cu_k.size()) != n + 1 || packing.cu_q.back() != shape.seq_q ||
      packing.cu_k.back() != shape.seq_kv)
    throw std::invalid_argument("a packing of " + describe(shape, features) +
                                " needs sequences + 1 boundaries ending at seq_q and seq_kv");
}

std::vector<float> random_bias(const AttentionShape& shape, const AttentionFeatures& features, uint64_t seed) {
  std::vector<float> bias;
  if (features.bias) {
    bias.resize(features.bias_elems(shape));
    fill_random_normal(bias, seed, 7);
  }
  return bias;
}

AttentionExtras host_extras_of(const AttentionFeatures& features, const std::vector<float>& bias,
                               const Packing& packing) {
  AttentionExtras e;
  if (features.bias) e.bias = bias.data();
  if (features.varlen()) {
    e.cu_seqlens_q = packing.cu_q.data();
    e.cu_seqlens_k = packing.cu_k.data();
    for (int b = 0; b < features.sequences; ++b) {
      e.max_seqlen_q = std::max(e.max_seqlen_q, packing.cu_q[b + 1] - packing.cu_q[b]);
      e.max_seqlen_k = std::max(e.max_seqlen_k, packing.cu_k[b + 1] - packing.cu_k[b]);
    }
  }
  return e;
}

DeviceExtras::DeviceExtras(const AttentionFeatures& features, const std::vector<float>& bias, const Packing& packing)
    : extras(host_extras_of(features, bias, packing)) {
  auto upload_ints = [](DeviceBuffer& to, const std::vector<int>& from) {
    to = DeviceBuffer(from.size() * sizeof(int));
    to.upload(from.data(), from.size() * sizeof(int));
    return to.as<int>();
  };
  if (features.bias) {
    this->bias = upload_as(DType::F32, bias);
    extras.bias = this->bias.as<float>();
  }
  if (features.varlen()) {
    extras.cu_seqlens_q = upload_ints(cu_q, packing.cu_q);
    extras.cu_seqlens_k = upload_ints(cu_k, packing.cu_k);
  }
}

}  // namespace fa
