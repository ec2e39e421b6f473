// One loop split over host threads. The harness passes over whole inputs and outputs element by
// element (random draws, rounding to the dtype, encoding for the upload, poison scans); at the
// benchmark's sizes that is tens of millions of elements per tensor, which one thread takes
// seconds over.
#pragma once

#include <cstddef>
#include <functional>

namespace fa {

/// Calls body(begin, end) on disjoint ranges that together cover [0, n), each on its own thread
/// (up to the machine's count, at most 32; one range, on the calling thread, below 64k items),
/// and returns when every call has returned. The ranges are contiguous and in order, so a body
/// that writes element i from element i alone gives the same result as one thread would.
void parallel_for(std::size_t n, const std::function<void(std::size_t begin, std::size_t end)>& body);

}  // namespace fa
