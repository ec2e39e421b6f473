#include "attention_features.h"

#include <algorithm>
#include <cctype>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace fa {

namespace {

// The longest sequence AttentionShape::validate allows, less one, and its largest batch.
constexpr int kMaxWindow = (1 << 22) - 1;
constexpr int kMaxSequences = 1 << 16;

}  // namespace

void AttentionFeatures::validate(const AttentionShape& shape) const {
  for (const auto& [name, value] :
       {std::pair<const char*, int>{"window_left", window_left}, {"window_right", window_right}}) {
    if (value < -1 || value > kMaxWindow) {
      std::ostringstream msg;
      msg << name << " must be -1 (no limit) or between 0 and " << kMaxWindow << ", got " << value;
      throw std::invalid_argument(msg.str());
    }
  }
  if (!std::isfinite(softcap) || softcap < 0.0) {
    std::ostringstream msg;
    msg << "softcap must be a finite number > 0 (or 0 for none), got " << softcap;
    throw std::invalid_argument(msg.str());
  }
  if (sequences < 0 || sequences > kMaxSequences) {
    std::ostringstream msg;
    msg << "sequences must be between 1 and " << kMaxSequences << " (or 0 for a dense batch), got " << sequences;
    throw std::invalid_argument(msg.str());
  }
  if (varlen() && shape.batch != 1) {
    std::ostringstream msg;
    msg << "a packed batch lays its sequences along the seq axis of one batch: batch must be 1, got " << shape.batch;
    throw std::invalid_argument(msg.str());
  }
  if (varlen() && bias)
    throw std::invalid_argument(
        "bias and varlen together are not supported: a packed batch has no [batch, heads, seq_q, seq_kv] bias");
}

double AttentionFeatures::forward_flops(const AttentionShape& s, const int* cu_seqlens_q,
                                        const int* cu_seqlens_k) const {
  if (varlen()) {
    if (!cu_seqlens_q || !cu_seqlens_k)
      throw std::invalid_argument("forward_flops of a packed batch needs its cu_seqlens_q and cu_seqlens_k");
    AttentionFeatures dense = *this;
    dense.sequences = 0;
    double flops = 0;
    for (int b = 0; b < sequences; ++b) {
      const AttentionShape one =
          sequence_shape(s, cu_seqlens_q[b + 1] - cu_seqlens_q[b], cu_seqlens_k[b + 1] - cu_seqlens_k[b]);
      if (one.seq_q > 0 && one.seq_kv > 0) flops += dense.forward_flops(one);
    }
    return flops;
  }
  if (!windowed()) return s.forward_flops();
  double pairs = 0;  // (query, key) pairs the masks leave, one head
  for (int i = 0; i < s.seq_q; ++i) pairs += std::max(0, visible_keys(s, i) - first_visible_key(s, i));
  return 4.0 * s.batch * s.heads_q * pairs * s.head_dim;
}

double AttentionFeatures::forward_min_bytes(const AttentionShape& s, int element_bytes) const {
  return s.forward_min_bytes(element_bytes) + (bias ? 4.0 * double(bias_elems(s)) : 0.0);
}

std::string AttentionFeatures::to_string() const {
  std::ostringstream s;
  if (windowed()) s << " window " << window_left << "," << window_right;
  if (softcap > 0.0) s << " softcap " << softcap;
  if (alibi) s << " alibi";
  if (bias) s << " bias";
  if (varlen()) s << " varlen " << sequences;
  const std::string text = s.str();
  return text.empty() ? text : text.substr(1);
}

std::string describe(const AttentionShape& shape, const AttentionFeatures& features) {
  return features.any() ? shape.to_string() + " " + features.to_string() : shape.to_string();
}

std::string AttentionFeatures::to_identifier() const {
  std::ostringstream s;
  // "-1" is not an identifier character: an unlimited side is written "n".
  auto side = [](int w) { return w < 0 ? std::string("n") : std::to_string(w); };
  if (windowed()) s << "_window" << side(window_left) << "_" << side(window_right);
  if (softcap > 0.0) {
    std::ostringstream cap;
    cap << softcap;
    std::string text;
    for (char c : cap.str()) {
      if (c == '.') text += 'p';  // 30.5 -> 30p5
      if (std::isalnum(static_cast<unsigned char>(c))) text += c;
    }
    s << "_softcap" << text;
  }
  if (alibi) s << "_alibi";
  if (bias) s << "_bias";
  if (varlen()) s << "_varlen" << sequences;
  return s.str();
}

}  // namespace fa
