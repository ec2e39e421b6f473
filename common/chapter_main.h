// The body of every chapter program: parse the shared flags, pick the chapter's variants, run
// each through the check-and-time path, print the table. Without a GPU, say so in one line and
// run the CPU side (the oracle and the chapter's algorithm.h) instead.
#pragma once

namespace fa {

struct ChapterInfo {
  int number;           // 1 for chapters/01_naive_attention
  const char* program;  // "ch01_naive_attention"
  const char* title;    // "Naive attention"
};

/// Returns the process exit code: 0 when everything that ran passed its check, 1 when a check
/// failed or a kernel errored, 2 for bad input (with a one-line message on stderr).
int chapter_main(int argc, const char* const* argv, const ChapterInfo& chapter);

}  // namespace fa
