// The kernel registry: every kernel (and every CPU algorithm.h) registers itself with one
// macro, and the chapter programs, the tests and the benchmark all find it here.
//
//   fa::ForwardKernel naive_kernel() {
//     fa::ForwardKernel k;
//     k.name = "ch01_naive"; k.chapter = 1; k.number = 1; k.variant = "naive";
//     k.summary = "...";
//     k.launch = launch_naive_attention;
//     return k;
//   }
//   FA_REGISTER_FORWARD_KERNEL(naive_kernel());
//
// or, for a quick experiment, in one line (the optional members left empty):
//
//   FA_REGISTER_FORWARD_KERNEL(fa::ForwardKernel{"ch03_mine", 3, 9, "mine", fa::DType::F32, "what it changes", launch_mine});
//
// `supports` (optional) returns "" when the kernel handles a shape, otherwise the reason it
// does not ("head_dim must be a multiple of 32, got 48"). `workspace_bytes` (optional) asks the
// runner for scratch device memory. `memory_note` (optional) is one line about what the kernel
// moves through device memory, printed by the chapter program. `tolerance` (optional) replaces
// the dtype's row of the tolerance table, for kernels whose arithmetic is coarser than their
// input and output dtype (chapter 06's FP8 kernel: bf16 in and out, e4m3 inside).
// `features` (chapter 09) lists the masks and score changes a kernel takes beyond causal
// (AttentionFeatures, carried beside the shape); a problem that asks for another one is turned
// away, naming it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "attention_features.h"
#include "compare.h"
#include "dtype.h"
#include "problem.h"
#include "strides.h"

