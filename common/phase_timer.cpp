#include "phase_timer.h"

#include <cstdio>

#include "cuda_check.h"

namespace fa {

namespace {
PhaseTimer* active_timer = nullptr;
}

void mark_phase(cudaStream_t stream, const char* name) {
  if (active_timer) active_timer->mark(stream, name);
}

PhaseTimer::PhaseTimer(cudaStream_t stream) {
  CUDA_CHECK(cudaEventCreate(&start_));
  CUDA_CHECK(cudaEventRecord(start_, stream));
  active_timer = this;
}

PhaseTimer::~PhaseTimer() {
  if (active_timer == this) active_timer = nullptr;
  for (auto& m : marks_) cudaEventDestroy(m.second);
  if (start_) cudaEventDestroy(start_);
}

void PhaseTimer::mark(cudaStream_t stream, const char* name) {
  cudaEvent_t event;
  CUDA_CHECK(cudaEventCreate(&event));
  marks_.emplace_back(name, event);
  CUDA_CHECK(cudaEventRecord(event, stream));
}

std::vector<std::pair<std::string, float>> PhaseTimer::finish() {
  active_timer = nullptr;
  std::vector<std::pair<std::string, float>> out;
  cudaEvent_t previous = start_;
  for (auto& m : marks_) {
    CUDA_CHECK(cudaEventSynchronize(m.second));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, previous, m.second));
    out.emplace_back(m.first, ms);
    previous = m.second;
  }
  return out;
}

std::string describe_phases(const std::vector<std::pair<std::string, float>>& phases) {
  if (phases.size() < 2) return "";
  std::string out;
  for (const auto& p : phases) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "%s%s %.3f ms", out.empty() ? "" : ", ", p.first.c_str(), p.second);
    out += buf;
  }
  return out;
}

}  // namespace fa
