#include "problem.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace fa {

namespace {

// Limits keep every index product inside int64 and every per-head offset inside what kernels
// address; they are far above any shape a chapter is meant for.
constexpr int kMaxBatch = 1 << 16;
constexpr int kMaxHeads = 1 << 12;
constexpr int kMaxSeq = 1 << 22;
constexpr int kMaxHeadDim = 1024;

void require_range(const char* name, int value, int max_value) {
  if (value < 1 || value > max_value) {
    std::ostringstream msg;
    msg << name << " must be between 1 and " << max_value << ", got " << value;
    throw std::invalid_argument(msg.str());
  }
}

// GQA: every K/V head serves the same number of query heads.
void require_grouped_heads(int heads_q, int heads_kv) {
  if (heads_q % heads_kv != 0) {
    std::ostringstream msg;
    msg << "heads_q (" << heads_q << ") must be a multiple of heads_kv (" << heads_kv << ")";
    throw std::invalid_argument(msg.str());
  }
}

}  // namespace

void AttentionShape::validate() const {
  require_range("batch", batch, kMaxBatch);
  require_range("heads_q", heads_q, kMaxHeads);
  require_range("heads_kv", heads_kv, kMaxHeads);
  require_range("seq_q", seq_q, kMaxSeq);
  require_range("seq_kv", seq_kv, kMaxSeq);
  require_range("head_dim", head_dim, kMaxHeadDim);
  require_grouped_heads(heads_q, heads_kv);
  if (!std::isfinite(scale) || scale < 0.0) {
    std::ostringstream msg;
    msg << "scale must be a finite number > 0 (or 0 for 1/sqrt(head_dim)), got " << scale;
    throw std::invalid_argument(msg.str());
  }
  for (const auto& [name, value] :
       {std::pair<const char*, int>{"window_left", window_left}, {"window_right", window_right}}) {
    if (value < -1 || value >= kMaxSeq) {
      std::ostringstream msg;
      msg << name << " must be -1 (no limit) or between 0 and " << kMaxSeq - 1 << ", got " << value;
      throw std::invalid_argument(msg.str());
    }
  }
  if (!std::isfinite(softcap) || softcap < 0.0) {
    std::ostringstream msg;
    msg << "softcap must be a finite number > 0 (or 0 for none), got " << softcap;
    throw std::invalid_argument(msg.str());
  }
  if (varlen && bias)
    throw std::invalid_argument(
        "bias and varlen together are not supported: a packed batch has no [batch, heads, seq_q, seq_kv] bias");
}

double AttentionShape::forward_flops(const int* cu_seqlens_q, const int* cu_seqlens_k) const {
  if (varlen) {
    if (!cu_seqlens_q || !cu_seqlens_k)
      throw std::invalid_argument("forward_flops of a packed batch needs its cu_seqlens_q and cu_seqlens_k");
    double flops = 0;
    for (int b = 0; b < batch; ++b) {
      const AttentionShape one =
          sequence_shape(cu_seqlens_q[b + 1] - cu_seqlens_q[b], cu_seqlens_k[b + 1] - cu_seqlens_k[b]);
      if (one.seq_q > 0 && one.seq_kv > 0) flops += one.forward_flops();
    }
    return flops;
  }
  if (window_left < 0 && window_right < 0) {
    double flops = 4.0 * batch * heads_q * double(seq_q) * seq_kv * head_dim;
    return causal ? flops / 2 : flops;
  }
  double pairs = 0;  // (query, key) pairs the window leaves, one head
  for (int i = 0; i < seq_q; ++i) pairs += std::max(0, visible_keys(i) - first_visible_key(i));
  return 4.0 * batch * heads_q * pairs * head_dim;
}

double AttentionShape::forward_min_bytes(int element_bytes) const {
  double qo = 2.0 * double(q_elems()) * element_bytes;
  double kv = 2.0 * double(kv_elems()) * element_bytes;
  return qo + kv + 4.0 * double(lse_elems()) + (bias ? 4.0 * double(bias_elems()) : 0.0);
}

