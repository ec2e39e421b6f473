// Timing GPU work, in one place: CUDA events around each launch, warm-up launches first, the
// median of the repeats, optionally the L2 cache flushed before each timed launch. The forward,
// backward and decode runners and fa_bench's ceilings all time through time_launches(), so
// every time the project prints means the same thing.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <vector>

#include "tensor.h"

namespace fa {

struct TimingOptions {
  /// Untimed launches first: the first launches of a kernel pay for loading its module, filling
  /// the instruction cache and raising the clocks, which is not the kernel's cost.
  int warmup = 0;
  /// Timed launches (the most, when budget_ms cuts them). 0: nothing is timed.
  int repeats = 10;
  /// When > 0: the first timed launch estimates the cost, and the repeats are cut to fit about
  /// this many milliseconds: at least min_repeats, at most max(repeats, min_repeats); a launch
  /// longer than the whole budget is timed once. Keeps sweeps over slow kernels short.
  double budget_ms = 0;
  int min_repeats = 1;
  /// Overwrite a buffer larger than the L2 cache before each timed launch (outside the timed
  /// interval), so every launch finds its inputs in device memory, not left in L2 by the
  /// previous one. Small problems otherwise fit in L2 and run faster than they would cold.
  bool flush_l2 = false;
  cudaStream_t stream = nullptr;  // the stream `launch` enqueues on; the events go there too
};

struct LaunchTimes {
  std::vector<float> ms;  // every timed launch, in order
  double median_ms = 0;   // 0 when nothing was timed
  double min_ms = 0;
};

/// Calls `launch` options.warmup times, then times each further call with CUDA events on
/// options.stream, one call at a time (each repeat waits for the previous one to finish).
LaunchTimes time_launches(const std::function<void()>& launch, const TimingOptions& options);

/// Median of a list of timings (ms); 0 for an empty list.
double median_ms(std::vector<float> times);

/// A device buffer twice the size of the L2 cache. flush() writes all of it, which leaves the
/// L2 holding nothing the next launch reads.
class L2Flush {
 public:
  L2Flush();
  /// Enqueues the write on `stream`, so it runs before whatever is enqueued next.
  void flush(cudaStream_t stream);

 private:
  DeviceBuffer buffer_;
};

}  // namespace fa
