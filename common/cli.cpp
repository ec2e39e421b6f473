#include "cli.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <sstream>
#include <stdexcept>

namespace fa {

AttentionShape default_gpu_shape() {
  AttentionShape s;
  s.batch = 8;
  s.heads_q = s.heads_kv = 16;
  s.seq_q = s.seq_kv = 2048;
  s.head_dim = 128;
  return s;
}

AttentionShape default_cpu_shape() {
  AttentionShape s;
  s.batch = 1;
  s.heads_q = s.heads_kv = 2;
  s.seq_q = s.seq_kv = 256;
  s.head_dim = 64;
  return s;
}

namespace {

[[noreturn]] void bad_value(const std::string& flag, const std::string& text, const char* allowed) {
  throw std::invalid_argument(flag + " expects " + allowed + ", got '" + text + "'");
}

long long parse_integer(const std::string& flag, const std::string& text, long long min_value, const char* allowed) {
  errno = 0;
  char* end = nullptr;
  long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE || value < min_value || value > std::numeric_limits<int>::max()) {
    bad_value(flag, text, allowed);
  }
  return value;
}

int parse_size(const std::string& flag, const std::string& text) {
  return int(parse_integer(flag, text, 1, "a positive integer"));
}

}  // namespace

CliOptions parse_cli(int argc, const char* const* argv, bool takes_features) {
  CliOptions opt;
  opt.shape = default_gpu_shape();
  bool heads_kv_given = false, seq_kv_given = false, varlen = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string inline_value;
    bool has_inline = false;
    if (arg.rfind("--", 0) == 0) {
      size_t eq = arg.find('=');
      if (eq != std::string::npos) {
        inline_value = arg.substr(eq + 1);
        arg = arg.substr(0, eq);
        has_inline = true;
      }
    }
    auto value = [&]() -> std::string {
      if (has_inline) return inline_value;
      if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
      return argv[++i];
    };
    auto no_value = [&]() {
      if (has_inline) throw std::invalid_argument(arg + " takes no value, got '" + inline_value + "'");
    };

    if (arg == "--help" || arg == "-h") {
      no_value();
      opt.help = true;
    } else if (arg == "--list") {
      no_value();
      opt.list = true;
    } else if (arg == "--batch") {
      opt.shape.batch = parse_size(arg, value());
      opt.shape_given = true;
    } else if (arg == "--heads") {
      opt.shape.heads_q = parse_size(arg, value());
      opt.shape_given = true;
    } else if (arg == "--heads-kv") {
      opt.shape.heads_kv = parse_size(arg, value());
      heads_kv_given = opt.shape_given = true;
    } else if (arg == "--seq") {
      opt.shape.seq_q = parse_size(arg, value());
      opt.shape_given = true;
    } else if (arg == "--seq-q") {
      opt.shape.seq_q = parse_size(arg, value());
      opt.shape_given = true;
    } else if (arg == "--seq-kv") {
      opt.shape.seq_kv = parse_size(arg, value());
      seq_kv_given = opt.shape_given = true;
    } else if (arg == "--dim") {
      opt.shape.head_dim = parse_size(arg, value());
      opt.shape_given = true;
    } else if (arg == "--causal") {
      no_value();
      opt.shape.causal = true;
    } else if (arg == "--no-causal") {
      no_value();
      opt.shape.causal = false;
    } else if (arg == "--logit-scale") {
      std::string text = value();
      char* end = nullptr;
      double x = std::strtod(text.c_str(), &end);
      if (text.empty() || *end != '\0' || !std::isfinite(x) || x <= 0) bad_value(arg, text, "a finite number > 0");
      opt.logit_scale = x;
    } else if (takes_features && arg == "--window") {
      const std::string text = value();
      const size_t comma = text.find(',');
      if (comma == std::string::npos) bad_value(arg, text, "LEFT,RIGHT with each an integer >= -1 (-1: no limit)");
      opt.features.window_left =
          int(parse_integer(arg, text.substr(0, comma), -1, "LEFT,RIGHT with each an integer >= -1"));
      opt.features.window_right =
          int(parse_integer(arg, text.substr(comma + 1), -1, "LEFT,RIGHT with each an integer >= -1"));
      opt.shape_given = true;
    } else if (takes_features && arg == "--softcap") {
      std::string text = value();
      char* end = nullptr;
      double x = std::strtod(text.c_str(), &end);
      if (text.empty() || *end != '\0' || !std::isfinite(x) || x <= 0) bad_value(arg, text, "a finite number > 0");
      opt.features.softcap = x;
      opt.shape_given = true;
    } else if (takes_features && arg == "--alibi") {
      no_value();
      opt.features.alibi = opt.shape_given = true;
    } else if (takes_features && arg == "--bias") {
      no_value();
      opt.features.bias = opt.shape_given = true;
    } else if (takes_features && arg == "--varlen") {
      no_value();
      varlen = opt.shape_given = true;
    } else if (arg == "--variant") {
      opt.variant = value();
      if (opt.variant.empty()) bad_value(arg, opt.variant, "a variant name, a number or 'all'");
    } else if (arg == "--iters") {
      opt.iters = int(parse_integer(arg, value(), 0, "an integer >= 0"));
    } else if (arg == "--warmup") {
      opt.warmup = int(parse_integer(arg, value(), 0, "an integer >= 0"));
    } else if (arg == "--seed") {
      std::string text = value();
      char* end = nullptr;
      errno = 0;
      if (text.empty() || text[0] == '-') bad_value(arg, text, "an integer >= 0");
      opt.seed = std::strtoull(text.c_str(), &end, 10);
      if (*end != '\0' || errno == ERANGE) bad_value(arg, text, "an integer >= 0");
      opt.seed_given = true;
    } else if (arg == "--check") {
      no_value();
      opt.check = true;
    } else if (arg == "--no-check") {
      no_value();
      opt.check = false;
    } else if (arg == "--full-check") {
      no_value();
      opt.check = opt.full_check = true;
    } else if (arg == "--cpu") {
      no_value();
      opt.cpu = true;
    } else if (arg == "--csv") {
      opt.csv = value();
      if (opt.csv.empty()) bad_value(arg, opt.csv, "a file path");
    } else if (arg == "--window" || arg == "--softcap" || arg == "--alibi" || arg == "--bias" || arg == "--varlen") {
      throw std::invalid_argument(arg + " is one of chapter 09's features, which this program's kernels do not take");
    } else {
      throw std::invalid_argument("unknown argument '" + std::string(argv[i]) + "' (see --help)");
    }
  }
  // Unless given, K/V heads follow the query heads (plain multi-head attention) and the key
  // length follows the query length (self-attention).
  if (!heads_kv_given) opt.shape.heads_kv = opt.shape.heads_q;
  if (!seq_kv_given) opt.shape.seq_kv = opt.shape.seq_q;
  if (!opt.seed_given) opt.seed = std::random_device{}() & 0xFFFFFFu;
  if (opt.logit_scale != 1.0) opt.shape.scale = opt.logit_scale / std::sqrt(double(opt.shape.head_dim));
  if (varlen) {  // the --batch sequences lie end to end in one batch
    opt.features.sequences = opt.shape.batch;
    opt.shape.batch = 1;
  }
  return opt;
}