std::string AttentionShape::to_string() const {
  std::ostringstream s;
  s << "b" << batch << " h" << heads_q << "/" << heads_kv << " q" << seq_q << " k" << seq_kv << " d" << head_dim
    << (causal ? " causal" : "");
  if (scale > 0.0) s << " scale" << scale;
  const std::string features = feature_string();
  if (!features.empty()) s << " " << features;
  return s.str();
}

std::string AttentionShape::feature_string() const {
  std::ostringstream s;
  if (window_left >= 0 || window_right >= 0) s << " window " << window_left << "," << window_right;
  if (softcap > 0.0) s << " softcap " << softcap;
  if (alibi) s << " alibi";
  if (bias) s << " bias";
  if (varlen) s << " varlen";
  const std::string text = s.str();
  return text.empty() ? text : text.substr(1);
}

std::string AttentionShape::to_identifier() const {
  std::ostringstream s;
  s << "b" << batch << "_h" << heads_q << "_kv" << heads_kv << "_q" << seq_q << "_k" << seq_kv << "_d" << head_dim
    << (causal ? "_causal" : "_full");
  // "-1" is not an identifier character: an unlimited side is written "n".
  auto side = [](int w) { return w < 0 ? std::string("n") : std::to_string(w); };
  if (window_left >= 0 || window_right >= 0) s << "_window" << side(window_left) << "_" << side(window_right);
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
  if (varlen) s << "_varlen";
  return s.str();
}

void DecodeShape::validate() const {
  require_range("num_seqs", num_seqs, kMaxBatch);
  require_range("heads_q", heads_q, kMaxHeads);
  require_range("heads_kv", heads_kv, kMaxHeads);
  require_range("head_dim", head_dim, kMaxHeadDim);
  require_range("query_len", query_len, kMaxSeq);
  require_range("num_blocks", num_blocks, 1 << 30);
  require_range("max_blocks_per_seq", max_blocks_per_seq, 1 << 30);
  require_grouped_heads(heads_q, heads_kv);
  if (block_size < 1 || block_size > 1024 || (block_size & (block_size - 1)) != 0) {
    std::ostringstream msg;
    msg << "block_size must be a power of two from 1 to 1024, got " << block_size;
    throw std::invalid_argument(msg.str());
  }
  if (max_context < 0 || int64_t(max_context) > int64_t(max_blocks_per_seq) * block_size || max_context > kMaxSeq) {
    std::ostringstream msg;
    msg << "max_context must be between 0 and max_blocks_per_seq * block_size ("
        << int64_t(max_blocks_per_seq) * block_size << ", at most " << kMaxSeq << "), got " << max_context;
    throw std::invalid_argument(msg.str());
  }
}

AttentionShape DecodeShape::output_layout() const {
  AttentionShape s;
  s.batch = num_seqs;
  s.heads_q = heads_q;
  s.heads_kv = heads_kv;
  s.seq_q = query_len;
  s.seq_kv = max_context > 0 ? max_context : 1;
  s.head_dim = head_dim;
  s.causal = true;
  return s;
}

std::string DecodeShape::to_string() const {
  std::ostringstream s;
  s << "s" << num_seqs << " h" << heads_q << "/" << heads_kv << " q" << query_len << " ctx<=" << max_context << " d"
    << head_dim << " bs" << block_size;
  return s.str();
}

std::string DecodeShape::to_identifier() const {
  std::ostringstream s;
  s << "s" << num_seqs << "_h" << heads_q << "_kv" << heads_kv << "_q" << query_len << "_ctx" << max_context << "_d"
    << head_dim << "_bs" << block_size;
  return s.str();
}

std::string head_dim_reason(int head_dim, std::initializer_list<int> allowed) {
  if (std::find(allowed.begin(), allowed.end(), head_dim) != allowed.end()) return "";
  std::ostringstream msg;
  msg << "head_dim must be ";
  size_t i = 0;
  for (const int d : allowed) {
    if (i > 0) msg << (i + 1 == allowed.size() ? " or " : ", ");
    msg << d;
    ++i;
  }
  msg << ", got " << head_dim;
  return msg.str();
}

}  // namespace fa
