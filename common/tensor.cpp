#include "tensor.h"

#include "parallel.h"
#include "random.h"

namespace fa {

void fill_random_normal(std::vector<float>& out, uint64_t seed, uint64_t stream) {
  parallel_for(out.size(), [&out, seed, stream](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) out[i] = random_normal(seed, stream, i);
  });
}

void round_all(std::vector<float>& values, DType dtype) {
  if (dtype == DType::F32) return;
  parallel_for(values.size(), [&values, dtype](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) values[i] = round_to_dtype(values[i], dtype);
  });
}

HostInputs make_random_inputs(const AttentionShape& shape, uint64_t seed) {
  HostInputs in;
  in.q.resize(shape.q_elems());
  in.k.resize(shape.kv_elems());
  in.v.resize(shape.kv_elems());
  fill_random_normal(in.q, seed, 1);
  fill_random_normal(in.k, seed, 2);
  fill_random_normal(in.v, seed, 3);
  return in;
}

HostInputs round_inputs(const HostInputs& inputs, DType dtype) {
  HostInputs out = inputs;
  for (auto* t : {&out.q, &out.k, &out.v}) round_all(*t, dtype);
  return out;
}

DeviceBuffer upload_as(DType dtype, const std::vector<float>& values) {
  std::vector<unsigned char> raw(values.size() * dtype_size(dtype));
  encode_elements(dtype, values.data(), raw.data(), values.size());
  DeviceBuffer buffer(raw.size());
  buffer.upload(raw.data(), raw.size());
  return buffer;
}

}  // namespace fa
