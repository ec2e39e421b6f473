// The one command line every chapter program and fa_bench share.
#pragma once

#include <cstdint>
#include <string>

#include "attention_features.h"
#include "problem.h"

namespace fa {

struct CliOptions {
  AttentionShape shape;
  /// Chapter 09's features (--window, --softcap, --alibi, --bias, --varlen), for programs that
  /// take them. --varlen packs --batch sequences along the seq axis: shape.batch becomes 1 and
  /// features.sequences the count.
  AttentionFeatures features;
  bool shape_given = false;  // any of --batch/--heads/--heads-kv/--seq*/--dim was given
  std::string variant = "all";
  int iters = 20;
  int warmup = 3;
  uint64_t seed = 0;
  bool seed_given = false;
  bool check = true;
  bool full_check = false;
  double logit_scale = 1.0;
  bool cpu = false;  // also run the chapter's algorithm.h on the CPU
  std::string csv;
  bool list = false;
  bool help = false;
};

/// The default problem of every chapter program: one point of the standard sweep (16k tokens,
/// hidden 2048, head_dim 128, seq 2048), so the chapters' times compare directly.
AttentionShape default_gpu_shape();
/// What the CPU side runs when no GPU is present and no shape was given: small enough for a
/// float CPU loop to finish in a moment.
AttentionShape default_cpu_shape();

/// Parses argv. Throws std::invalid_argument with a one-line message naming the flag, the bad
/// value and what is allowed. Does not validate the shape as a whole (AttentionShape::validate).
/// Chapter 09's flags are taken only when `takes_features`; otherwise they are unknown arguments.
CliOptions parse_cli(int argc, const char* const* argv, bool takes_features = false);

std::string cli_usage(const std::string& program, bool takes_features = false);

}  // namespace fa
