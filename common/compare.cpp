#include "compare.h"

#include <cmath>
#include <cstdio>
#include <sstream>

namespace fa {

Tolerance tolerance_for(DType dtype) {
  switch (dtype) {
    case DType::F32: return {2e-5, 2e-4, 2e-4};
    case DType::F16: return {4e-3, 2e-2, 5e-3};
    case DType::BF16: return {2e-2, 8e-2, 2e-2};
  }
  return {0, 0, 0};
}

Tolerance fp8_tolerance() { return {1.5e-1, 6e-1, 3e-1}; }

namespace {

std::string format_number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

std::string format_mismatch(const Mismatch& m, bool is_lse) {
  std::ostringstream s;
  s << (is_lse ? "LSE" : "O") << "(batch=" << m.batch << ", head=" << m.head << ", row=" << m.row;
  if (!is_lse) s << ", col=" << m.col;
  s << "): expected " << format_number(m.expected) << ", got " << format_number(m.actual) << " (" << m.what << ")";
  return s.str();
}

}  // namespace

bool CompareReport::passed() const {
  return unwritten == 0 && nonfinite == 0 && lse_bad == 0 && rel_fro <= tolerance.rel_fro &&
         max_abs <= tolerance.max_abs;
}

std::string CompareReport::summary() const {
  char buf[160];
  std::snprintf(buf, sizeof buf, "rel %.2e  max %.2e  lse %.2e  %s", rel_fro, max_abs, lse_max_abs,
                passed() ? "ok" : "FAIL");
  return buf;
}

std::string CompareReport::details() const {
  std::ostringstream s;
  s << "dtype " << dtype_name(dtype) << ", " << checked << " O elements checked\n"
    << "  relative Frobenius error " << format_number(rel_fro) << " (limit " << tolerance.rel_fro << ")\n"
    << "  max abs error            " << format_number(max_abs) << " (limit " << tolerance.max_abs << ")\n"
    << "  LSE max abs error        " << format_number(lse_max_abs) << " (limit " << tolerance.lse_abs << ")\n"
    << "  never written (poison still there): " << unwritten << "\n"
    << "  not finite where the oracle is finite: " << nonfinite << "\n"
    << "  over the max-abs limit: " << over_tolerance << "\n"
    << "  bad LSE rows: " << lse_bad << "\n";
  if (has_first) s << "  first bad output: " << format_mismatch(first, false) << "\n";
  if (has_first_lse) s << "  first bad LSE:    " << format_mismatch(first_lse, true) << "\n";
  return s.str();
}

CompareReport compare_forward(const AttentionShape& shape, DType dtype, const std::vector<unsigned char>& o_raw,
                              const std::vector<float>& lse, const CheckPlan& plan, const ForwardReference& ref,
                              const Tolerance* tolerance) {
  CompareReport rep;
  rep.dtype = dtype;
  rep.tolerance = tolerance ? *tolerance : tolerance_for(dtype);
  const int d = shape.head_dim;
  double err_sq = 0, ref_sq = 0;
  for (size_t e = 0; e < plan.heads.size(); ++e) {
    const HeadRows& entry = plan.heads[e];
    int64_t head_row0 = (int64_t(entry.batch) * shape.heads_q + entry.head) * shape.seq_q;
    for (size_t r = 0; r < entry.rows.size(); ++r) {
      int row = entry.rows[r];
      int64_t lse_index = head_row0 + row;
      double lse_expected = ref.lse[e][r];
      double lse_actual = lse[lse_index];
      std::string lse_problem;
      if (is_poison(DType::F32, lse.data(), lse_index)) {
        lse_problem = "never written";
      } else if (std::isinf(lse_expected)) {
        // A row that sees no key must say so with -inf, not NaN or a finite number.
        if (!(std::isinf(lse_actual) && lse_actual < 0)) lse_problem = "should be -inf (row sees no key)";
      } else if (!std::isfinite(lse_actual)) {
        lse_problem = "not finite";
      } else {
        double diff = std::fabs(lse_actual - lse_expected);
        rep.lse_max_abs = std::max(rep.lse_max_abs, diff);
        if (diff > rep.tolerance.lse_abs) lse_problem = "off by " + format_number(diff);
      }
      if (!lse_problem.empty()) {
        ++rep.lse_bad;
        if (!rep.has_first_lse) {
          rep.has_first_lse = true;
          rep.first_lse = {entry.batch, entry.head, row, -1, lse_expected, lse_actual, lse_problem};
        }
      }

      for (int c = 0; c < d; ++c) {
        int64_t index = lse_index * d + c;
        double expected = ref.o[e][r * d + c];
        ++rep.checked;
        std::string problem;
        double actual;
        if (is_poison(dtype, o_raw.data(), size_t(index))) {
          ++rep.unwritten;
          problem = "never written";
          actual = std::nan("");
        } else {
          float value;
          decode_elements(dtype, o_raw.data() + size_t(index) * dtype_size(dtype), &value, 1);
          actual = value;
          if (!std::isfinite(actual)) {
            ++rep.nonfinite;
            problem = "not finite";
          } else {
            double diff = std::fabs(actual - expected);
            err_sq += diff * diff;
            ref_sq += expected * expected;
            rep.max_abs = std::max(rep.max_abs, diff);
            if (diff > rep.tolerance.max_abs) {
              ++rep.over_tolerance;
              problem = "off by " + format_number(diff);
            }
          }
        }
        if (!problem.empty() && !rep.has_first) {
          rep.has_first = true;
          rep.first = {entry.batch, entry.head, row, c, expected, actual, problem};
        }
      }
    }
  }
  // When every checked row is fully masked the reference is all zeros: report the absolute norm.
  rep.rel_fro = ref_sq > 0 ? std::sqrt(err_sq / ref_sq) : std::sqrt(err_sq);
  return rep;
}

}  // namespace fa
