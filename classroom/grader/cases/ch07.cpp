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

#include "../answers.h"
#include "../cases.h"
#include "reference.h"

namespace fa::grader {
namespace {

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
  // Unshifted, the oracle's gradients; shifted, the recomputation from the LSE given (answers.h).
  const Gradients want = shift_lse ? recomputed_gradients(s, q, k, v, o, lse, d_o) : Gradients{ref.dq, ref.dk, ref.dv};
  c.from_answers = shift_lse;
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
