// What the grader's checker and a runner say to each other, over the runner's stdin and stdout.
//
// The checker (checker.cpp, built from the instructor's tree) draws the inputs; a runner (built
// from the student's code) computes the outputs and nothing else. One request per runner process:
//
//   request:   a header line "TASK key=value key=value ...\n", then `in` float32 values
//   response:  "ok out=N [ms=T iters=I qscale=C]\n" and N float32 values, or "error MESSAGE\n"
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

#include "confine.h"
#include "problem.h"

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

/// An attention shape as the header words b, hq, hkv, sq, skv, d, causal carry it.
inline void put_shape(Header& h, const AttentionShape& s) {
  h.args["b"] = std::to_string(s.batch);
  h.args["hq"] = std::to_string(s.heads_q);
  h.args["hkv"] = std::to_string(s.heads_kv);
  h.args["sq"] = std::to_string(s.seq_q);
  h.args["skv"] = std::to_string(s.seq_kv);
  h.args["d"] = std::to_string(s.head_dim);
  h.args["causal"] = s.causal ? "1" : "0";
}

inline AttentionShape shape_of(const Header& h) {
  AttentionShape s;
  s.batch = int(h.num("b"));
  s.heads_q = int(h.num("hq"));
  s.heads_kv = int(h.num("hkv"));
  s.seq_q = int(h.num("sq"));
  s.seq_kv = int(h.num("skv"));
  s.head_dim = int(h.num("d"));
  s.causal = h.num("causal") != 0;
  return s;
}

/// `in` split into consecutive pieces of the given sizes.
inline std::vector<const float*> pieces(const std::vector<float>& in, const std::vector<std::size_t>& sizes) {
  std::vector<const float*> out;
  std::size_t at = 0;
  for (std::size_t n : sizes) {
    if (at + n > in.size()) throw std::runtime_error("request holds fewer values than its header says");
    out.push_back(in.data() + at);
    at += n;
  }
  return out;
}

/// What a runner answers: the output values and, when it timed the launches, the median time.
struct Answer {
  std::vector<float> out;
  double ms = -1;
  int iters = 0;
  double q_scale = 1;  // timed: the factor the answered launch's Q was scaled by (runner_gpu.cu's time_ms)
};

/// A runner's main: one request from stdin, then the runner confines itself (confine.h), then
/// `run(header, inputs)` (the student's code; it returns an Answer), and the answer (or "error
/// MESSAGE" for whatever it throws) on stdout.
template <class Run>
int serve(Run run, Confinement confinement) {
  std::string line;
  try {
    if (!read_line(stdin, line)) throw std::runtime_error("no request header");
    const Header h = parse_header(line);
    std::vector<float> in;
    if (!read_floats(stdin, in, std::size_t(h.num("in")))) throw std::runtime_error("request ends early");
    confine(confinement);
    const Answer a = run(h, in);
    if (a.ms >= 0) std::printf("ok out=%zu ms=%.6f iters=%d qscale=%a\n", a.out.size(), a.ms, a.iters, a.q_scale);
    else std::printf("ok out=%zu\n", a.out.size());
    write_floats(stdout, a.out);
  } catch (const std::exception& e) {
    std::string what = e.what();
    for (char& c : what)
      if (c == '\n') c = ' ';
    std::printf("error %s\n", what.c_str());
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace fa::grader
