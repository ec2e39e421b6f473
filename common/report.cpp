#include "report.h"

#include <cstdio>
#include <fstream>
#include <iomanip>
#include <map>
#include <sstream>
#include <stdexcept>

namespace fa {

namespace {

std::string fixed(double x, int digits) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  return buf;
}

std::string sci(double x) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1e", x);
  return buf;
}

// CSV fields never hold commas or quotes except free text, which we quote.
std::string csv_quoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"') out += '"';
    if (c != '\n') out += c;
  }
  return out + "\"";
}

}  // namespace

void print_results(std::ostream& out, const std::vector<RunResult>& results) {
  std::vector<std::vector<std::string>> rows;
  rows.push_back(
      {"kernel", "device", "status", "rel err", "max err", "time ms", "TFLOP/s", "GB/s", "speed-up", "memory MiB"});
  std::map<std::string, double> baseline;  // per device: the first time in the list
  for (const RunResult& r : results) {
    std::vector<std::string> row = {r.name, r.device, r.status()};
    if (r.checked) {
      row.push_back(sci(r.report.rel_fro));
      row.push_back(sci(r.report.max_abs));
    } else {
      row.push_back("-");
      row.push_back("-");
    }
    if (r.ms > 0) {
      if (!baseline.count(r.device)) baseline[r.device] = r.ms;
      row.push_back(fixed(r.ms, r.ms < 1 ? 4 : 2));
      row.push_back(fixed(r.tflops, r.tflops < 1 ? 3 : 1));
      row.push_back(fixed(r.gbps, 0));
      row.push_back(fixed(baseline[r.device] / r.ms, 2) + "x");
    } else {
      row.insert(row.end(), {"-", "-", "-", "-"});
    }
    row.push_back(r.ran && r.device == "gpu" ? fixed(r.device_mib, 1) : "-");
    rows.push_back(row);
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    for (size_t c = 0; c < rows[i].size(); ++c) {
      out << (c == 0 ? "" : "  ") << (c < 3 ? std::left : std::right) << std::setw(int(width[c])) << rows[i][c];
    }
    out << std::right << "\n";
    if (i == 0) {
      size_t total = 0;
      for (size_t w : width) total += w + 2;
      out << std::string(total - 2, '-') << "\n";
    }
  }
  for (const RunResult& r : results) {
    if (!r.skipped.empty()) out << "  " << r.name << " skipped: " << r.skipped << "\n";
    if (!r.error.empty()) out << "  " << r.name << " error: " << r.error << "\n";
    if (r.checked && !r.report.passed()) out << "  " << r.name << " check failed:\n" << r.report.details();
  }
}

std::string csv_header() {
  return "chapter,kernel,variant,device,dtype,batch,heads_q,heads_kv,seq_q,seq_kv,head_dim,causal,"
         "status,rel_err,max_abs_err,lse_err,time_ms,tflops,gbps,note,phases,features,device_mib";
}

std::string csv_row(const RunResult& r) {
  std::ostringstream s;
  const AttentionShape& sh = r.shape;
  s << r.chapter << "," << r.name << "," << r.variant << "," << r.device << "," << dtype_name(r.dtype) << ","
    << sh.batch << "," << sh.heads_q << "," << sh.heads_kv << "," << sh.seq_q << "," << sh.seq_kv << "," << sh.head_dim
    << "," << (sh.causal ? 1 : 0) << "," << r.status() << ",";
  if (r.checked) {
    s << r.report.rel_fro << "," << r.report.max_abs << "," << r.report.lse_max_abs << ",";
  } else {
    s << ",,,";
  }
  if (r.ms > 0) {
    s << r.ms << "," << r.tflops << "," << r.gbps << ",";
  } else {
    s << ",,,";
  }
  std::string note = !r.skipped.empty() ? r.skipped : !r.error.empty() ? r.error : r.note;
  s << csv_quoted(note) << "," << csv_quoted(r.phases) << "," << csv_quoted(r.features.to_string()) << ",";
  if (r.ran) s << r.device_mib;
  return s.str();
}

void append_csv(const std::string& path, const std::vector<RunResult>& results) {
  bool needs_header;
  {
    std::ifstream existing(path, std::ios::ate);
    needs_header = !existing || existing.tellg() == 0;
  }
  std::ofstream out(path, std::ios::app);
  if (!out) throw std::runtime_error("cannot write CSV file '" + path + "'");
  if (needs_header) out << csv_header() << "\n";
  for (const RunResult& r : results) out << csv_row(r) << "\n";
  if (!out) throw std::runtime_error("cannot write CSV file '" + path + "'");
}

}  // namespace fa
