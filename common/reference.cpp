#include "reference.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "random.h"

namespace fa {

namespace {

using MatrixD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixFMap = Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

int64_t head_offset(const AttentionShape& s, int batch, int head, int heads, int seq) {
  return ((int64_t(batch) * heads + head) * seq) * s.head_dim;
}

/// One sequence as the oracle sees it: a dense shape (batch 1) and where its rows
/// start in Q, K, V, the bias and LSE. A dense batch is one such sequence per (batch, head).
struct Sequence {
  AttentionShape shape;
  AttentionFeatures features;  // the problem's, with no packing
  int head = 0;
  double slope = 0;                                      // ALiBi's, when features.alibi
  const float *q = nullptr, *k = nullptr, *v = nullptr;  // row 0 of this head's Q, K, V
  const float* bias = nullptr;                           // [seq_q][seq_kv] of this head, or null
  int64_t q_row0 = 0;  // index of row 0 in the full [batch, heads_q, seq_q] row numbering
};

/// ALiBi's slope of head `head` in sequence (or batch) b: the caller's, else the paper's in double.
double caller_slope_or_paper(const AttentionShape& s, const AttentionExtras* extras, int b, int head) {
  if (extras && extras->alibi_slopes) return extras->alibi_slope(s, b, head);
  return AttentionFeatures::alibi_slope(s.heads_q, head);
}

Sequence dense_sequence(const AttentionShape& s, const AttentionFeatures& f, const AttentionExtras* extras,
                        const float* q, const float* k, const float* v, int batch, int head) {
  Sequence seq;
  seq.shape = sequence_shape(s, s.seq_q, s.seq_kv);
  seq.features = f;
  seq.head = head;
  seq.slope = caller_slope_or_paper(s, extras, batch, head);
  seq.q = q + head_offset(s, batch, head, s.heads_q, s.seq_q);
  seq.k = k + head_offset(s, batch, s.kv_head(head), s.heads_kv, s.seq_kv);
  seq.v = v + head_offset(s, batch, s.kv_head(head), s.heads_kv, s.seq_kv);
  if (f.bias) {
    if (!extras || !extras->bias) throw std::invalid_argument("the oracle: features.bias is on but no bias was given");
    seq.bias = extras->bias + (int64_t(batch) * s.heads_q + head) * s.seq_q * s.seq_kv;
  }
  seq.q_row0 = (int64_t(batch) * s.heads_q + head) * s.seq_q;
  return seq;
}

/// Sequence `index` of a packed batch, for query head `head`.
Sequence packed_sequence(const AttentionShape& s, const AttentionFeatures& f, const AttentionExtras& extras,
                         const float* q, const float* k, const float* v, int index, int head) {
  const int q0 = extras.cu_seqlens_q[index], k0 = extras.cu_seqlens_k[index];
  Sequence seq;
  seq.shape = sequence_shape(s, extras.cu_seqlens_q[index + 1] - q0, extras.cu_seqlens_k[index + 1] - k0);
  seq.features = f;
  seq.features.sequences = 0;
  seq.head = head;
  seq.slope = caller_slope_or_paper(s, &extras, index, head);
  seq.q = q + (int64_t(head) * s.seq_q + q0) * s.head_dim;
  seq.k = k + (int64_t(s.kv_head(head)) * s.seq_kv + k0) * s.head_dim;
  seq.v = v + (int64_t(s.kv_head(head)) * s.seq_kv + k0) * s.head_dim;
  seq.q_row0 = int64_t(head) * s.seq_q + q0;
  return seq;
}

/// Throws unless cu_seqlens_q/_k run from 0 to seq_q/seq_kv without going down.
void check_packed(const AttentionShape& s, const AttentionFeatures& f, const AttentionExtras* extras) {
  if (!extras || !extras->cu_seqlens_q || !extras->cu_seqlens_k)
    throw std::invalid_argument("the oracle: a packed batch needs its cu_seqlens");
  for (const auto& [name, cu, total] :
       {std::tuple<const char*, const int*, int>{"cu_seqlens_q", extras->cu_seqlens_q, s.seq_q},
        {"cu_seqlens_k", extras->cu_seqlens_k, s.seq_kv}}) {
    bool ok = cu[0] == 0 && cu[f.sequences] == total;
    for (int b = 0; b < f.sequences; ++b) ok = ok && cu[b + 1] >= cu[b];
    if (!ok)
      throw std::invalid_argument(std::string("the oracle: ") + name + " must rise from 0 to " + std::to_string(total) +
                                  " in " + std::to_string(f.sequences + 1) + " entries");
  }
}

/// The [rows, head_dim] matrix of the given rows, in double.
MatrixD gather_rows(const float* base, int head_dim, const std::vector<int>& rows) {
  MatrixD out(rows.size(), head_dim);
  for (size_t r = 0; r < rows.size(); ++r) {
    for (int c = 0; c < head_dim; ++c) out(Eigen::Index(r), c) = base[int64_t(rows[r]) * head_dim + c];
  }
  return out;
}

/// Scaled scores of `rows` against every key of the sequence, with softcap, ALiBi and the bias
/// applied. `capped` (when not null) receives tanh(x / softcap) for the backward.
MatrixD modified_scores(const Sequence& seq, const std::vector<int>& rows, MatrixD* capped = nullptr) {
  const AttentionShape& s = seq.shape;
  const AttentionFeatures& f = seq.features;
  MatrixD keys = MatrixFMap(seq.k, s.seq_kv, s.head_dim).cast<double>();
  MatrixD scores = (gather_rows(seq.q, s.head_dim, rows) * keys.transpose()) * s.softmax_scale();
  if (capped) *capped = MatrixD::Zero(scores.rows(), scores.cols());
  if (f.softcap > 0.0 || f.alibi || seq.bias) {
    for (Eigen::Index r = 0; r < scores.rows(); ++r)
      for (int j = 0; j < s.seq_kv; ++j) {
        double& x = scores(r, j);
        if (capped && f.softcap > 0.0) (*capped)(r, j) = std::tanh(x / f.softcap);
        x = f.modify_score(s, x, seq.slope, rows[r], j);
        if (seq.bias) x += seq.bias[int64_t(rows[r]) * s.seq_kv + j];
      }
  }
  return scores;
}

/// Turns scores into probabilities in place, row by row, masking keys the query does not see
/// (they form one run, first_visible_key(i) .. visible_keys(i) - 1). Returns per-row LSE (-inf
/// for a row that sees nothing; its probabilities are all 0).
std::vector<double> masked_softmax_rows(const Sequence& seq, const std::vector<int>& rows, MatrixD& scores) {
  const AttentionShape& s = seq.shape;
  std::vector<double> lse(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    const int first = seq.features.first_visible_key(s, rows[r]), end = seq.features.visible_keys(s, rows[r]);
    auto row = scores.row(Eigen::Index(r));
    if (end <= first) {
      row.setZero();
      lse[r] = kNegInf;
      continue;
    }
    auto seen = row.segment(first, end - first);
    const double row_max = seen.maxCoeff();
    seen = (seen.array() - row_max).exp().matrix();
    row.head(first).setZero();
    row.tail(s.seq_kv - end).setZero();
    const double sum = seen.sum();
    row /= sum;
    lse[r] = row_max + std::log(sum);
  }
  return lse;
}

}  // namespace

int64_t CheckPlan::row_count() const {
  int64_t n = 0;
  for (const auto& h : heads) n += int64_t(h.rows.size());
  return n;
}

std::string CheckPlan::describe(const AttentionShape& shape) const {
  std::ostringstream s;
  int64_t all_heads = int64_t(shape.batch) * shape.heads_q;
  if (full) {
    s << "all " << all_heads << " heads x " << shape.seq_q << " rows";
  } else {
    size_t rows = heads.empty() ? 0 : heads.front().rows.size();
    s << heads.size() << " of " << all_heads << " heads x " << rows << " of " << shape.seq_q << " rows (sampled)";
  }
  return s.str();
}

CheckPlan full_check_plan(const AttentionShape& shape) {
  CheckPlan plan;
  plan.full = true;
  std::vector<int> rows(shape.seq_q);
  std::iota(rows.begin(), rows.end(), 0);
  for (int b = 0; b < shape.batch; ++b) {
    for (int h = 0; h < shape.heads_q; ++h) plan.heads.push_back({b, h, rows});
  }
  return plan;
}

CheckPlan sampled_check_plan(const AttentionShape& shape, uint64_t seed, int max_heads, int max_rows) {
  std::mt19937_64 rng(splitmix64(seed ^ 0xC0FFEEull));
  int64_t all_heads = int64_t(shape.batch) * shape.heads_q;
  // Always the first and the last (batch, head) and the first and last row: off-by-one bugs
  // in offsets and tails live there. The rest are random so repeated runs cover more ground.
  std::vector<int64_t> picked_heads = {0, all_heads - 1};
  while (int64_t(picked_heads.size()) < std::min<int64_t>(max_heads, all_heads)) {
    int64_t h = std::uniform_int_distribution<int64_t>(0, all_heads - 1)(rng);
    if (std::find(picked_heads.begin(), picked_heads.end(), h) == picked_heads.end()) picked_heads.push_back(h);
  }
  std::sort(picked_heads.begin(), picked_heads.end());
  picked_heads.erase(std::unique(picked_heads.begin(), picked_heads.end()), picked_heads.end());

  CheckPlan plan;
  for (int64_t flat : picked_heads) {
    std::vector<int> rows = {0, shape.seq_q - 1};
    while (int(rows.size()) < std::min(max_rows, shape.seq_q)) {
      int r = std::uniform_int_distribution<int>(0, shape.seq_q - 1)(rng);
      if (std::find(rows.begin(), rows.end(), r) == rows.end()) rows.push_back(r);
    }
    std::sort(rows.begin(), rows.end());
    rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
    plan.heads.push_back({int(flat / shape.heads_q), int(flat % shape.heads_q), rows});
  }
  return plan;
}

CheckPlan choose_check_plan(const AttentionShape& shape, uint64_t seed) {
  double work = double(shape.score_elems()) * shape.head_dim;
  if (work <= double(1ll << 29)) return full_check_plan(shape);
  return sampled_check_plan(shape, seed);
}

ForwardReference reference_forward(const AttentionShape& s, const float* q, const float* k, const float* v,
                                   const CheckPlan& plan, const AttentionFeatures& f, const AttentionExtras* extras) {
  s.validate();
  f.validate(s);
  if (f.varlen()) check_packed(s, f, extras);
  ForwardReference ref;
  ref.o.reserve(plan.heads.size());
  ref.lse.reserve(plan.heads.size());
  for (const HeadRows& entry : plan.heads) {
    std::vector<double> o(entry.rows.size() * s.head_dim), lse(entry.rows.size());
    // The entry's rows, a run per sequence: one run in a dense batch.
    size_t r = 0;
    while (r < entry.rows.size()) {
      Sequence seq;
      size_t run_end = entry.rows.size();
      std::vector<int> local;
      if (f.varlen()) {
        const int* cu = extras->cu_seqlens_q;
        const int index = int(std::upper_bound(cu, cu + f.sequences + 1, entry.rows[r]) - cu) - 1;
        seq = packed_sequence(s, f, *extras, q, k, v, index, entry.head);
        run_end = r;
        while (run_end < entry.rows.size() && entry.rows[run_end] < cu[index + 1])
          local.push_back(entry.rows[run_end++] - cu[index]);
      } else {
        seq = dense_sequence(s, f, extras, q, k, v, entry.batch, entry.head);
        local = entry.rows;
      }
      MatrixD p = modified_scores(seq, local);
      const std::vector<double> run_lse = masked_softmax_rows(seq, local, p);
      const MatrixD out = p * MatrixFMap(seq.v, seq.shape.seq_kv, s.head_dim).cast<double>();
      std::copy(out.data(), out.data() + out.size(), o.begin() + int64_t(r) * s.head_dim);
      std::copy(run_lse.begin(), run_lse.end(), lse.begin() + int64_t(r));
      r = run_end;
    }
    ref.o.push_back(std::move(o));
    ref.lse.push_back(std::move(lse));
  }
  return ref;
}

BackwardReference reference_backward(const AttentionShape& s, const float* q, const float* k, const float* v,
                                     const float* d_out, const AttentionFeatures& f, const AttentionExtras* extras) {
  s.validate();
  f.validate(s);
  if (f.varlen()) check_packed(s, f, extras);
  BackwardReference ref;
  ref.o.assign(s.q_elems(), 0.0);
  ref.lse.assign(s.lse_elems(), 0.0);
  ref.dq.assign(s.q_elems(), 0.0);
  ref.dk.assign(s.kv_elems(), 0.0);
  ref.dv.assign(s.kv_elems(), 0.0);
  const double scale = s.softmax_scale();
  for (int b = 0; b < f.sequence_count(s); ++b) {
    for (int h = 0; h < s.heads_q; ++h) {
      const Sequence seq =
          f.varlen() ? packed_sequence(s, f, *extras, q, k, v, b, h) : dense_sequence(s, f, extras, q, k, v, b, h);
      const AttentionShape& one = seq.shape;
      std::vector<int> rows(one.seq_q);
      std::iota(rows.begin(), rows.end(), 0);
      const int64_t q_off = seq.q - q, kv_off = seq.k - k;
      MatrixD qm = gather_rows(seq.q, s.head_dim, rows);
      MatrixD dom = gather_rows(d_out + q_off, s.head_dim, rows);
      MatrixD km = MatrixFMap(seq.k, one.seq_kv, s.head_dim).cast<double>();
      MatrixD vm = MatrixFMap(seq.v, one.seq_kv, s.head_dim).cast<double>();
      MatrixD capped;
      MatrixD p = modified_scores(seq, rows, &capped);
      std::vector<double> lse = masked_softmax_rows(seq, rows, p);
      MatrixD o = p * vm;
      // D_i = sum_c dO_ic O_ic equals sum_j P_ij dP_ij, the softmax Jacobian's correction term.
      Eigen::VectorXd d = (dom.array() * o.array()).rowwise().sum().matrix();
      MatrixD dp = dom * vm.transpose();
      MatrixD ds = (p.array() * (dp.colwise() - d).array()).matrix();
      // ALiBi and the bias add constants: their derivative is 1. The softcap's is 1 - tanh^2.
      if (f.softcap > 0.0) ds = (ds.array() * (1.0 - capped.array().square())).matrix();
      MatrixD dq = ds * km * scale;
      MatrixD dk = ds.transpose() * qm * scale;
      MatrixD dv = p.transpose() * dom;

      std::copy(o.data(), o.data() + o.size(), ref.o.begin() + q_off);
      std::copy(dq.data(), dq.data() + dq.size(), ref.dq.begin() + q_off);
      std::copy(lse.begin(), lse.end(), ref.lse.begin() + seq.q_row0);
      for (int64_t i = 0; i < dk.size(); ++i) {
        ref.dk[kv_off + i] += dk.data()[i];
        ref.dv[kv_off + i] += dv.data()[i];
      }
    }
  }
  return ref;
}

DecodeReference reference_paged_decode(const PagedKvView& cache, int heads_q, const float* q,
                                       const std::vector<std::vector<int>>& block_tables,
                                       const std::vector<int>& context_lens, int query_len) {
  if (query_len < 1)
    throw std::invalid_argument("reference_paged_decode: query_len must be >= 1, got " + std::to_string(query_len));
  if (block_tables.size() != context_lens.size())
    throw std::invalid_argument("reference_paged_decode: " + std::to_string(block_tables.size()) +
                                " block tables for " + std::to_string(context_lens.size()) + " context lengths");
  const int d = cache.head_dim, seqs = int(context_lens.size());
  DecodeReference ref;
  const std::size_t rows = std::size_t(heads_q) * query_len;  // per sequence
  ref.o.assign(seqs * rows * d, 0.0);
  ref.lse.assign(seqs * rows, -std::numeric_limits<double>::infinity());
  for (int s = 0; s < seqs; ++s) {
    const int len = context_lens[s];
    if (len == 0) continue;
    if (int64_t(block_tables[s].size()) * cache.block_size < len)
      throw std::invalid_argument("reference_paged_decode: sequence " + std::to_string(s) + " has " +
                                  std::to_string(len) + " tokens but " + std::to_string(block_tables[s].size()) +
                                  " blocks");
    AttentionShape shape;
    shape.heads_q = heads_q;
    shape.heads_kv = cache.heads_kv;
    shape.seq_q = query_len;
    shape.seq_kv = len;
    shape.causal = query_len > 1;
    shape.head_dim = d;
    // This sequence's K and V, gathered into the oracle's [1, heads_kv, len, d] layout.
    std::vector<float> k(std::size_t(cache.heads_kv) * len * d), v(k.size());
    for (int h = 0; h < cache.heads_kv; ++h)
      for (int t = 0; t < len; ++t) {
        const int64_t from = cache.row_offset(block_tables[s][t / cache.block_size], h, t % cache.block_size);
        const std::size_t to = (std::size_t(h) * len + t) * d;
        std::copy(cache.k + from, cache.k + from + d, k.begin() + to);
        std::copy(cache.v + from, cache.v + from + d, v.begin() + to);
      }
    const ForwardReference r = reference_forward(shape, q + s * rows * d, k.data(), v.data(), full_check_plan(shape));
    for (int h = 0; h < heads_q; ++h) {  // the full plan is ordered by head, then row
      std::copy(r.o[h].begin(), r.o[h].end(), ref.o.begin() + (s * rows + std::size_t(h) * query_len) * d);
      std::copy(r.lse[h].begin(), r.lse[h].end(), ref.lse.begin() + s * rows + std::size_t(h) * query_len);
    }
  }
  return ref;
}

}  // namespace fa
