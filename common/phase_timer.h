// Where the time goes inside a forward made of several launches (scores, softmax, P*V).
//
// A launcher calls mark_phase(stream, "softmax") after each of its phases. Normally that does
// nothing; while the runner has a PhaseTimer active (for extra launches after the timed ones,
// up to 7, whose phases it reports as medians), each mark records a CUDA event, and the timer
// reports the time between marks.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <utility>
#include <vector>

namespace fa {

void mark_phase(cudaStream_t stream, const char* name);

class PhaseTimer {
 public:
  /// Records the start event on `stream` and makes this the active timer.
  explicit PhaseTimer(cudaStream_t stream);
  ~PhaseTimer();
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

  void mark(cudaStream_t stream, const char* name);
  /// Waits for the last mark; returns (phase name, milliseconds) in launch order.
  std::vector<std::pair<std::string, float>> finish();

 private:
  cudaEvent_t start_ = nullptr;
  std::vector<std::pair<std::string, cudaEvent_t>> marks_;
};

/// "scores 150.2 ms, softmax 3.1 ms, P*V 140.0 ms"; empty when fewer than two phases.
std::string describe_phases(const std::vector<std::pair<std::string, float>>& phases);

}  // namespace fa
