// Printing results: the aligned table every program ends with, and the CSV that fa_bench, the
// tour and the PyTorch comparison join.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "runner.h"

namespace fa {

/// An aligned table: kernel, device, status, errors, time, TFLOP/s, GB/s, speed-up over the
/// first row of the same device that has a time.
void print_results(std::ostream& out, const std::vector<RunResult>& results);

/// Appends rows to `path`, writing the header first when the file is new or empty.
/// Throws std::runtime_error when the file cannot be written.
void append_csv(const std::string& path, const std::vector<RunResult>& results);

std::string csv_header();
std::string csv_row(const RunResult& result);

}  // namespace fa
