// Chapter 07 program: build/bin/ch07_backward --help
//
// Runs a forward kernel (chapter 04's fp32 `registers`) for O and LSE, then the chapter's
// backward kernels, and checks dQ, dK, dV against the fp64 backward oracle (common/reference.cpp)
// on the first two K/V heads of batch 0 and their query heads (every head with --full-check).
#include <cstdio>
#include <exception>
#include <iostream>
#include <map>
#include <random>
#include <stdexcept>
#include <string>

#include "backward_runner.h"
#include "chapter_main.h"
#include "cli.h"
#include "cuda_check.h"
#include "forward_for_backward.h"
#include "registry.h"

namespace fa::backward {
namespace {

/// Chapter 07's run: O and LSE from the forward kernel once per input dtype, then each backward
/// variant checked against the fp64 backward oracle and timed.
int run_chapter(const CliOptions& opt, const std::vector<const BackwardKernel*>& kernels) {
  const AttentionShape shape = opt.shape;  // the shared default (b8 h16 N2048 d128) with the flags applied
  shape.validate();
  const uint64_t seed = opt.seed_given ? opt.seed : std::random_device{}();
  std::printf("chapter 7: backward pass by recomputation\nproblem: %s, seed %llu  (--seed %llu repeats it)\n",
              shape.to_string().c_str(), (unsigned long long)seed, (unsigned long long)seed);
  const GpuInfo& gpu = detect_gpu();
  if (!gpu.available) {
    std::printf("no GPU (%s): chapter 07's kernels need one; algorithm.h is checked by the CPU tests\n",
                gpu.reason.c_str());
    return 0;
  }
  // One problem per input dtype: inputs rounded to it before the oracle sees them.
  std::map<DType, BackwardProblem> problems;
  auto problem_for = [&](DType dtype) -> const BackwardProblem& {
    auto found = problems.find(dtype);
    if (found != problems.end()) return found->second;
    BackwardProblem problem = make_backward_problem(shape, seed, dtype, !opt.check ? -1 : opt.full_check ? 0 : 2);
    if (!opt.check)
      std::printf("%s: no oracle (--no-check): gradients only checked to be written and finite\n", dtype_name(dtype));
    else
      std::printf("%s: fp64 backward oracle on %s\n", dtype_name(dtype),
                  problem.needs_forward
                      ? ("the first " + std::to_string(problem.checked.heads_kv) + " K/V heads of batch 0 and their " +
                         std::to_string(problem.checked.heads_q) + " query heads, all rows (--full-check: every head)")
                            .c_str()
                      : "every head");
    if (problem.needs_forward) {
      const ForwardKernel forward = backward::forward_for_backward();
      const std::string why = support_reason(forward, shape);
      if (!why.empty()) throw std::invalid_argument("the forward (" + forward.name + ") cannot run this shape: " + why);
      run_forward_for(problem, forward);
      std::printf("%s: O and LSE from %s\n", dtype_name(dtype), forward.name.c_str());
    }
    return problems.emplace(dtype, std::move(problem)).first->second;
  };
  const double flops = 2.5 * shape.forward_flops();  // the usual convention: backward = 2.5 x forward
  bool all_passed = true;
  auto selected = [&](const BackwardKernel* k) { return variant_matches(*k, opt.variant); };
  for (const BackwardKernel* k : kernels)
    if (selected(k) && support_reason(*k, shape).empty()) problem_for(k->dtype);  // oracle and forward first
  std::printf("\n%-12s %-7s %-9s %9s %9s  %s\n", "kernel", "dtype", "status", "time ms", "TFLOP/s",
              "gradients vs fp64");
  for (const BackwardKernel* k : kernels) {
    if (!selected(k)) continue;
    const BackwardRunResult r = run_backward(*k, problem_for(k->dtype), opt.iters);
    if (!r.ran) {
      std::printf("%-12s %-7s %-9s  %s\n", k->name.c_str(), dtype_name(k->dtype), r.error.empty() ? "skipped" : "error",
                  (r.error.empty() ? r.skipped : r.error).c_str());
      all_passed = all_passed && r.error.empty();
      continue;
    }
    all_passed = all_passed && r.passed;
    std::printf("%-12s %-7s %-9s %9.3f %9.2f  %s\n", k->name.c_str(), dtype_name(k->dtype), r.passed ? "ok" : "FAILED",
                r.time_ms, r.time_ms > 0 ? flops / (r.time_ms * 1e9) : 0.0,
                opt.check  ? r.summary().c_str()
                : r.passed ? "not compared (--no-check); all written and finite"
                           : "not compared (--no-check); some never written or not finite");
  }
  return all_passed ? 0 : 1;
}

}  // namespace
}  // namespace fa::backward

int main(int argc, char** argv) {
  using namespace fa;
  const std::vector<const BackwardKernel*> kernels = backward_kernels_of_chapter(7);
  ChapterBody body;
  body.print_variants = [&] {
    for (const BackwardKernel* k : kernels)
      std::printf("  %d  %-13s %-24s %-5s %s\n", k->number, k->variant.c_str(), k->name.c_str(), dtype_name(k->dtype),
                  k->summary.c_str());
  };
  body.require_variant = [&](const std::string& variant) { require_known_variant(kernels, variant, 7); };
  body.run = [&](const CliOptions& opt, int, const char* const*) { return backward::run_chapter(opt, kernels); };
  return chapter_main(argc, argv, {7, "ch07_backward", "Backward pass by recomputation"}, body);
}
