// See timing.h.
#include "timing.h"

#include <algorithm>
#include <optional>

#include "cuda_check.h"

namespace fa {

double median_ms(std::vector<float> times) {
  if (times.empty()) return 0;
  std::sort(times.begin(), times.end());
  size_t n = times.size();
  return n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
}

namespace {

int l2_cache_bytes() {
  int device = 0, bytes = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, device));
  return bytes;
}

/// The two events of one timed interval, destroyed however the timing ends (a launch that
/// throws included).
struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~EventPair() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
};

}  // namespace

// Twice the L2's size: the L2 does not evict in plain least-recently-used order, so writing
// exactly its size could leave some of the previous launch's lines in it.
L2Flush::L2Flush() : buffer_(2 * std::size_t(l2_cache_bytes())) {}

void L2Flush::flush(cudaStream_t stream) {
  if (buffer_.bytes() > 0) CUDA_CHECK(cudaMemsetAsync(buffer_.get(), 0, buffer_.bytes(), stream));
}

LaunchTimes time_launches(const std::function<void()>& launch, const TimingOptions& options) {
  LaunchTimes result;
  if (options.repeats <= 0) return result;
  for (int i = 0; i < options.warmup; ++i) launch();
  CUDA_CHECK_LAUNCH();
  // Errors from the warm-up surface here, not inside the first timed interval.
  CUDA_CHECK(cudaStreamSynchronize(options.stream));

  std::optional<L2Flush> l2;
  if (options.flush_l2) l2.emplace();
  EventPair events;
  auto timed_launch = [&] {
    if (l2) l2->flush(options.stream);  // before the start event: not part of the time
    CUDA_CHECK(cudaEventRecord(events.start, options.stream));
    launch();
    CUDA_CHECK(cudaEventRecord(events.stop, options.stream));
    CUDA_CHECK(cudaEventSynchronize(events.stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, events.start, events.stop));
    result.ms.push_back(ms);
  };

  int repeats = options.repeats;
  if (options.budget_ms > 0) {
    timed_launch();
    const float first = result.ms.front();
    const int most = std::max(options.min_repeats, options.repeats);
    repeats = first >= options.budget_ms
                  ? 1
                  : std::clamp(int(options.budget_ms / std::max(first, 1e-3f)), options.min_repeats, most);
  }
  while (int(result.ms.size()) < repeats) timed_launch();
  CUDA_CHECK_LAUNCH();
  result.median_ms = median_ms(result.ms);
  result.min_ms = *std::min_element(result.ms.begin(), result.ms.end());
  return result;
}

}  // namespace fa
