// The one check-and-time path. Chapter programs, fa_bench and the GPU tests all run a kernel
// through run_forward(): fresh random inputs, outputs poisoned before the launch, the launch
// checked, the result compared with the fp64 oracle, then timed by time_launches() (timing.h:
// CUDA events, warm-up first, median of the repeats).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "attention_features.h"
#include "compare.h"
#include "feature_inputs.h"
#include "problem.h"
#include "reference.h"
#include "registry.h"
#include "tensor.h"
#include "timing.h"

namespace fa {

struct DeviceInputs {
  DeviceBuffer q, k, v;
};

/// One attention problem: its random inputs (once per dtype, rounded to that dtype), their
/// device copies and the oracle's answer, each made on first use and kept.
class Problem {
 public:
  /// full_check: compare every row; otherwise choose_check_plan() decides (sampled when big).
  /// With chapter 09's features: a packed batch takes its sequence lengths from `packing`, or
  /// random_packing() without one.
  Problem(const AttentionShape& shape, uint64_t seed, bool full_check = false, const AttentionFeatures& features = {},
          const Packing* packing = nullptr);

  const AttentionShape& shape() const { return shape_; }
  const AttentionFeatures& features() const { return features_; }
  uint64_t seed() const { return seed_; }
  const CheckPlan& plan() const { return plan_; }

  const HostInputs& host(DType dtype);
  const DeviceInputs& device(DType dtype);
  const ForwardReference& reference(DType dtype);
  /// The bias and the sequence boundaries on the host (null pointers when the shape has none) ...
  AttentionExtras host_extras() const;
  /// ... and on the device, uploaded on first use.
  AttentionExtras device_extras();
  /// Device bytes of the extras (the bias, the sequence boundaries), made on first use too.
  std::size_t device_extras_bytes();
  const Packing& packing() const { return packing_; }
  /// The forward FLOPs of this problem: the shape's, with the window's and a packed batch's real lengths.
  double forward_flops() const;

 private:
  AttentionShape shape_;
  AttentionFeatures features_;
  uint64_t seed_;
  CheckPlan plan_;
  HostInputs raw_;
  std::vector<float> bias_;
  Packing packing_;
  std::optional<DeviceExtras> device_extras_;  // made on first use
  std::map<DType, HostInputs> rounded_;
  std::map<DType, DeviceInputs> device_;
  std::map<DType, ForwardReference> reference_;
};

struct RunOptions {
  bool check = true;
  int warmup = 2;
  int iters = 10;  // timed repeats; 0 = run once for the check, no timing
  /// When > 0: after the warm-up, one timed launch estimates the cost, and the repeats are cut
  /// to fit this many milliseconds (at least 3, at most `iters`; a launch longer than the whole
  /// budget is timed just once). Keeps slow kernels' sweeps short.
  double budget_ms = 0;
  bool flush_l2 = false;  // evict the L2 before each timed launch (TimingOptions::flush_l2)
};

struct RunResult {
  std::string name, variant, device;  // device: "gpu" or "cpu"
  int chapter = 0, number = 0;
  DType dtype = DType::F32;
  AttentionShape shape;
  AttentionFeatures features;
  double flops = 0;  // the forward FLOPs of the point (Problem::forward_flops)
  bool ran = false;
  std::string skipped;  // why it did not run (unsupported shape, no GPU, not enough memory)
  std::string error;    // what failed while running (a CUDA error, an exception)
  bool checked = false;
  CompareReport report;
  std::string plan;  // which rows were checked
  int iters = 0;
  double ms = 0;  // median time per launch
  double ms_min = 0;
  double tflops = 0;
  double gbps = 0;        // forward_min_bytes / time: the rate the kernel *had* to move data at
  std::string note;       // the kernel's memory_note
  std::string phases;     // time per phase for multi-launch kernels ("scores 1.2 ms, softmax ...")
  double device_mib = 0;  // peak device memory of the launch: Q, K, V, extras, O, LSE, workspace (MiB)

  bool passed() const { return ran && error.empty() && (!checked || report.passed()); }
  /// "ok", "FAIL", "skipped", "error".
  std::string status() const;
};

/// Everything one launch needs: poisoned output buffers, scratch space, and the parameters
/// pointing at them and at device inputs in the kernel's dtype.
struct ForwardLaunch {
  DeviceBuffer o, lse, workspace;
  ForwardParams params;
};
/// For the problem's device inputs in the kernel's dtype.
ForwardLaunch prepare_forward(const ForwardKernel& kernel, Problem& problem);
/// For inputs the caller holds on the device (q, k, v in the kernel's dtype).
ForwardLaunch prepare_forward(const ForwardKernel& kernel, const AttentionShape& shape, const void* q, const void* k,
                              const void* v);

RunResult run_forward(const ForwardKernel& kernel, Problem& problem, const RunOptions& options);
/// The result of a forward run before anything ran: the kernel's name, chapter, variant and
/// dtype, and the shape. A caller that decides not to run a point (fa_bench's points too slow
/// for the sweep) sets `skipped` on it, and it prints and writes to CSV like any other.
RunResult forward_result(const ForwardKernel& kernel, const AttentionShape& shape,
                         const AttentionFeatures& features = {});

/// One launch of `kernel` on inputs the caller brings (float, uploaded in the kernel's dtype),
/// for callers outside the Problem flow (chapter 07's forward, the FP8 outlier test): O decoded
/// to float into `o`, LSE as written into `lse`.
void launch_forward_on(const ForwardKernel& kernel, const AttentionShape& shape, const std::vector<float>& q,
                       const std::vector<float>& k, const std::vector<float>& v, std::vector<float>& o,
                       std::vector<float>& lse);
RunResult run_cpu_algorithm(const CpuAlgorithm& algorithm, Problem& problem, const RunOptions& options);

}  // namespace fa
