// The expected answers of the cases whose answer is the exercise's step itself: chapter 03's
// online update, the row step of chapters 04 and 05, chapter 07's gradients from a given LSE,
// chapter 08's merge and chapter 09's tile ranges, each in fp64 from the inputs the checker drew.
// They are computed by classroom/instructor/answers.cpp, which the student copy does not hold
// (their code would be the exercises' solutions). A checker built without it (a student copy's
// self-check) links answers_absent.cpp instead: answers_available() is false there, and a case
// that needs these answers (Case::from_answers) is reported as not checked.
#pragma once

#include <vector>

#include "attention_features.h"
#include "problem.h"

namespace fa::grader {

/// True when classroom/instructor/answers.cpp is built in.
bool answers_available();

/// Chapter 03: the running (m, l) after one more score.
void online_update_answer(float m, float l, float score, double& m_new, double& l_new);

/// Chapters 04 and 05: one row's state (m, l, o[d]) after one tile of `cols` keys (scores, -inf
/// where masked; v [cols][d]), into want[2 + d]; o normalized (chapter 04) or not (chapter 05).
void row_step_answer(const float* state, const float* scores, const float* v, int cols, int d, bool normalized,
                     double* want);

/// Chapter 07: dQ, dK, dV recomputed with P from the given LSE.
struct Gradients {
  std::vector<double> dq, dk, dv;
};
Gradients recomputed_gradients(const AttentionShape& s, const std::vector<float>& q, const std::vector<float>& k,
                               const std::vector<float>& v, const std::vector<float>& o, const std::vector<float>& lse,
                               const std::vector<float>& d_o);

/// Chapter 08: the exact merge of `parts` partitions (LSE_p, O_p [d]) into (O [d], LSE).
void merge_answer(const std::vector<float>& lse, const std::vector<float>& o, int parts, int d,
                  std::vector<double>& out, double& total);

/// Chapter 09: tile_keys' [begin, end) for rows first..last with `tile`-key tiles, and
/// rows_for_keys' [begin, end) for keys j0..j1 - 1, under `mask`.
void tile_answer(const WindowMask& mask, int first, int last, int tile, int j0, int j1, int out[4]);

}  // namespace fa::grader
