// The checker's cases: what one case asks a runner (a request and its inputs) and how its answer
// is judged against the fp64 oracle, the drawing of inputs at grading time, the judging helpers
// every chapter shares, and the registry that maps an exercise id to its case generator.
//
// A chapter's generators live in cases/chNN.cpp, each registered under its exercise's id:
//
//   FA_EXERCISE_CASES("chNN_step_cpu", step_cases);
//   FA_EXERCISE_CASES("chNN_plan_cpu", plan_cases, Answers::FromSolution);
//
// Answers::FromSolution marks a generator whose expected answers come from the instructor's own
// code (not from the oracle): a student copy's self-check cannot check it, so it says so there.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "dtype.h"
#include "problem.h"
#include "protocol.h"

namespace fa::grader {

using Rng = std::mt19937_64;
using Judge = std::function<std::string(const std::vector<float>&)>;  // "" when right, else why not
using Variant = std::map<std::string, std::string>;                   // extra header words of a case

struct Case {
  std::string name;
  double weight = 1;  // 0: a trivial shape, run and reported but worth nothing alone
  Header header;
  std::vector<float> input;
  std::size_t expect_values = 0;
  Judge judge;
  /// A speed case's judge: the answer of a launch whose Q was the case's times `q_scale`
  /// (runner_gpu.cu scales Q afresh before every timed launch).
  std::function<std::string(const std::vector<float>&, double q_scale)> judge_scaled;
  double min_speed = 0;       // > 0: a speed case, run by both runners (checker.cpp's check_speed)
  double gate_speed = 0;      // > 0 (a speed case): below this share of the reference's speed, no case counts
  bool needs_steps = false;   // counts only when every drawn-state case of the exercise passed
  bool is_step = false;       // a step from a drawn state (row_step_cases, chapter 03's update)
  bool from_answers = false;  // its expected answers come from answers.h: not checked without them
  std::string gates;          // non-empty: when this case fails, no case counts, for this reason
};

// ---- the registry ----------------------------------------------------------------------------

enum class Answers {
  Oracle,        // expected answers from the oracle or drawn states: checkable anywhere
  FromSolution,  // expected answers from the instructor's code: not checkable in a student copy
};

using CaseMaker = std::vector<Case> (*)(Rng&);

struct ExerciseCases {
  std::string id;
  CaseMaker make;
  Answers answers;
};

/// Every registered generator, in registration order.
std::vector<ExerciseCases>& exercise_registry();

/// The generator registered under `id`; throws with the known ids when there is none.
const ExerciseCases& find_exercise_cases(const std::string& id);

struct RegisterExerciseCases {
  RegisterExerciseCases(const char* id, CaseMaker make, Answers answers = Answers::Oracle);
};

#define FA_EXERCISE_CASES_JOIN2(a, b) a##b
#define FA_EXERCISE_CASES_JOIN(a, b) FA_EXERCISE_CASES_JOIN2(a, b)
#define FA_EXERCISE_CASES(...) \
  static const ::fa::grader::RegisterExerciseCases FA_EXERCISE_CASES_JOIN(fa_exercise_cases_, __LINE__) { __VA_ARGS__ }

// ---- drawing inputs --------------------------------------------------------------------------

int uniform(Rng& rng, int lo, int hi);
std::vector<float> normal(Rng& rng, std::size_t n, float sigma = 1.0f);
std::vector<float> rounded(std::vector<float> v, DType dtype);

/// A shape with seq lengths in [lo, hi], head_dim from `dims`, GQA/MQA or not, causal or not.
AttentionShape draw_shape(Rng& rng, int lo, int hi, const std::vector<int>& dims, int max_batch = 2);

/// A large shape for a speed case: `heads` query and K/V heads, seq `seq`, head_dim `d`.
AttentionShape big_shape(int heads, int seq, int d);

/// Rows of scores for the softmax exercises: plain, shifted by up to +-1e4 (exp overflows without
/// the max), with masked (-inf) entries, and now and then a row with no visible entry at all.
std::vector<float> softmax_rows(Rng& rng, int rows, int n);

// ---- judging ---------------------------------------------------------------------------------

std::string fmt(double x);

/// O and LSE against the oracle, with the tolerance of `dtype`; every row, or (sample_seed != 0,
/// a speed case's large shape) rows drawn from sample_seed.
Judge judge_forward(const AttentionShape& s, std::vector<float> q, std::vector<float> k, std::vector<float> v,
                    DType dtype, uint64_t sample_seed = 0);

/// Relative Frobenius error of `got` against `want` (and non-finite values) within `tol`; an
/// expected tensor of root-mean-square below 1e-3 counts as that size.
std::string close_enough(const char* what, const float* got, const double* want, std::size_t n, double tol);

/// m and l of a row in double: (max, sum exp(s - max)).
void exact_state(const float* row, int n, double& m, double& l);

/// A softmax state (m, l) against the exact one: m exactly, l relative to its size.
std::string judge_state(float m, float l, double m_ref, double l_ref, const std::string& where);

// ---- cases several chapters share ------------------------------------------------------------

/// The safe softmax of rows ("safe_row": P and LSE) or the online update ("online_update": (m, l)
/// per row) on the trivial row and rows of three drawn lengths.
std::vector<Case> softmax_row_cases(Rng& rng, const std::string& task);

/// One forward case: q, k, v drawn and rounded to `dtype`, judged against the oracle. Q is drawn
/// `q_magnitude` times larger than K and V (kLargeScores: scores of a few hundred).
Case forward_case(Rng& rng, const AttentionShape& s, const std::string& task_kernel, DType dtype, double weight,
                  const Variant& extra, double q_magnitude = 1);

/// Q's magnitude for scores past exp's float range: with head_dim's 1/sqrt(d) scale, scores have
/// a standard deviation of 64 and a row's largest is well past 88.7, where exp(s) overflows in
/// float. A softmax that does not take the row's (or the partitions') largest out first turns
/// into inf and NaN there, and the exercises teach the one that does.
constexpr double kLargeScores = 64;
extern const char* const kUnsafeSoftmax;

/// `cases` and, for each of `variants`, one case on a drawn shape with scores past exp's float
/// range (kLargeScores), which gates the exercise (kUnsafeSoftmax): an answer that overflows
/// there is not the form the exercise teaches, whatever it gives on small scores.
std::vector<Case> with_large_scores(Rng& rng, std::vector<Case> cases, const std::vector<Variant>& variants,
                                    DType dtype, int lo, int hi, const std::vector<int>& dims);

/// The trivial shape (weight 0) and `n` drawn ones for each of `variants` (extra header args).
std::vector<Case> forward_cases(Rng& rng, const std::vector<Variant>& variants, DType dtype, int lo, int hi,
                                const std::vector<int>& dims, int n = 3);

/// `cases` and the speed part: one large shape `s` on `kernel`, worth a fifth of the exercise,
/// passing at 0.7 of the reference solution's speed. gate > 0: unless that shape passes at `gate`
/// of the reference's speed or more, no case of the exercise counts (an answer computed on the
/// host, not by a kernel on the GPU, is that slow).
std::vector<Case> with_speed(Rng& rng, std::vector<Case> cases, const std::string& kernel, DType dtype,
                             const AttentionShape& s, double gate = 0);

/// The row step alone, from states the checker draws (chapters 04 and 05's CPU exercises);
/// normalized: O kept divided by l (FlashAttention-1), else the unnormalized accumulator.
std::vector<Case> row_step_cases(Rng& rng, bool normalized);

/// `steps` (cases of a step alone from drawn states: is_step) and `whole` (the same code through
/// its whole loop), each half of the points; the whole loop's cases count only when every step
/// case passed, so an answer that is not the step's algorithm scores nothing.
std::vector<Case> gated(std::vector<Case> steps, std::vector<Case> whole);

/// The CPU row steps: row_step_cases gated before the chapter's whole loop (`forward`).
std::vector<Case> steps_and_forward(Rng& rng, bool normalized, std::vector<Case> forward);

}  // namespace fa::grader
