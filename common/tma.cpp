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

namespace {

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess || fn == nullptr)
      throw std::runtime_error("cuTensorMapEncodeTiled is not available from this CUDA driver");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

}  // namespace

CUtensorMap make_tensor_map_swizzled(const void* base, int element_bytes, int cols, int rows, int planes, int box_rows,
                                     int row_bytes) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (element_bytes != 1 && element_bytes != 2 && element_bytes != 4)
    throw std::invalid_argument("make_tensor_map_swizzled: element_bytes must be 1, 2 or 4, got " +
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
      encode(&map,
             element_bytes == 4   ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
             : element_bytes == 2 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                  : CU_TENSOR_MAP_DATA_TYPE_UINT8,
             3, const_cast<void*>(base), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
             row_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("cuTensorMapEncodeTiled failed (CUresult " + std::to_string(int(r)) + ") for a [" +
                             std::to_string(planes) + "][" + std::to_string(rows) + "][" + std::to_string(cols) +
                             "] tensor with boxes of " + std::to_string(box_rows) + " rows");
  return map;
}

CUtensorMap make_tensor_map_heads(const void* base, int cols, int rows, int heads, int batch,
                                  const TensorStrides& strides, int box_rows) {
  // A dimension of extent 1 is never stepped over, but the encoder still wants a valid stride.
  const int64_t row = strides.row, head = heads > 1 ? strides.head : int64_t(rows) * row,
                batch_stride = batch > 1 ? strides.batch : int64_t(heads) * head;
  const cuuint64_t dims[4] = {cuuint64_t(cols), cuuint64_t(rows), cuuint64_t(heads), cuuint64_t(batch)};
  const cuuint64_t byte_strides[3] = {cuuint64_t(row) * 2, cuuint64_t(head) * 2, cuuint64_t(batch_stride) * 2};
  const cuuint32_t box[4] = {64, cuuint32_t(box_rows), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  CUtensorMap map{};
  const CUresult r =
      tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(base), dims, byte_strides, box,
                           element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("cuTensorMapEncodeTiled failed (CUresult " + std::to_string(int(r)) + ") for a [" +
                             std::to_string(batch) + "][" + std::to_string(heads) + "][" + std::to_string(rows) + "][" +
                             std::to_string(cols) + "] tensor with strides (" + std::to_string(batch_stride) + ", " +
                             std::to_string(head) + ", " + std::to_string(row) + ") and boxes of " +
                             std::to_string(box_rows) + " rows");
  return map;
}

}  // namespace fa
