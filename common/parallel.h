// One loop split over host threads. The harness passes over whole inputs and outputs element by
// element (random draws, rounding to the dtype, encoding for the upload, poison scans); at the
// benchmark's sizes that is tens of millions of elements per tensor, which one thread takes
// seconds over.
#pragma once

#include <cstddef>
#include <functional>

namespace fa {

/// Calls body(begin, end) on disjoint ranges that together cover [0, n) and returns when every
/// call has returned: one range per thread, up to the machine's count of them and at most 32 (one
/// range, on the calling thread, below 64k items). The calling thread runs the ranges of any
/// thread that cannot be started. A body that writes element i from element i alone gives the
/// same result as one thread would.
void parallel_for(std::size_t n, const std::function<void(std::size_t begin, std::size_t end)>& body);

}  // namespace fa
