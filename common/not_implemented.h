// The stub a handout puts where a solution was (classroom/handout.py): it compiles, and at run time
// it throws, so the exercise's tests fail with "not implemented: <what to write>".
#pragma once

#include <stdexcept>
#include <string>

// In a __host__ __device__ function's device pass the stub traps instead (device code cannot
// throw); the host region a handout leaves in the launcher throws before any launch.
#if defined(__CUDA_ARCH__)
#define FA_NOT_IMPLEMENTED(what) __trap()
#else
#define FA_NOT_IMPLEMENTED(what) throw std::logic_error(std::string("not implemented: ") + (what))
#endif
