// The checker's case machinery (cases.h): drawing inputs, judging answers against the oracle,
// the cases several chapters share, and the registry of exercise generators.
#include "cases.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "answers.h"
#include "compare.h"
#include "reference.h"

namespace fa::grader {

// ---- the registry ----------------------------------------------------------------------------

std::vector<ExerciseCases>& exercise_registry() {
  static std::vector<ExerciseCases> all;  // built before main, one entry per FA_EXERCISE_CASES
  return all;
}

RegisterExerciseCases::RegisterExerciseCases(const char* id, CaseMaker make, Answers answers) {
  exercise_registry().push_back({id, make, answers});
}

const ExerciseCases& find_exercise_cases(const std::string& id) {
  std::string known;
  for (const ExerciseCases& e : exercise_registry()) {
    if (e.id == id) return e;
    known += (known.empty() ? "" : ", ") + e.id;
  }
  throw std::runtime_error("the checker knows no exercise '" + id + "' (known: " + known +
                           "); register its cases with FA_EXERCISE_CASES in classroom/grader/cases/chNN.cpp");
}

// ---- drawing inputs --------------------------------------------------------------------------

int uniform(Rng& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }

std::vector<float> normal(Rng& rng, std::size_t n, float sigma) {
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<float> rounded(std::vector<float> v, DType dtype) {
  for (auto& x : v) x = round_to_dtype(x, dtype);
  return v;
}

AttentionShape draw_shape(Rng& rng, int lo, int hi, const std::vector<int>& dims, int max_batch) {
  AttentionShape s;
  s.batch = uniform(rng, 1, max_batch);
  s.heads_kv = uniform(rng, 1, 2);
  s.heads_q = s.heads_kv * uniform(rng, 1, 3);
  s.seq_q = uniform(rng, lo, hi);
  s.seq_kv = uniform(rng, 0, 3) == 0 ? s.seq_q : uniform(rng, lo, hi);
  s.head_dim = dims[std::size_t(uniform(rng, 0, int(dims.size()) - 1))];
  s.causal = uniform(rng, 0, 1) == 1;
  return s;
}

AttentionShape big_shape(int heads, int seq, int d) {
  AttentionShape s;
  s.heads_q = s.heads_kv = heads;
  s.seq_q = s.seq_kv = seq;
  s.head_dim = d;
  return s;
}

std::vector<float> softmax_rows(Rng& rng, int rows, int n) {
  std::vector<float> x = normal(rng, std::size_t(rows) * n, 3.0f);
  for (int r = 0; r < rows; ++r) {
    float* row = x.data() + std::size_t(r) * n;
    const int kind = r % 4;
    if (kind == 1) {
      const float shift = float(uniform(rng, -10000, 10000));
      for (int j = 0; j < n; ++j) row[j] += shift;
    } else if (kind == 2) {
      for (int j = 0; j < n; ++j)
        if (uniform(rng, 0, 2) == 0) row[j] = -INFINITY;
    } else if (kind == 3 && r % 8 == 3) {
      for (int j = 0; j < n; ++j) row[j] = -INFINITY;
    }
    if (kind == 0 && n > 8) {  // the max arrives late: every earlier term must be rescaled
      for (int j = 0; j < n; ++j) row[j] = float(j) * 0.05f + row[j] * 0.1f;
    }
  }
  return x;
}

// ---- judging ---------------------------------------------------------------------------------

std::string fmt(double x) {
  std::ostringstream os;
  os.precision(4);
  os << x;
  return os.str();
}

Judge judge_forward(const AttentionShape& s, std::vector<float> q, std::vector<float> k, std::vector<float> v,
                    DType dtype, uint64_t sample_seed) {
  return [=](const std::vector<float>& out) -> std::string {
    // Every row, or (for a speed case's large shape) rows drawn from sample_seed.
    const CheckPlan plan = sample_seed ? sampled_check_plan(s, sample_seed) : full_check_plan(s);
    const ForwardReference ref = reference_forward(s, q.data(), k.data(), v.data(), plan);
    std::vector<unsigned char> o_raw(std::size_t(s.q_elems()) * sizeof(float));
    std::memcpy(o_raw.data(), out.data(), o_raw.size());
    const std::vector<float> lse(out.begin() + s.q_elems(), out.end());
    const Tolerance tol = tolerance_for(dtype);
    const CompareReport rep = compare_forward(s, DType::F32, o_raw, lse, plan, ref, &tol);
    return rep.passed() ? "" : rep.summary();
  };
}

std::string close_enough(const char* what, const float* got, const double* want, std::size_t n, double tol) {
  double err = 0, norm = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) return std::string(what) + "[" + std::to_string(i) + "] is not finite";
    err += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  // Relative to the expected values, but an expected tensor of root-mean-square below 1e-3 counts as
  // that size: a gradient that is zero in exact arithmetic (one key: dS = 0) is met by rounding.
  const double rel = std::sqrt(err / std::max(norm, 1e-6 * double(n)));
  return rel <= tol ? "" : std::string(what) + ": relative error " + fmt(rel) + " > " + fmt(tol);
}

void exact_state(const float* row, int n, double& m, double& l) {
  m = -INFINITY;
  for (int j = 0; j < n; ++j) m = std::max(m, double(row[j]));
  l = 0;
  if (m == -INFINITY) return;
  for (int j = 0; j < n; ++j) l += std::exp(double(row[j]) - m);
}

std::string judge_state(float m, float l, double m_ref, double l_ref, const std::string& where) {
  if (m_ref == -INFINITY) {
    if (!(m == -INFINITY && l == 0.0f))
      return where + ": a row with no visible score must stay (m, l) = (-inf, 0), got (" + fmt(m) + ", " + fmt(l) + ")";
    return "";
  }
  if (double(m) != m_ref) return where + ": m = " + fmt(m) + ", the row's max is " + fmt(m_ref);
  if (!std::isfinite(l) || std::fabs(l - l_ref) > 2e-5 * l_ref)
    return where + ": l = " + fmt(l) + ", expected " + fmt(l_ref);
  return "";
}

// ---- cases several chapters share ------------------------------------------------------------

std::vector<Case> softmax_row_cases(Rng& rng, const std::string& task) {
  std::vector<Case> cases;
  const int lengths[] = {1, uniform(rng, 100, 400), uniform(rng, 900, 2100), uniform(rng, 3000, 5000)};
  for (int n : lengths) {
    Case c;
    const int rows = n == 1 ? 4 : 16;
    c.name = task + " rows=" + std::to_string(rows) + " n=" + std::to_string(n);
    c.weight = n == 1 ? 0 : 1;
    c.header.task = task;
    c.header.args = {{"rows", std::to_string(rows)}, {"n", std::to_string(n)}};
    c.input = softmax_rows(rng, rows, n);
    const std::vector<float> x = c.input;
    if (task == "safe_row") {
      c.expect_values = std::size_t(rows) * n + rows;
      c.judge = [=](const std::vector<float>& out) -> std::string {
        for (int r = 0; r < rows; ++r) {
          double m, l;
          exact_state(x.data() + std::size_t(r) * n, n, m, l);
          const float lse = out[std::size_t(rows) * n + r];
          const std::string where = "row " + std::to_string(r);
          if (m == -INFINITY) {
            if (lse != -INFINITY) return where + " (no visible score): LSE must be -inf, got " + fmt(lse);
            for (int j = 0; j < n; ++j)
              if (out[std::size_t(r) * n + j] != 0.0f) return where + " (no visible score): P must be 0";
            continue;
          }
          const double lse_ref = m + std::log(l);
          if (!(std::fabs(lse - lse_ref) <= 1e-4 * std::max(1.0, std::fabs(lse_ref))))
            return where + ": LSE = " + fmt(lse) + ", expected " + fmt(lse_ref);
          for (int j = 0; j < n; ++j) {
            const double p = std::exp(double(x[std::size_t(r) * n + j]) - lse_ref);
            const float got = out[std::size_t(r) * n + j];
            if (!(std::fabs(got - p) <= 1e-6 + 1e-4 * p))
              return where + ", entry " + std::to_string(j) + ": P = " + fmt(got) + ", expected " + fmt(p);
          }
        }
        return "";
      };
    } else {  // online_update: (m, l) per row
      c.expect_values = std::size_t(rows) * 2;
      c.judge = [=](const std::vector<float>& out) -> std::string {
        for (int r = 0; r < rows; ++r) {
          double m, l;
          exact_state(x.data() + std::size_t(r) * n, n, m, l);
          const std::string why = judge_state(out[2 * r], out[2 * r + 1], m, l, "row " + std::to_string(r));
          if (!why.empty()) return why;
        }
        return "";
      };
    }
    cases.push_back(c);
  }
  return cases;
}

Case forward_case(Rng& rng, const AttentionShape& s, const std::string& task_kernel, DType dtype, double weight,
                  const Variant& extra, double q_magnitude) {
  Case c;
  c.header.task = "forward";
  c.header.args = extra;
  put_shape(c.header, s);
  c.name = (extra.count("kernel") ? extra.at("kernel") : task_kernel) + " " + s.to_string();
  if (q_magnitude != 1) c.name += ", scores past exp's float range";
  c.weight = weight;
  std::vector<float> q = rounded(normal(rng, s.q_elems(), float(q_magnitude)), dtype),
                     k = rounded(normal(rng, s.kv_elems()), dtype), v = rounded(normal(rng, s.kv_elems()), dtype);
  c.input = q;
  c.input.insert(c.input.end(), k.begin(), k.end());
  c.input.insert(c.input.end(), v.begin(), v.end());
  c.expect_values = std::size_t(s.q_elems() + s.lse_elems());
  // The scores' rounding grows with their size. What large scores check is that the softmax
  // stays finite (an unsafe one gives inf and NaN), so they are judged at bf16's tolerance.
  c.judge = judge_forward(s, q, k, v, q_magnitude != 1 ? DType::BF16 : dtype);
  return c;
}

namespace {

/// The speed part of an exercise: one large shape, run by the reference runner (the instructor's
/// code) and the student's, each timing its own launches; it passes when the student's kernel is
/// right there too and reaches `min_speed` of the reference's speed. `weight`: the speed part's
/// share of the exercise, given the other cases' total weight. The runner scales Q by a fresh
/// factor before every timed launch and answers with one launch's outputs and its factor, so the
/// answer is judged against the oracle on Q times that factor, rounded to the kernel's dtype as
/// the runner rounds it.
Case speed_case(Rng& rng, const AttentionShape& s, const std::string& kernel, DType dtype, double weight,
                double min_speed) {
  Case c = forward_case(rng, s, "forward", dtype, weight, {{"kernel", kernel}});
  c.name = "speed: " + c.name + ", at least " + fmt(min_speed) + " of the reference solution's speed";
  c.min_speed = min_speed;
  const std::vector<float> q(c.input.begin(), c.input.begin() + s.q_elems()),
      k(c.input.begin() + s.q_elems(), c.input.begin() + s.q_elems() + s.kv_elems()),
      v(c.input.begin() + s.q_elems() + s.kv_elems(), c.input.end());
  const uint64_t sample_seed = rng() | 1;
  c.judge = judge_forward(s, q, k, v, dtype, sample_seed);
  c.judge_scaled = [=](const std::vector<float>& out, double q_scale) {
    std::vector<float> scaled(q.size());
    for (std::size_t i = 0; i < q.size(); ++i) scaled[i] = round_to_dtype(q[i] * float(q_scale), dtype);
    return judge_forward(s, scaled, k, v, dtype, sample_seed)(out);
  };
  return c;
}

/// Weight for a speed case worth `share` of an exercise whose other cases are `cases`.
double speed_weight(const std::vector<Case>& cases, double share) {
  double total = 0;
  for (const Case& c : cases) total += c.weight;
  return total * share / (1 - share);
}

}  // namespace

std::vector<Case> forward_cases(Rng& rng, const std::vector<Variant>& variants, DType dtype, int lo, int hi,
                                const std::vector<int>& dims, int n) {
  std::vector<Case> cases;
  for (const auto& extra : variants) {
    AttentionShape one;
    one.head_dim = dims.front();
    cases.push_back(forward_case(rng, one, "forward", dtype, 0, extra));
    for (int i = 0; i < n; ++i)
      cases.push_back(forward_case(rng, draw_shape(rng, lo, hi, dims), "forward", dtype, 1, extra));
  }
  return cases;
}

const char* const kUnsafeSoftmax =
    "a case with scores past exp's float range failed: the exercise teaches the form that takes the largest out "
    "first, which stays finite there";

std::vector<Case> with_large_scores(Rng& rng, std::vector<Case> cases, const std::vector<Variant>& variants,
                                    DType dtype, int lo, int hi, const std::vector<int>& dims) {
  for (const Variant& extra : variants) {
    cases.push_back(forward_case(rng, draw_shape(rng, lo, hi, dims), "forward", dtype, 1, extra, kLargeScores));
    cases.back().gates = kUnsafeSoftmax;
  }
  return cases;
}

std::vector<Case> with_speed(Rng& rng, std::vector<Case> cases, const std::string& kernel, DType dtype,
                             const AttentionShape& s, double gate) {
  // A fifth of the exercise for 0.7 of the reference solution's speed.
  const double w = speed_weight(cases, 0.2);
  cases.push_back(speed_case(rng, s, kernel, dtype, w, 0.7));
  cases.back().gate_speed = gate;
  return cases;
}

/// The row step alone, from states the checker draws (chapters 04 and 05's CPU exercises). Each
/// call starts from a state that no tile it saw produced, so only the online update itself gives
/// the answer: a step that keeps earlier tiles and recomputes, or computes the row some other way,
/// cannot. normalized: O kept divided by l (FlashAttention-1); else the unnormalized accumulator
/// (FlashAttention-2). Rows of kinds: a fresh row; a tile under the running max; a tile that
/// raises it; a fully masked tile (the state stays); a fresh row and a masked tile (stays empty);
/// scores shifted by up to +-1e4; fewer keys than columns, the rest of V's tile NaN (not to be
/// read). Judged in double: m exactly, l and O relative to their size.
std::vector<Case> row_step_cases(Rng& rng, bool normalized) {
  std::vector<Case> cases;
  const int shapes[][2] = {{8, 16}, {24, 32}, {64, 64}, {uniform(rng, 9, 63), uniform(rng, 5, 40)}};
  for (const auto& shape : shapes) {
    const int cols = shape[0], d = shape[1], rows = 56;
    Case c;
    c.header.task = "row_step";
    c.header.args = {{"rows", std::to_string(rows)}, {"cols", std::to_string(cols)}, {"d", std::to_string(d)}};
    c.name = "row step from drawn states, " + std::to_string(cols) + " keys, head_dim " + std::to_string(d);
    c.is_step = true;
    c.from_answers = true;
    std::vector<float> state(std::size_t(rows) * (2 + d)), scores(std::size_t(rows) * cols), keys(rows),
        v = normal(rng, std::size_t(rows) * cols * d);
    std::vector<double> want(std::size_t(rows) * (2 + d));
    for (int r = 0; r < rows; ++r) {
      const int kind = r % 7;
      float* st = state.data() + std::size_t(r) * (2 + d);
      float* sc = scores.data() + std::size_t(r) * cols;
      const double shift = kind == 5 ? double(uniform(rng, -10000, 10000)) : 0.0;
      const std::vector<float> x = normal(rng, cols, 2.0f);
      for (int j = 0; j < cols; ++j) sc[j] = float(x[j] + shift);
      int n = cols;
      if (kind == 6) {
        n = uniform(rng, 1, cols - 1);
        for (int j = n; j < cols; ++j) {
          sc[j] = -INFINITY;
          for (int e = 0; e < d; ++e) v[(std::size_t(r) * cols + j) * d + e] = NAN;
        }
      } else if (r % 3 == 0) {
        for (int j = 0; j < cols; ++j)
          if (uniform(rng, 0, 3) == 0) sc[j] = -INFINITY;  // a few masked keys
      }
      if (kind == 3 || kind == 4)
        for (int j = 0; j < cols; ++j) sc[j] = -INFINITY;
      keys[r] = float(n);
      float tile_max = -INFINITY;
      for (int j = 0; j < cols; ++j) tile_max = std::fmax(tile_max, sc[j]);
      // The state in: empty, or a max m with a sum l >= 1 and outputs o.
      if (kind == 0 || kind == 4) {
        st[0] = -INFINITY;
        st[1] = 0.0f;
        for (int e = 0; e < d; ++e) st[2 + e] = 0.0f;
      } else {
        const double base = tile_max == -INFINITY ? shift : double(tile_max);
        st[0] = float(kind == 1 ? base + uniform(rng, 1, 6) : kind == 2 ? base - uniform(rng, 1, 6) : base + 0.5);
        st[1] = float(1.0 + uniform(rng, 0, 400) / 10.0);
        const std::vector<float> o = normal(rng, d);
        for (int e = 0; e < d; ++e) st[2 + e] = normalized ? o[e] : o[e] * st[1];
      }
      // The state out, in double.
      row_step_answer(st, sc, v.data() + std::size_t(r) * cols * d, cols, d, normalized,
                      want.data() + std::size_t(r) * (2 + d));
    }
    c.input = state;
    c.input.insert(c.input.end(), scores.begin(), scores.end());
    c.input.insert(c.input.end(), keys.begin(), keys.end());
    c.input.insert(c.input.end(), v.begin(), v.end());
    c.expect_values = want.size();
    c.judge = [want, rows, d](const std::vector<float>& out) -> std::string {
      for (int r = 0; r < rows; ++r) {
        const float* got = out.data() + std::size_t(r) * (2 + d);
        const double* w = want.data() + std::size_t(r) * (2 + d);
        const std::string where = "row " + std::to_string(r);
        if (w[0] == -INFINITY) {
          if (!(got[0] == -INFINITY && got[1] == 0.0f))
            return where + ": a row with no visible score must stay (m, l) = (-inf, 0), got (" + fmt(got[0]) + ", " +
                   fmt(got[1]) + ")";
        } else if (double(got[0]) != double(float(w[0]))) {
          return where + ": m = " + fmt(got[0]) + ", expected " + fmt(w[0]);
        } else if (!std::isfinite(got[1]) || std::fabs(got[1] - w[1]) > 1e-5 * w[1]) {
          return where + ": l = " + fmt(got[1]) + ", expected " + fmt(w[1]);
        }
        double err = 0, norm = 0;
        for (int e = 0; e < d; ++e) {
          if (!std::isfinite(got[2 + e])) return where + ": o[" + std::to_string(e) + "] is not finite";
          err += (got[2 + e] - w[2 + e]) * (got[2 + e] - w[2 + e]);
          norm += w[2 + e] * w[2 + e];
        }
        if (std::sqrt(err) > 1e-5 * std::sqrt(norm) + 1e-6)
          return where + ": the output's relative error is " + fmt(std::sqrt(err / std::max(norm, 1e-30))) +
                 " (allowed 1e-5)";
      }
      return "";
    };
    cases.push_back(c);
  }
  return cases;
}

std::vector<Case> gated(std::vector<Case> steps, std::vector<Case> whole) {
  double step_weight = 0, whole_weight = 0;
  for (const Case& c : steps) step_weight += c.weight;
  for (const Case& c : whole) whole_weight += c.weight;
  for (Case& c : whole) {
    c.weight *= step_weight / whole_weight;
    c.needs_steps = true;
  }
  steps.insert(steps.end(), whole.begin(), whole.end());
  return steps;
}

std::vector<Case> steps_and_forward(Rng& rng, bool normalized, std::vector<Case> forward) {
  return gated(row_step_cases(rng, normalized), std::move(forward));
}

}  // namespace fa::grader