std::string cli_usage(const std::string& program, bool takes_features) {
  AttentionShape d = default_gpu_shape();
  std::ostringstream s;
  s << "usage: " << program << " [flags]\n"
    << "\n"
    << "Problem (layout [batch, heads, seq, head_dim]; defaults: one point of the standard sweep):\n"
    << "  --batch N          batch size (default " << d.batch << ")\n"
    << "  --heads N          query heads (default " << d.heads_q << ")\n"
    << "  --heads-kv N       key/value heads; must divide --heads (default: = --heads)\n"
    << "  --seq N            sets --seq-q and --seq-kv together\n"
    << "  --seq-q N          query length (default " << d.seq_q << ")\n"
    << "  --seq-kv N         key/value length (default: = --seq-q)\n"
    << "  --dim N            head dimension (default " << d.head_dim << ")\n"
    << "  --causal           causal mask, aligned bottom-right when seq-q != seq-kv\n"
    << "  --no-causal        no mask (default)\n"
    << "  --logit-scale F    multiply the softmax scale 1/sqrt(dim) by F (large F shows overflow)\n"
    << "\n";
  if (takes_features)
    s << "Masks and score changes (chapter 09's kernels; others report them as not supported):\n"
      << "  --window L,R       sliding window: query i sees keys i-L .. i+R (bottom-right; -1: no limit)\n"
      << "  --softcap F        logit softcap: a scaled score x becomes F * tanh(x / F)\n"
      << "  --alibi            ALiBi: add -slope_h * |i - j| (the ALiBi paper's slopes for --heads)\n"
      << "  --bias             add a random float bias [batch, heads, seq-q, seq-kv]\n"
      << "  --varlen           pack --batch sequences of random lengths into --seq-q / --seq-kv tokens\n"
      << "\n";
  s << "Run:\n"
    << "  --variant NAME     a variant's name or number, or 'all' (default)\n"
    << "  --list             list this chapter's variants and exit\n"
    << "  --iters N          timed repeats, median reported; 0 = no timing (default 20)\n"
    << "  --warmup N         untimed launches before timing (default 3)\n"
    << "  --seed N           input seed (default: fresh each run, printed)\n"
    << "  --check            compare with the fp64 oracle (default; big shapes are sampled)\n"
    << "  --full-check       compare every row, however big\n"
    << "  --no-check         skip the comparison\n"
    << "  --cpu              also run the chapter's algorithm.h on the CPU\n"
    << "  --csv FILE         append the results to FILE as CSV\n"
    << "  -h, --help         this text\n";
  return s.str();
}

}  // namespace fa
