// The checker's cases for chapter 07's exercises: the backward pass (dQ, dK, dV) on the CPU and in
// the fp32 kernel. The exercise is P recomputed from the saved LSE, so the cases hand the code an
// LSE shifted row by row (by up to +-0.5) from the true one: the expected gradients are those of
// P = exp(scale q.k - LSE) with that LSE (computed here in fp64), which an answer that normalizes
// each row itself, ignoring the LSE, does not give. The trivial case keeps the true LSE.
#include <cmath>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "../cases.h"
#include "reference.h"

namespace fa::grader {
namespace {

/// dQ, dK, dV in fp64 for the loss sum(O * dO) by the recomputation the chapter teaches, from the
/// O and LSE it is given: P = exp(scale S - LSE) where visible, D = rowsum(dO * O),
/// dS = P (dO V^T - D), dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO (summed over a K/V
/// head's query heads).
struct Gradients {
  std::vector<double> dq, dk, dv;
};
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

Case backward_case(Rng& rng, const AttentionShape& s, const std::string& kernel, DType dtype, double weight,
                   bool shift_lse) {
  Case c;
  c.header.task = "backward";
  if (!kernel.empty()) c.header.args["kernel"] = kernel;
  put_shape(c.header, s);
  c.name =
      (kernel.empty() ? std::string("backward") : kernel) + " " + s.to_string() + (shift_lse ? ", LSE shifted" : "");
  c.weight = weight;
  const std::vector<float> q = rounded(normal(rng, s.q_elems()), dtype), k = rounded(normal(rng, s.kv_elems()), dtype),
                           v = rounded(normal(rng, s.kv_elems()), dtype),
                           d_o = rounded(normal(rng, s.q_elems()), dtype);
  const BackwardReference ref = reference_backward(s, q.data(), k.data(), v.data(), d_o.data());
  std::vector<float> o(ref.o.begin(), ref.o.end()), lse(ref.lse.begin(), ref.lse.end());
  o = rounded(o, dtype);
  if (shift_lse) {
    std::uniform_real_distribution<float> shift(-0.5f, 0.5f);
    for (float& x : lse)
      if (x != -INFINITY) x += shift(rng);
  }
  const Gradients want = recomputed_gradients(s, q, k, v, o, lse, d_o);
  c.input = q;
  for (const std::vector<float>* part : std::initializer_list<const std::vector<float>*>{&k, &v, &o, &lse, &d_o})
    c.input.insert(c.input.end(), part->begin(), part->end());
  c.expect_values = std::size_t(s.q_elems() + 2 * s.kv_elems());
  const double tol = dtype == DType::F32 ? 2e-4 : 2e-2;
  c.judge = [=](const std::vector<float>& out) -> std::string {
    const std::size_t nq = s.q_elems(), nk = s.kv_elems();
    std::string why = close_enough("dQ", out.data(), want.dq.data(), nq, tol);
    if (why.empty()) why = close_enough("dK", out.data() + nq, want.dk.data(), nk, tol);
    if (why.empty()) why = close_enough("dV", out.data() + nq + nk, want.dv.data(), nk, tol);
    return why;
  };
  return c;
}

std::vector<Case> backward_cases(Rng& rng, const std::string& kernel, DType dtype, const std::vector<int>& dims) {
  std::vector<Case> cases;
  AttentionShape one;
  one.head_dim = dims.front();
  cases.push_back(backward_case(rng, one, kernel, dtype, 0, false));
  for (int i = 0; i < 4; ++i)
    cases.push_back(backward_case(rng, draw_shape(rng, 65, 200, dims), kernel, dtype, 1, true));
  return cases;
}

std::vector<Case> ds_cpu_cases(Rng& rng) { return backward_cases(rng, "", DType::F32, {16, 32, 64}); }

std::vector<Case> ds_cases(Rng& rng) { return backward_cases(rng, "ch07_fp32", DType::F32, {32, 64, 128}); }

}  // namespace

FA_EXERCISE_CASES("ch07_ds_cpu", ds_cpu_cases);
FA_EXERCISE_CASES("ch07_ds", ds_cases);

}  // namespace fa::grader