namespace fa {

/// Chapter 09's features, as bits of ForwardKernel::features (and of the backward's and the CPU
/// algorithms').
enum Feature : unsigned {
  kFeatureWindow = 1u << 0,   ///< window_left / window_right
  kFeatureSoftcap = 1u << 1,  ///< softcap
  kFeatureAlibi = 1u << 2,    ///< alibi
  kFeatureBias = 1u << 3,     ///< bias (AttentionExtras::bias)
  kFeatureVarlen = 1u << 4,   ///< varlen (AttentionExtras::cu_seqlens_q/_k)
  kAllFeatures = (1u << 5) - 1,
};
/// The Feature bits of what `features` asks for.
unsigned features_of(const AttentionFeatures& features);
/// "" when a kernel taking `takes` can run `features`, otherwise which one it lacks:
/// "takes no sliding window (window 128,0); chapter 09's kernels do".
std::string feature_reason(unsigned takes, const AttentionFeatures& features);

/// What a forward launcher receives. Pointers are device memory laid out [batch, heads, seq,
/// head_dim]; q/k/v/o hold elements of the kernel's dtype; lse is float [batch, heads_q, seq_q].
struct ForwardParams {
  AttentionShape shape;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
  void* workspace = nullptr;  // workspace_bytes(shape) bytes, or null when it asks for none
  cudaStream_t stream = nullptr;
  /// Chapter 09's features and their device inputs: read only by kernels that declare them
  /// (the registry turns any other kernel away from a problem that has them).
  AttentionFeatures features;
  AttentionExtras extras;
  /// The tensors' strides when they are not packed (strides.h); null means packed. Read only by
  /// kernels that declare `strided`; the C API copies for any other.
  const ForwardStrides* strides = nullptr;
};

using ShapeCheck = std::function<std::string(const AttentionShape&)>;

struct ForwardKernel {
  std::string name;     // unique: "ch01_naive"
  int chapter = 0;      // 1..8; a learner's kernel uses the chapter it sits in
  int number = 0;       // variant number inside the chapter (1, 2, ...)
  std::string variant;  // short name for --variant: "naive", "warp", "mine"
  DType dtype = DType::F32;
  std::string summary;  // what this variant changes, one line
  std::function<void(const ForwardParams&)> launch;
  ShapeCheck supports;
  std::function<std::size_t(const AttentionShape&)> workspace_bytes;
  std::function<std::string(const AttentionShape&)> memory_note;
  std::optional<Tolerance> tolerance;
  unsigned features = 0;  // the Feature bits it takes
  bool strided = false;   // reads ForwardParams::strides (strides.h)
};

/// A chapter's algorithm.h on the CPU, in float, same loops as its kernel. Outputs O [B,H,Nq,d]
/// and LSE [B,H,Nq] like a kernel.
struct CpuAlgorithm {
  std::string name;
  int chapter = 0;
  int number = 0;
  std::string variant;
  std::string summary;
  std::function<void(const AttentionShape&, const float* q, const float* k, const float* v, float* o, float* lse)> run;
  ShapeCheck supports;
  unsigned features = 0;
  /// Instead of `run`, for an algorithm that takes features: the features and their host inputs as well.
  std::function<void(const AttentionShape&, const AttentionFeatures&, const AttentionExtras&, const float* q,
                     const float* k, const float* v, float* o, float* lse)>
      run_extras;
};

/// What a backward launcher receives (chapter 07). q/k/v/o/d_o hold elements of the kernel's
/// dtype ([batch, heads, seq, head_dim]); lse is float [batch, heads_q, seq_q], as the forward
/// wrote it; dq (like q), dk and dv (like k) are outputs of the kernel's dtype, poisoned before
/// the launch: the kernel writes every element (zeroing what it accumulates into).
struct BackwardParams {
  AttentionShape shape;
  const void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *d_o = nullptr;
  const float* lse = nullptr;
  void *dq = nullptr, *dk = nullptr, *dv = nullptr;
  void* workspace = nullptr;
  cudaStream_t stream = nullptr;
  AttentionFeatures features;  // as in ForwardParams
  AttentionExtras extras;
  const BackwardStrides* strides = nullptr;  // as in ForwardParams
};

struct BackwardKernel {
  std::string name;
  int chapter = 0;
  int number = 0;
  std::string variant;
  DType dtype = DType::F32;
  std::string summary;
  std::function<void(const BackwardParams&)> launch;
  ShapeCheck supports;
  std::function<std::size_t(const AttentionShape&)> workspace_bytes;
  /// Promises bitwise-identical gradients from run to run (no floating-point atomics); the
  /// tests hold it to that.
  bool deterministic = false;
  unsigned features = 0;
  bool strided = false;  // reads BackwardParams::strides
};

/// What a decode launcher receives (chapter 08; DecodeShape in problem.h has the layouts).
/// q and o hold elements of the kernel's dtype, k_cache and v_cache too; block_tables is int
/// [num_seqs, max_blocks_per_seq] (entries past a sequence's last block are never read),
/// context_lens int [num_seqs]; o and lse are poisoned before the launch and every element is
/// written (a row that sees no key: O = 0, LSE = -inf).
struct DecodeParams {
  DecodeShape shape;
  const void* q = nullptr;
  const void *k_cache = nullptr, *v_cache = nullptr;
  const int* block_tables = nullptr;
  const int* context_lens = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
  void* workspace = nullptr;
  cudaStream_t stream = nullptr;
};

struct DecodeKernel {
  std::string name;
  int chapter = 0;
  int number = 0;
  std::string variant;
  DType dtype = DType::F16;
  std::string summary;
  std::function<void(const DecodeParams&)> launch;
  std::function<std::string(const DecodeShape&)> supports;
  std::function<std::size_t(const DecodeShape&)> workspace_bytes;
};

/// gtest and diagnostics print a kernel as its name.
inline void PrintTo(const ForwardKernel* kernel, std::ostream* out) { *out << kernel->name; }
inline void PrintTo(const BackwardKernel* kernel, std::ostream* out) { *out << kernel->name; }
inline void PrintTo(const DecodeKernel* kernel, std::ostream* out) { *out << kernel->name; }

bool register_forward_kernel(ForwardKernel kernel);
bool register_cpu_algorithm(CpuAlgorithm algorithm);
bool register_backward_kernel(BackwardKernel kernel);
bool register_decode_kernel(DecodeKernel kernel);

/// All registered kernels, ordered by chapter, then variant number, then name.
const std::vector<ForwardKernel>& forward_kernels();
const std::vector<CpuAlgorithm>& cpu_algorithms();
std::vector<const ForwardKernel*> forward_kernels_of_chapter(int chapter);
std::vector<const CpuAlgorithm*> cpu_algorithms_of_chapter(int chapter);
const std::vector<BackwardKernel>& backward_kernels();
std::vector<const BackwardKernel*> backward_kernels_of_chapter(int chapter);
const std::vector<DecodeKernel>& decode_kernels();

/// "" when supported, otherwise why not: a feature the entry does not take, then its own
/// `supports` (empty means every valid shape).
std::string support_reason(const ForwardKernel& kernel, const AttentionShape& shape,
                           const AttentionFeatures& features = {});
std::string support_reason(const CpuAlgorithm& algorithm, const AttentionShape& shape,
                           const AttentionFeatures& features = {});
std::string support_reason(const BackwardKernel& kernel, const AttentionShape& shape,
                           const AttentionFeatures& features = {});
std::string support_reason(const DecodeKernel& kernel, const DecodeShape& shape);

}  // namespace fa

#define FA_CONCAT_INNER(a, b) a##b
#define FA_CONCAT(a, b) FA_CONCAT_INNER(a, b)
/// Registers a ForwardKernel at program start. One line per kernel.
#define FA_REGISTER_FORWARD_KERNEL(...) \
  static const bool FA_CONCAT(fa_registered_kernel_, __LINE__) = ::fa::register_forward_kernel(__VA_ARGS__)
/// Registers a BackwardKernel at program start.
#define FA_REGISTER_BACKWARD_KERNEL(...) \
  static const bool FA_CONCAT(fa_registered_backward_, __LINE__) = ::fa::register_backward_kernel(__VA_ARGS__)
/// Registers a DecodeKernel at program start.
#define FA_REGISTER_DECODE_KERNEL(...) \
  static const bool FA_CONCAT(fa_registered_decode_, __LINE__) = ::fa::register_decode_kernel(__VA_ARGS__)
/// Registers a CpuAlgorithm at program start.
#define FA_REGISTER_CPU_ALGORITHM(...) \
  static const bool FA_CONCAT(fa_registered_cpu_, __LINE__) = ::fa::register_cpu_algorithm(__VA_ARGS__)
