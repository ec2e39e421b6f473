// How a kernel's output is judged against the oracle: the error metrics, the one tolerance
// table, and a report that says exactly what went wrong and where.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dtype.h"
#include "problem.h"
#include "reference.h"

namespace fa {

/// Limits for one output dtype. O is judged by its relative Frobenius error over the checked
/// rows and its largest absolute error; LSE by its largest absolute error.
struct Tolerance {
  double rel_fro;
  double max_abs;
  double lse_abs;
};

/// The one table. fp32: a float32 kernel lands near 1e-6 (a sum over seq_kv terms in float);
/// the limit leaves room for 16k-long rows. fp16/bf16: inputs are rounded before the oracle
/// sees them, so what remains is P rounded to the dtype before P*V and O rounded on the way
/// out: a few units of the dtype's epsilon (fp16 2^-11, bf16 2^-8), with a margin of ~4x.
Tolerance tolerance_for(DType dtype);
/// FP8 kernels (e4m3 Q, K, V and P with block scales; bf16 in and out): 3 mantissa bits instead
/// of bf16's 7. The CPU model of the recipe lands near rel 4.4e-2, max 1.5e-1, LSE 0.1 on N(0,1)
/// inputs; tests/cpu/test_fp8.cpp checks it stays under half of this row.
Tolerance fp8_tolerance();

struct Mismatch {
  int batch = 0, head = 0, row = 0, col = 0;
  double expected = 0, actual = 0;
  std::string what;  // "never written", "not finite", "off by 0.3"
};

struct CompareReport {
  DType dtype = DType::F32;
  int64_t checked = 0;    // O elements compared
  int64_t unwritten = 0;  // still the poison pattern
  int64_t nonfinite = 0;  // NaN/inf where the oracle is finite (excluding unwritten)
  int64_t over_tolerance = 0;
  double rel_fro = 0;  // ||O - O_ref||_F / ||O_ref||_F over finite, written elements
  double max_abs = 0;
  double lse_max_abs = 0;  // over rows whose oracle LSE is finite
  int64_t lse_bad = 0;     // LSE rows unwritten, not finite when they should be, or over tolerance
  bool has_first = false;
  Mismatch first;  // first bad O element in plan order
  bool has_first_lse = false;
  Mismatch first_lse;  // first bad LSE row (col = -1)
  Tolerance tolerance{};

  bool passed() const;
  /// One line: "rel 3.1e-07  max 2.4e-06  lse 1.9e-06  ok".
  std::string summary() const;
  /// Several lines for a failure: metrics vs limits, counts, first mismatches with coordinates.
  std::string details() const;
};

/// Compares a kernel's O (raw device bytes, in `dtype`, full [B,H,Nq,d] tensor) and LSE
/// (float, full [B,H,Nq]) with the oracle on the rows of `plan`, against `tolerance` when given
/// (a kernel's own row, e.g. fp8_tolerance()), else tolerance_for(dtype).
CompareReport compare_forward(const AttentionShape& shape, DType dtype, const std::vector<unsigned char>& o_raw,
                              const std::vector<float>& lse, const CheckPlan& plan, const ForwardReference& ref,
                              const Tolerance* tolerance = nullptr);

}  // namespace fa
