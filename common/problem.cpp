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
}

double AttentionShape::forward_flops() const {
  const double flops = 4.0 * batch * heads_q * double(seq_q) * seq_kv * head_dim;
  return causal ? flops / 2 : flops;
}

double AttentionShape::forward_min_bytes(int element_bytes) const {
  double qo = 2.0 * double(q_elems()) * element_bytes;
  double kv = 2.0 * double(kv_elems()) * element_bytes;
  return qo + kv + 4.0 * double(lse_elems());
}

std::string AttentionShape::to_string() const {
  std::ostringstream s;
  s << "b" << batch << " h" << heads_q << "/" << heads_kv << " q" << seq_q << " k" << seq_kv << " d" << head_dim
    << (causal ? " causal" : "");
  if (scale > 0.0) s << " scale" << scale;
  return s.str();
}

std::string AttentionShape::to_identifier() const {
  std::ostringstream s;
  s << "b" << batch << "_h" << heads_q << "_kv" << heads_kv << "_q" << seq_q << "_k" << seq_kv << "_d" << head_dim
    << (causal ? "_causal" : "_full");
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
