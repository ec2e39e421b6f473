// The body of every chapter program: parse the shared flags, answer --help and --list, refuse an
// unknown variant or bad input in one line, then run the chapter. For the forward chapters the
// run is the same everywhere: pick the chapter's variants, run each through the check-and-time
// path, print the table; without a GPU, say so in one line and run the CPU side (the oracle and
// the chapter's algorithm.h) instead. Chapters 07 (backward) and 08 (decode) bring their own
// run and variant list (ChapterBody) and share the rest.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli.h"

namespace fa {

/// Whether `entry` (a forward, backward or decode kernel, or a CPU algorithm) is the --variant
/// asked for: 'all', its number, its short name or its full registry name.
template <class Entry>
bool variant_matches(const Entry& entry, const std::string& wanted) {
  return wanted == "all" || wanted == entry.variant || wanted == entry.name || wanted == std::to_string(entry.number);
}

/// "1/deferred, 2/kv_split, all": the variants of `entries` (each once), for error messages.
template <class Entry>
std::string variant_list(const std::vector<const Entry*>& entries) {
  std::string out;
  for (const Entry* e : entries) {
    const std::string item = std::to_string(e->number) + "/" + e->variant;
    if ((", " + out + ", ").find(", " + item + ", ") == std::string::npos) out += (out.empty() ? "" : ", ") + item;
  }
  return out.empty() ? "none registered" : out + ", all";
}

/// Throws std::invalid_argument("unknown variant 'x' for chapter 7; available: 1/fp32, ..., all")
/// unless --variant `wanted` names one of `entries`.
template <class Entry>
void require_known_variant(const std::vector<const Entry*>& entries, const std::string& wanted, int chapter) {
  for (const Entry* e : entries)
    if (variant_matches(*e, wanted)) return;
  throw std::invalid_argument("unknown variant '" + wanted + "' for chapter " + std::to_string(chapter) +
                              "; available: " + variant_list(entries));
}

struct ChapterInfo {
  int number;           // 1 for chapters/01_naive_attention
  const char* program;  // "ch01_naive_attention"
  const char* title;    // "Naive attention"
  /// Whether the program takes chapter 09's feature flags (--window, --softcap, ...): only the
  /// chapters whose kernels declare features do.
  bool features = false;
};

/// What a chapter whose kernels are not forward kernels brings to chapter_main.
struct ChapterBody {
  std::string help_notes;                // printed after the flags by --help
  std::function<void()> print_variants;  // --list, and the end of --help
  /// Throws std::invalid_argument (require_known_variant) unless --variant names one of them.
  std::function<void(const std::string& variant)> require_variant;
  /// Runs the chapter with the parsed flags (argv: to tell a flag given from its default); returns
  /// 0 or 1, throws std::invalid_argument for bad input.
  std::function<int(const CliOptions& opt, int argc, const char* const* argv)> run;
};

/// Returns the process exit code: 0 when everything that ran passed its check, 1 when a check
/// failed or a kernel errored, 2 for bad input (with a one-line message on stderr).
int chapter_main(int argc, const char* const* argv, const ChapterInfo& chapter, const ChapterBody& body);

/// The same for a forward chapter: its registered forward kernels and CPU algorithms.
int chapter_main(int argc, const char* const* argv, const ChapterInfo& chapter);

/// Whether `flag` (e.g. "--batch") is on the command line: a chapter's own defaults apply where not.
bool flag_given(int argc, const char* const* argv, const char* flag);

}  // namespace fa
