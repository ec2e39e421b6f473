#include "chapter_main.h"

#include <cmath>
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli.h"
#include "cuda_check.h"
#include "registry.h"
#include "report.h"
#include "runner.h"

namespace fa {

namespace {

void print_variants(int chapter) {
  std::cout << "GPU kernels:\n";
  for (const ForwardKernel* k : forward_kernels_of_chapter(chapter)) {
    std::printf("  %d  %-12s %-28s %s  %s\n", k->number, k->variant.c_str(), k->name.c_str(), dtype_name(k->dtype),
                k->summary.c_str());
  }
  std::cout << "CPU algorithms (algorithm.h):\n";
  for (const CpuAlgorithm* a : cpu_algorithms_of_chapter(chapter)) {
    std::printf("  %d  %-12s %-28s %s\n", a->number, a->variant.c_str(), a->name.c_str(), a->summary.c_str());
  }
}

/// The forward chapters' run: their variants through the check-and-time path, or their CPU
/// algorithms without a GPU.
int run_forward_chapter(const CliOptions& flags, const ChapterInfo& chapter) {
  CliOptions opt = flags;
  opt.shape.validate();
  opt.features.validate(opt.shape);
  std::vector<const ForwardKernel*> kernels;
  std::vector<const CpuAlgorithm*> algorithms;
  for (const ForwardKernel* k : forward_kernels_of_chapter(chapter.number)) {
    if (variant_matches(*k, opt.variant)) kernels.push_back(k);
  }
  for (const CpuAlgorithm* a : cpu_algorithms_of_chapter(chapter.number)) {
    if (variant_matches(*a, opt.variant)) algorithms.push_back(a);
  }
  // A variant asked for by name must handle the shape; with 'all' an unsupported one is listed as skipped.
  if (opt.variant != "all") {
    for (const ForwardKernel* k : kernels) {
      std::string why = support_reason(*k, opt.shape, opt.features);
      if (!why.empty()) throw std::invalid_argument("variant '" + k->variant + "' does not support this shape: " + why);
    }
  }

  std::vector<RunResult> results;
  const GpuInfo& gpu = detect_gpu();
  RunOptions run;
  run.check = opt.check;
  run.iters = opt.iters;
  run.warmup = opt.warmup;
  std::cout << "chapter " << chapter.number << ": " << chapter.title << "\n";
  if (gpu.available) {
    std::cout << "GPU: " << describe_gpu(gpu) << "\n";
    Problem problem(opt.shape, opt.seed, opt.full_check, opt.features);
    std::cout << "problem: " << describe(opt.shape, opt.features) << ", seed " << opt.seed << "  (--seed " << opt.seed
              << " repeats it)\n";
    if (opt.check) std::cout << "check: fp64 oracle on " << problem.plan().describe(opt.shape) << "\n";
    std::cout << "\n";
    for (const ForwardKernel* k : kernels) {
      std::cout << "running " << k->name << " ..." << std::flush;
      results.push_back(run_forward(*k, problem, run));
      std::cout << " " << results.back().status() << "\n";
    }
    std::cout << "\n";
  } else {
    std::cout << "no GPU (" << gpu.reason << "): running the CPU side only\n";
    opt.cpu = true;
  }
  if (opt.cpu) {
    // Plain float loops on one core: without shape flags, run the small CPU shape.
    AttentionShape cpu_shape = opt.shape;
    if (!opt.shape_given) {
      cpu_shape = default_cpu_shape();
      cpu_shape.causal = opt.shape.causal;
      if (opt.logit_scale != 1.0) cpu_shape.scale = opt.logit_scale / std::sqrt(double(cpu_shape.head_dim));
    }
    Problem problem(cpu_shape, opt.seed, opt.full_check, opt.features);
    std::cout << "CPU problem: " << describe(cpu_shape, opt.features) << ", seed " << opt.seed << "\n";
    if (opt.check) std::cout << "check: fp64 oracle on " << problem.plan().describe(cpu_shape) << "\n";
    for (const CpuAlgorithm* a : algorithms) results.push_back(run_cpu_algorithm(*a, problem, run));
    std::cout << "\n";
  }
  print_results(std::cout, results);
  bool notes_header = false;
  for (const RunResult& r : results) {
    if (r.note.empty() || r.device != "gpu") continue;
    if (!notes_header) std::cout << "\nmemory traffic (counted from the code):\n";
    notes_header = true;
    std::cout << "  " << r.name << ": " << r.note << "\n";
  }
  bool phases_header = false;
  for (const RunResult& r : results) {
    if (r.phases.empty()) continue;
    if (!phases_header) std::cout << "\nwhere the time goes (one launch, CUDA events between the phases):\n";
    phases_header = true;
    std::cout << "  " << r.name << ": " << r.phases << "\n";
  }
  if (!opt.csv.empty()) append_csv(opt.csv, results);
  for (const RunResult& r : results) {
    if (r.ran && !r.passed()) return 1;
    if (!r.error.empty()) return 1;
  }
  return 0;
}

}  // namespace

bool flag_given(int argc, const char* const* argv, const char* flag) {
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == flag) return true;
  return false;
}

int chapter_main(int argc, const char* const* argv, const ChapterInfo& chapter, const ChapterBody& body) {
  try {
    const CliOptions opt = parse_cli(argc, argv, chapter.features);
    if (opt.help) {
      std::cout << chapter.title << " (chapter " << chapter.number << ")\n\n"
                << cli_usage(chapter.program, chapter.features) << body.help_notes << "\n";
      body.print_variants();
      return 0;
    }
    if (opt.list) {
      body.print_variants();
      return 0;
    }
    body.require_variant(opt.variant);
    return body.run(opt, argc, argv);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "%s: error: %s\n", chapter.program, e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", chapter.program, e.what());
    return 1;
  }
}

int chapter_main(int argc, const char* const* argv, const ChapterInfo& chapter) {
  ChapterBody body;
  body.print_variants = [&] { print_variants(chapter.number); };
  body.require_variant = [&](const std::string& variant) {
    for (const CpuAlgorithm* a : cpu_algorithms_of_chapter(chapter.number))
      if (variant_matches(*a, variant)) return;
    require_known_variant(forward_kernels_of_chapter(chapter.number), variant, chapter.number);
  };
  body.run = [&](const CliOptions& opt, int, const char* const*) { return run_forward_chapter(opt, chapter); };
  return chapter_main(argc, argv, chapter, body);
}

}  // namespace fa
