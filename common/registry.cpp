#include "registry.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <tuple>

namespace fa {

namespace {

std::vector<ForwardKernel>& kernel_list() {
  static std::vector<ForwardKernel> list;
  return list;
}

std::vector<BackwardKernel>& backward_list() {
  static std::vector<BackwardKernel> list;
  return list;
}

std::vector<DecodeKernel>& decode_list() {
  static std::vector<DecodeKernel> list;
  return list;
}

std::vector<CpuAlgorithm>& cpu_list() {
  static std::vector<CpuAlgorithm> list;
  return list;
}

// Registration runs before main(), where an exception would only call std::terminate; a bad
// registration is a programming error, so say what it is in one line and stop.
[[noreturn]] void registration_error(const std::string& what) {
  std::fprintf(stderr, "kernel registry: %s\n", what.c_str());
  std::exit(2);
}

template <class Entry>
bool insert_sorted(std::vector<Entry>& list, Entry entry, bool has_function) {
  if (entry.name.empty() || !has_function) registration_error("every entry needs a name and a function to run");
  for (const auto& existing : list) {
    if (existing.name == entry.name) registration_error("duplicate name '" + entry.name + "'");
  }
  list.push_back(std::move(entry));
  std::stable_sort(list.begin(), list.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.chapter, a.number, a.name) < std::tie(b.chapter, b.number, b.name);
  });
  return true;
}

template <class Entry>
std::vector<const Entry*> of_chapter(const std::vector<Entry>& list, int chapter) {
  std::vector<const Entry*> out;
  for (const auto& entry : list) {
    if (entry.chapter == chapter) out.push_back(&entry);
  }
  return out;
}

}  // namespace

bool register_forward_kernel(ForwardKernel kernel) {
  bool runnable = bool(kernel.launch);
  return insert_sorted(kernel_list(), std::move(kernel), runnable);
}

bool register_cpu_algorithm(CpuAlgorithm algorithm) {
  bool runnable = bool(algorithm.run) || bool(algorithm.run_extras);
  return insert_sorted(cpu_list(), std::move(algorithm), runnable);
}

bool register_backward_kernel(BackwardKernel kernel) {
  bool runnable = bool(kernel.launch);
  return insert_sorted(backward_list(), std::move(kernel), runnable);
}

bool register_decode_kernel(DecodeKernel kernel) {
  bool runnable = bool(kernel.launch);
  return insert_sorted(decode_list(), std::move(kernel), runnable);
}

const std::vector<DecodeKernel>& decode_kernels() { return decode_list(); }
const std::vector<ForwardKernel>& forward_kernels() { return kernel_list(); }
const std::vector<BackwardKernel>& backward_kernels() { return backward_list(); }
std::vector<const BackwardKernel*> backward_kernels_of_chapter(int chapter) {
  return of_chapter(backward_list(), chapter);
}
const std::vector<CpuAlgorithm>& cpu_algorithms() { return cpu_list(); }

std::vector<const ForwardKernel*> forward_kernels_of_chapter(int chapter) { return of_chapter(kernel_list(), chapter); }
std::vector<const CpuAlgorithm*> cpu_algorithms_of_chapter(int chapter) { return of_chapter(cpu_list(), chapter); }

unsigned features_of(const AttentionFeatures& f) {
  return (f.windowed() ? kFeatureWindow : 0u) | (f.softcap > 0.0 ? kFeatureSoftcap : 0u) |
         (f.alibi ? kFeatureAlibi : 0u) | (f.bias ? kFeatureBias : 0u) | (f.varlen() ? kFeatureVarlen : 0u);
}

std::string feature_reason(unsigned takes, const AttentionFeatures& f) {
  const unsigned missing = features_of(f) & ~takes;
  if (missing & kFeatureWindow)
    return "takes no sliding window (window " + std::to_string(f.window_left) + "," + std::to_string(f.window_right) +
           "); chapter 09's kernels do";
  if (missing & kFeatureSoftcap) return "takes no softcap; chapter 09's kernels do";
  if (missing & kFeatureAlibi) return "takes no ALiBi; chapter 09's kernels do";
  if (missing & kFeatureBias) return "takes no bias tensor; chapter 09's kernels do";
  if (missing & kFeatureVarlen) return "takes no packed variable-length batch; chapter 09's kernels do";
  return "";
}

namespace {

template <class Entry>
std::string entry_reason(const Entry& entry, const AttentionShape& shape, const AttentionFeatures& features) {
  std::string why = feature_reason(entry.features, features);
  if (why.empty() && entry.supports) why = entry.supports(shape);
  return why;
}

}  // namespace

std::string support_reason(const ForwardKernel& kernel, const AttentionShape& shape,
                           const AttentionFeatures& features) {
  return entry_reason(kernel, shape, features);
}

std::string support_reason(const BackwardKernel& kernel, const AttentionShape& shape,
                           const AttentionFeatures& features) {
  return entry_reason(kernel, shape, features);
}

std::string support_reason(const DecodeKernel& kernel, const DecodeShape& shape) {
  return kernel.supports ? kernel.supports(shape) : std::string();
}

std::string support_reason(const CpuAlgorithm& algorithm, const AttentionShape& shape,
                           const AttentionFeatures& features) {
  return entry_reason(algorithm, shape, features);
}

}  // namespace fa
