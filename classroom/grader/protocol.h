// What the grader's checker and a runner say to each other, over the runner's stdin and stdout.
//
// The checker (checker.cpp, built from the instructor's tree) draws the inputs; a runner (built
// from the student's code) computes the outputs and nothing else. One request per runner process:
//
//   request:   a header line "TASK key=value key=value ...\n", then `in` float32 values
//   response:  "ok out=N [ms=T iters=I]\n" and N float32 values, or "error MESSAGE\n"
//
// The header names every size, so both sides know how many values follow. The checker never
// trusts a runner's exit code or its words: a response counts only when its values match the
// oracle's for inputs the runner could not know in advance.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace fa::grader {

struct Header {
  std::string task;
  std::map<std::string, std::string> args;

  long long num(const std::string& key) const {
    auto it = args.find(key);
    if (it == args.end()) throw std::runtime_error("request lacks '" + key + "'");
    char* end = nullptr;
    const long long v = std::strtoll(it->second.c_str(), &end, 10);
    if (end == it->second.c_str() || *end != '\0') throw std::runtime_error("'" + key + "' is not an integer");
    return v;
  }
  std::string str(const std::string& key) const {
    auto it = args.find(key);
    if (it == args.end()) throw std::runtime_error("request lacks '" + key + "'");
    return it->second;
  }
  std::string line() const {
    std::string s = task;
    for (const auto& [k, v] : args) s += " " + k + "=" + v;
    return s + "\n";
  }
};

/// Parses "TASK k=v k=v" (no newline). Throws on a malformed word.
inline Header parse_header(const std::string& line) {
  Header h;
  std::size_t pos = 0;
  auto next_word = [&]() {
    while (pos < line.size() && line[pos] == ' ') ++pos;
    const std::size_t start = pos;
    while (pos < line.size() && line[pos] != ' ') ++pos;
    return line.substr(start, pos - start);
  };
  h.task = next_word();
  for (std::string w = next_word(); !w.empty(); w = next_word()) {
    const std::size_t eq = w.find('=');
    if (eq == std::string::npos || eq == 0) throw std::runtime_error("malformed header word '" + w + "'");
    h.args[w.substr(0, eq)] = w.substr(eq + 1);
  }
  return h;
}

/// Reads one line (at most 4096 characters) from `f`, without its newline.
inline bool read_line(std::FILE* f, std::string& out) {
  out.clear();
  for (int c; (c = std::fgetc(f)) != EOF;) {
    if (c == '\n') return true;
    if (out.size() >= 4096) return false;
    out.push_back(char(c));
  }
  return false;
}

inline bool read_floats(std::FILE* f, std::vector<float>& out, std::size_t n) {
  out.resize(n);
  return n == 0 || std::fread(out.data(), sizeof(float), n, f) == n;
}

inline bool write_floats(std::FILE* f, const std::vector<float>& v) {
  return v.empty() || std::fwrite(v.data(), sizeof(float), v.size(), f) == v.size();
}

}  // namespace fa::grader
