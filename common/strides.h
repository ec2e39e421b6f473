// Tensors that are not packed [batch, heads, seq, head_dim]: flash-attn's [batch, seq, heads,
// head_dim] layout, or the Q, K and V views of one [batch, seq, 3, heads, head_dim] projection.
// Each tensor keeps head_dim contiguous and says where its (batch, head, row) starts by three
// strides. Kernels that take them say so (ForwardKernel::strided); every other kernel reads the
// packed layout of problem.h, and a caller with other strides copies into it first.
#pragma once

#include <cstdint>
#include <string>

#include "problem.h"

namespace fa {

/// Element strides of a [batch, heads, rows, head_dim] tensor whose head_dim is contiguous.
struct TensorStrides {
  int64_t batch = 0;
  int64_t head = 0;
  int64_t row = 0;

  /// The packed layout's strides.
  static FA_HD TensorStrides packed(int heads, int rows, int head_dim) {
    return {int64_t(heads) * rows * head_dim, int64_t(rows) * head_dim, head_dim};
  }
  /// Where row `row` of head `plane` (= batch * heads + head) starts.
  FA_HD int64_t at(int plane, int heads, int row_index) const {
    return int64_t(plane / heads) * batch + int64_t(plane % heads) * head + int64_t(row_index) * row;
  }
};

/// A kernel's output (or input) tensor as a pointer and its strides, passed by value.
template <class T>
struct StridedRows {
  T* base = nullptr;
  TensorStrides strides;
  int heads = 1;
  /// A packed tensor's rows.
  static FA_HD StridedRows packed(T* base, int heads, int rows, int head_dim) {
    return {base, TensorStrides::packed(heads, rows, head_dim), heads};
  }
  /// Row 0 of head `plane`; rows follow strides.row elements apart.
  FA_HD T* head_start(int plane) const { return base + strides.at(plane, heads, 0); }
};

/// How far apart a tensor's rows are, as a kernel reads them: in a packed tensor kD, a
/// compile-time constant (so every address stays a base plus constants, as in the kernels that
/// read packed tensors only); in a strided one its row stride.
template <int kD>
struct PackedStride {
  FA_HD constexpr operator int() const { return kD; }
};
template <bool kStrided, int kD>
FA_HD auto row_stride(const TensorStrides& t) {
  if constexpr (kStrided) return t.row;
  else return PackedStride<kD>{};
}

/// The strides of a forward's tensors.
struct ForwardStrides {
  TensorStrides q, k, v, o;
  static ForwardStrides packed(const AttentionShape& s);
};

/// The strides of a backward's tensors (its q, k, v, o are the forward's, d_o and dq like q,
/// dk and dv like k).
struct BackwardStrides {
  TensorStrides q, k, v, o, d_o, dq, dk, dv;
  static BackwardStrides packed(const AttentionShape& s);
};

/// "" when a strided kernel's tensor maps and stores can take these strides (every stride a
/// multiple of 8 elements, which TMA needs: 16 bytes of bf16), else which stride breaks it:
/// "k's row stride must be a non-negative multiple of 8 elements, got 100".
std::string strides_reason(const ForwardStrides& s);
std::string strides_reason(const BackwardStrides& s);

}  // namespace fa
