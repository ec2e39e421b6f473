// Turning a run-time value into a compile-time one, once, in one place. Kernels take head_dim as
// a template parameter (it sizes their register arrays and unrolls their loops); the launcher
// knows it only at run time. with_head_dim picks the instantiation:
//
//   with_head_dim<64, 128>(p.shape.head_dim, [&](auto d) { launch_dim<T, d.value>(p); });
//
// A head_dim outside the list throws std::invalid_argument naming the value and the list; the
// registry's supports() turns such shapes away before a launch, so reaching it is a bug.
#pragma once

#include <sstream>
#include <stdexcept>
#include <type_traits>

namespace fa {

/// Calls f(std::integral_constant<int, kD>{}) for the kD in kDims equal to head_dim.
template <int... kDims, class F>
void with_head_dim(int head_dim, F&& f) {
  const bool found = ((head_dim == kDims ? (f(std::integral_constant<int, kDims>{}), true) : false) || ...);
  if (!found) {
    std::ostringstream allowed;
    ((allowed << (allowed.tellp() > 0 ? ", " : "") << kDims), ...);
    throw std::invalid_argument("head_dim " + std::to_string(head_dim) +
                                " has no kernel instantiation; allowed: " + allowed.str());
  }
}

/// Calls f(std::true_type{}) or f(std::false_type{}): a run-time flag as a template argument.
template <class F>
void with_bool(bool flag, F&& f) {
  if (flag) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

}  // namespace fa
