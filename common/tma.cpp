// Tensor maps for TMA; see tma.h.
#include "tma.h"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "cuda_check.h"

namespace fa {

std::string hopper_support(const AttentionShape& s, const std::string& who, std::initializer_list<int> head_dims) {
  const GpuInfo& gpu = detect_gpu();
  if (gpu.available && gpu.sm_major != 9)
    return who + " needs an sm_90 GPU (Hopper: TMA and wgmma), this one is sm_" +
           std::to_string(gpu.sm_major * 10 + gpu.sm_minor);
  if (std::string why = head_dim_reason(s.head_dim, head_dims); !why.empty()) return why;
  const int64_t heads = int64_t(s.batch) * s.heads_q;
  if (heads > 65535) return "batch*heads_q must be at most 65535, got " + std::to_string(heads);
  return "";
}

CUtensorMap make_tensor_map_sw128(const void* base, int element_bytes, int cols, int rows, int planes, int box_rows) {
  return make_tensor_map_swizzled(base, element_bytes, cols, rows, planes, box_rows, 128);
}

CUtensorMap make_tensor_map_swizzled(const void* base, int element_bytes, int cols, int rows, int planes, int box_rows,
                                     int row_bytes) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess || fn == nullptr)
      throw std::runtime_error("cuTensorMapEncodeTiled is not available from this CUDA driver");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (element_bytes != 1 && element_bytes != 2)
    throw std::invalid_argument("make_tensor_map_swizzled: element_bytes must be 1 or 2, got " +
                                std::to_string(element_bytes));
  if (row_bytes != 64 && row_bytes != 128)
    throw std::invalid_argument("make_tensor_map_swizzled: row_bytes must be 64 or 128, got " +
                                std::to_string(row_bytes));
  const cuuint64_t dims[3] = {cuuint64_t(cols), cuuint64_t(rows), cuuint64_t(planes)};
  const cuuint64_t strides[2] = {cuuint64_t(cols) * element_bytes,
                                 cuuint64_t(cols) * rows * element_bytes};  // bytes, dims 1 and 2
  const cuuint32_t box[3] = {cuuint32_t(row_bytes / element_bytes), cuuint32_t(box_rows), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  CUtensorMap map{};
  const CUresult r =
      encode(&map, element_bytes == 2 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_UINT8, 3,
             const_cast<void*>(base), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
             row_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("cuTensorMapEncodeTiled failed (CUresult " + std::to_string(int(r)) + ") for a [" +
                             std::to_string(planes) + "][" + std::to_string(rows) + "][" + std::to_string(cols) +
                             "] tensor with boxes of " + std::to_string(box_rows) + " rows");
  return map;
}

}  // namespace fa
