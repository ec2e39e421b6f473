// The checker's answers to the step cases (classroom/grader/answers.h), in fp64: the instructor's
// alone. The student copy leaves this folder out, so none of these lines reaches a student.
#include "../grader/answers.h"

#include <algorithm>
#include <cmath>

namespace fa::grader {

bool answers_available() { return true; }

void online_update_answer(float m, float l, float score, double& m_new, double& l_new) {
  m_new = std::max(double(m), double(score));
  l_new = l;
  if (m_new != -INFINITY) l_new = double(l) * std::exp(double(m) - m_new) + std::exp(double(score) - m_new);
  if (m == -INFINITY && score == -INFINITY) l_new = 0.0;
}

void row_step_answer(const float* st, const float* sc, const float* v, int cols, int d, bool normalized, double* w) {
  float tile_max = -INFINITY;
  for (int j = 0; j < cols; ++j) tile_max = std::fmax(tile_max, sc[j]);
  const double m = st[0], m_new = std::max(m, double(tile_max));
  for (int e = 0; e < 2 + d; ++e) w[e] = st[e];
  if (m_new == -INFINITY) return;
  const double kept = m == -INFINITY ? 0.0 : std::exp(m - m_new);
  double sum = 0;
  std::vector<double> pv(std::size_t(d), 0.0);
  for (int j = 0; j < cols; ++j) {
    if (sc[j] == -INFINITY) continue;
    const double p = std::exp(double(sc[j]) - m_new);
    sum += p;
    for (int e = 0; e < d; ++e) pv[std::size_t(e)] += p * v[std::size_t(j) * d + e];
  }
  const double l_new = double(st[1]) * kept + sum;
  w[0] = m_new;
  w[1] = l_new;
  for (int e = 0; e < d; ++e)
    w[2 + e] = normalized ? (double(st[1]) * kept * st[2 + e] + pv[std::size_t(e)]) / l_new
                          : st[2 + e] * kept + pv[std::size_t(e)];
}

/// dS = P (dO V^T - D), dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO (summed over a K/V
/// head's query heads), with P = exp(scale q k - LSE) from the LSE given.
Gradients recomputed_gradients(const AttentionShape& s, const std::vector<float>& q, const std::vector<float>& k,
                               const std::vector<float>& v, const std::vector<float>& o, const std::vector<float>& lse,
                               const std::vector<float>& d_o) {
  const int d = s.head_dim;
  const double scale = s.softmax_scale();
  Gradients g{std::vector<double>(q.size()), std::vector<double>(k.size()), std::vector<double>(v.size())};
  std::vector<double> ds(std::size_t(s.seq_kv));
  for (int bh = 0; bh < s.batch * s.heads_q; ++bh) {
    const int64_t qo = s.q_head_offset(bh), ko = s.kv_head_offset(bh);
    for (int i = 0; i < s.seq_q; ++i) {
      const float row_lse = lse[std::size_t(int64_t(bh) * s.seq_q + i)];
      if (row_lse == -INFINITY) continue;
      const float* qi = &q[std::size_t(qo + int64_t(i) * d)];
      const float* doi = &d_o[std::size_t(qo + int64_t(i) * d)];
      const float* oi = &o[std::size_t(qo + int64_t(i) * d)];
      double delta = 0;
      for (int x = 0; x < d; ++x) delta += double(doi[x]) * oi[x];
      for (int j = 0; j < s.seq_kv; ++j) {
        ds[std::size_t(j)] = 0;
        if (!s.visible(i, j)) continue;
        const float* kj = &k[std::size_t(ko + int64_t(j) * d)];
        const float* vj = &v[std::size_t(ko + int64_t(j) * d)];
        double dot = 0, dp = 0;
        for (int x = 0; x < d; ++x) {
          dot += double(qi[x]) * kj[x];
          dp += double(doi[x]) * vj[x];
        }
        const double pij = std::exp(dot * scale - double(row_lse));
        ds[std::size_t(j)] = pij * (dp - delta);
        double* dvj = &g.dv[std::size_t(ko + int64_t(j) * d)];
        for (int x = 0; x < d; ++x) dvj[x] += pij * doi[x];
      }
      double* dqi = &g.dq[std::size_t(qo + int64_t(i) * d)];
      for (int j = 0; j < s.seq_kv; ++j) {
        const double dsij = ds[std::size_t(j)] * scale;
        if (dsij == 0) continue;
        const float* kj = &k[std::size_t(ko + int64_t(j) * d)];
        double* dkj = &g.dk[std::size_t(ko + int64_t(j) * d)];
        for (int x = 0; x < d; ++x) {
          dqi[x] += dsij * kj[x];
          dkj[x] += dsij * qi[x];
        }
      }
    }
  }
  return g;
}

/// LSE = top + log sum exp(LSE_p - top), O = sum exp(LSE_p - LSE) O_p.
void merge_answer(const std::vector<float>& lse, const std::vector<float>& o, int parts, int d,
                  std::vector<double>& want, double& total) {
  double top = -INFINITY;
  for (float x : lse) top = std::max(top, double(x));
  double sum = 0;
  for (float x : lse) sum += x == -INFINITY ? 0.0 : std::exp(double(x) - top);
  total = parts == 0 || top == -INFINITY ? -INFINITY : top + std::log(sum);
  want.assign(std::size_t(d), 0.0);
  for (int p = 0; p < parts && total != -INFINITY; ++p)
    for (int x = 0; x < d; ++x)
      want[std::size_t(x)] += std::exp(double(lse[std::size_t(p)]) - total) * o[std::size_t(p) * d + x];
}

void tile_answer(const WindowMask& mask, int first, int last, int tile, int j0, int j1, int out[4]) {
  out[0] = mask.keys(first).begin / tile * tile;
  out[1] = mask.keys(last).end;
  int begin = 0;
  while (begin < mask.seq_q && !(mask.visible_keys(begin) > j0)) ++begin;
  int end = begin;
  while (end < mask.seq_q && !(mask.first_visible_key(end) >= j1)) ++end;
  out[2] = begin;
  out[3] = end;
}

}  // namespace fa::grader
