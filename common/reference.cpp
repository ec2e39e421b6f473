#include "reference.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>

#include "random.h"

namespace fa {

namespace {

using MatrixD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixFMap = Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

int64_t head_offset(const AttentionShape& s, int batch, int head, int heads, int seq) {
  return ((int64_t(batch) * heads + head) * seq) * s.head_dim;
}

/// The [seq_kv, head_dim] K or V matrix that query head `head` of `batch` reads, in double.
MatrixD kv_matrix(const AttentionShape& s, const float* base, int batch, int head) {
  const float* p = base + head_offset(s, batch, s.kv_head(head), s.heads_kv, s.seq_kv);
  return MatrixFMap(p, s.seq_kv, s.head_dim).cast<double>();
}

/// Turns scaled scores into probabilities in place, row by row, masking keys the query does not
/// see. Returns per-row LSE (-inf for a row that sees nothing; its probabilities are all 0).
std::vector<double> masked_softmax_rows(const AttentionShape& s, const std::vector<int>& rows, MatrixD& scores) {
  std::vector<double> lse(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    // Keys 0..visible-1 are visible: the causal boundary, clamped to [0, seq_kv].
    int64_t visible = s.causal ? std::clamp<int64_t>(int64_t(rows[r]) + s.causal_offset() + 1, 0, s.seq_kv) : s.seq_kv;
    auto row = scores.row(Eigen::Index(r));
    if (visible == 0) {
      row.setZero();
      lse[r] = kNegInf;
      continue;
    }
    double row_max = row.head(visible).maxCoeff();
    row.head(visible) = (row.head(visible).array() - row_max).exp().matrix();
    row.tail(s.seq_kv - visible).setZero();
    double sum = row.sum();
    row /= sum;
    lse[r] = row_max + std::log(sum);
  }
  return lse;
}

MatrixD gather_rows(const AttentionShape& s, const float* q, int batch, int head, const std::vector<int>& rows) {
  const float* base = q + head_offset(s, batch, head, s.heads_q, s.seq_q);
  MatrixD out(rows.size(), s.head_dim);
  for (size_t r = 0; r < rows.size(); ++r) {
    for (int c = 0; c < s.head_dim; ++c) out(Eigen::Index(r), c) = base[int64_t(rows[r]) * s.head_dim + c];
  }
  return out;
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
                                   const CheckPlan& plan) {
  s.validate();
  ForwardReference ref;
  ref.o.reserve(plan.heads.size());
  ref.lse.reserve(plan.heads.size());
  for (const HeadRows& entry : plan.heads) {
    MatrixD q_rows = gather_rows(s, q, entry.batch, entry.head, entry.rows);
    MatrixD keys = kv_matrix(s, k, entry.batch, entry.head);
    MatrixD values = kv_matrix(s, v, entry.batch, entry.head);
    MatrixD scores = (q_rows * keys.transpose()) * s.softmax_scale();
    ref.lse.push_back(masked_softmax_rows(s, entry.rows, scores));
    MatrixD out = scores * values;
    ref.o.emplace_back(out.data(), out.data() + out.size());
  }
  return ref;
}

BackwardReference reference_backward(const AttentionShape& s, const float* q, const float* k, const float* v,
                                     const float* d_out) {
  s.validate();
  BackwardReference ref;
  ref.o.assign(s.q_elems(), 0.0);
  ref.lse.assign(s.lse_elems(), 0.0);
  ref.dq.assign(s.q_elems(), 0.0);
  ref.dk.assign(s.kv_elems(), 0.0);
  ref.dv.assign(s.kv_elems(), 0.0);
  std::vector<int> rows(s.seq_q);
  std::iota(rows.begin(), rows.end(), 0);
  const double scale = s.softmax_scale();
  for (int b = 0; b < s.batch; ++b) {
    for (int h = 0; h < s.heads_q; ++h) {
      MatrixD qm = gather_rows(s, q, b, h, rows);
      MatrixD dom = gather_rows(s, d_out, b, h, rows);
      MatrixD km = kv_matrix(s, k, b, h);
      MatrixD vm = kv_matrix(s, v, b, h);
      MatrixD p = (qm * km.transpose()) * scale;
      std::vector<double> lse = masked_softmax_rows(s, rows, p);
      MatrixD o = p * vm;
      // D_i = sum_c dO_ic O_ic equals sum_j P_ij dP_ij, the softmax Jacobian's correction term.
      Eigen::VectorXd d = (dom.array() * o.array()).rowwise().sum().matrix();
      MatrixD dp = dom * vm.transpose();
      MatrixD ds = (p.array() * (dp.colwise() - d).array()).matrix();
      MatrixD dq = ds * km * scale;
      MatrixD dk = ds.transpose() * qm * scale;
      MatrixD dv = p.transpose() * dom;

      int64_t qoff = head_offset(s, b, h, s.heads_q, s.seq_q);
      int64_t kvoff = head_offset(s, b, s.kv_head(h), s.heads_kv, s.seq_kv);
      std::copy(o.data(), o.data() + o.size(), ref.o.begin() + qoff);
      std::copy(dq.data(), dq.data() + dq.size(), ref.dq.begin() + qoff);
      std::copy(lse.begin(), lse.end(), ref.lse.begin() + (int64_t(b) * s.heads_q + h) * s.seq_q);
      for (int64_t i = 0; i < dk.size(); ++i) {
        ref.dk[kvoff + i] += dk.data()[i];
        ref.dv[kvoff + i] += dv.data()[i];
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
