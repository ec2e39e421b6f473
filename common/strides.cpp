// Strided tensors; see strides.h.
#include "strides.h"

#include <utility>

namespace fa {

ForwardStrides ForwardStrides::packed(const AttentionShape& s) {
  const TensorStrides q = TensorStrides::packed(s.heads_q, s.seq_q, s.head_dim);
  const TensorStrides kv = TensorStrides::packed(s.heads_kv, s.seq_kv, s.head_dim);
  return {q, kv, kv, q};
}

BackwardStrides BackwardStrides::packed(const AttentionShape& s) {
  const TensorStrides q = TensorStrides::packed(s.heads_q, s.seq_q, s.head_dim);
  const TensorStrides kv = TensorStrides::packed(s.heads_kv, s.seq_kv, s.head_dim);
  return {q, kv, kv, q, q, q, kv, kv};
}

namespace {

std::string tensor_reason(const char* name, const TensorStrides& t) {
  const std::pair<const char*, int64_t> strides[3] = {{"batch", t.batch}, {"head", t.head}, {"row", t.row}};
  for (const auto& [what, value] : strides)
    if (value < 0 || value % 8 != 0)
      return std::string(name) + "'s " + what + " stride must be a non-negative multiple of 8 elements, got " +
             std::to_string(value);
  return "";
}

template <size_t N>
std::string first_reason(const std::pair<const char*, const TensorStrides*> (&tensors)[N]) {
  for (const auto& [name, t] : tensors)
    if (std::string why = tensor_reason(name, *t); !why.empty()) return why;
  return "";
}

}  // namespace

std::string strides_reason(const ForwardStrides& s) {
  const std::pair<const char*, const TensorStrides*> tensors[] = {{"q", &s.q}, {"k", &s.k}, {"v", &s.v}, {"o", &s.o}};
  return first_reason(tensors);
}

std::string strides_reason(const BackwardStrides& s) {
  const std::pair<const char*, const TensorStrides*> tensors[] = {
      {"q", &s.q}, {"k", &s.k}, {"v", &s.v}, {"o", &s.o}, {"d_o", &s.d_o}, {"dq", &s.dq}, {"dk", &s.dk}, {"dv", &s.dv}};
  return first_reason(tensors);
}

}  // namespace fa
